"""Built-in health checks (``preflight.checks``): all-reduce bandwidth, GPUs, container.

The measurements live in :mod:`hpc_llm.builtin.health_measure` (torch, in-job only); the
components here validate their settings on the login node.
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig

from hpc_llm import hookimpl
from hpc_llm.config.plan import JobPlan
from hpc_llm.errors import ConfigError
from hpc_llm.plugins.base import HealthCheck


class AllReduce(HealthCheck):
    name = "allreduce"
    description = "all-reduce bus bandwidth over every rank, 8 B .. preflight.max_bytes (nccl-tests table)"

    def validate(self, section: DictConfig, plan: JobPlan) -> None:
        from hpc_llm.results import preflight

        preflight.message_sizes(preflight.max_bytes(section.max_bytes, plan.device))
        for key in ("iters", "warmup"):
            if int(section[key]) < (1 if key == "iters" else 0):
                raise ConfigError(f"preflight.{key}={section[key]}: must be >= {1 if key == 'iters' else 0}")
        if section.min_busbw_gbps is not None and section.min_busbw_gbps < 0:
            raise ConfigError(f"preflight.min_busbw_gbps={section.min_busbw_gbps}: must be >= 0")

    def run(self, section: DictConfig, ctx: Any) -> dict[str, Any]:
        from hpc_llm.builtin import health_measure as checks

        return checks.allreduce(section, ctx)


class Gpu(HealthCheck):
    name = "gpu"
    description = "GPUs per node vs requested, bf16 matmul TFLOP/s per GPU, nvidia-smi ECC"

    def validate(self, section: DictConfig, plan: JobPlan) -> None:
        if section.min_tflops is not None and plan.device != "gpu":
            raise ConfigError("preflight.min_tflops is set but cluster.device=cpu; allowed on GPU profiles only")

    def run(self, section: DictConfig, ctx: Any) -> dict[str, Any]:
        from hpc_llm.builtin import health_measure as checks

        return checks.gpu(section, ctx)


class Container(HealthCheck):
    name = "container"
    description = "every rank runs inside container.image (with container=apptainer)"

    def run(self, section: DictConfig, ctx: Any) -> dict[str, Any]:
        from hpc_llm.builtin import health_measure as checks

        return checks.container(section, ctx)


@hookimpl
def hpc_llm_register_health_checks(register) -> None:
    register(AllReduce())
    register(Gpu())
    register(Container())
