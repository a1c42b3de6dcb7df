"""Composed config -> JobPlan: the numbers every later stage agrees on.

Pure and cheap (login node): no plugins, no training stack. Raises
:class:`~hpc_llm.errors.ConfigError` on impossible resources.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any

from omegaconf import DictConfig

from hpc_llm.errors import ConfigError

DEVICES = ("cpu", "gpu")


@dataclass(frozen=True)
class JobPlan:
    experiment: str
    nodes: int
    tasks_per_node: int
    gpus_per_node: int
    cpus_per_task: int
    world_size: int
    device: str
    parallelism: str
    time_limit_s: int
    run_dir: str | None = None
    #: the fewest nodes the run may go on with (``resources.min_nodes``; ``nodes`` when unset)
    min_nodes: int = 0
    #: the nodes the run was submitted with; ``nodes`` is what this allocation trains on (fewer
    #: after a shrink: :func:`make_plan`'s ``nodes_now``). 0: ``nodes``
    submitted_nodes: int = 0

    @property
    def full_nodes(self) -> int:
        """The nodes the run was submitted with (``resources.nodes``)."""
        return self.submitted_nodes or self.nodes

    @property
    def least_nodes(self) -> int:
        """The fewest nodes the run trains on (``resources.min_nodes``, else ``resources.nodes``)."""
        return self.min_nodes or self.full_nodes

    def at_nodes(self, nodes: int) -> JobPlan:
        """This plan on ``nodes`` of its nodes (a run shrunk to them, or every size checked)."""
        return replace(self, nodes=nodes, world_size=nodes * self.tasks_per_node, submitted_nodes=self.full_nodes)


_TIME_FORMATS = (
    # Slurm --time formats: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S
    (re.compile(r"^(\d+)$"), ("m",)),
    (re.compile(r"^(\d+):(\d{1,2})$"), ("m", "s")),
    (re.compile(r"^(\d+):(\d{1,2}):(\d{1,2})$"), ("h", "m", "s")),
    (re.compile(r"^(\d+)-(\d+)$"), ("d", "h")),
    (re.compile(r"^(\d+)-(\d+):(\d{1,2})$"), ("d", "h", "m")),
    (re.compile(r"^(\d+)-(\d+):(\d{1,2}):(\d{1,2})$"), ("d", "h", "m", "s")),
)
_UNIT_S = {"d": 86400, "h": 3600, "m": 60, "s": 1}


def parse_time_limit(value: Any) -> int:
    """Seconds in a Slurm time limit ("90", "1:30:00", "2-00:00:00")."""
    text = str(value).strip()
    for pattern, units in _TIME_FORMATS:
        m = pattern.match(text)
        if m:
            seconds = sum(int(v) * _UNIT_S[u] for v, u in zip(m.groups(), units, strict=True))
            if seconds <= 0:
                break
            return seconds
    raise ConfigError(
        f"resources.time={text!r} is not a Slurm time limit; allowed: minutes, "
        "MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS (greater than zero)"
    )


def _positive(section: str, key: str, value: Any, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{section}.{key}={value!r}: must be an integer >= {minimum}")
    return value


#: a GRES type name as slurm.conf takes it (Gres=gpu:h100:8): no ':' or ',' of the request syntax
_GPU_TYPE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$")


def check_gpu_type(gpu_type: Any, gpus_per_node: int) -> str | None:
    """``resources.gpu_type``, checked: a GRES type name, and only with GPUs asked for."""
    if gpu_type is None:
        return None
    text = str(gpu_type)
    if not _GPU_TYPE.match(text):
        raise ConfigError(
            f"resources.gpu_type={gpu_type!r} is not a GPU type; allowed: a GRES type of the cluster "
            "(as in slurm.conf's Gres=gpu:TYPE:N, e.g. h100, a100), or null for any GPU"
        )
    if gpus_per_node < 1:
        raise ConfigError(
            f"resources.gpu_type={text} asks for no GPUs (resources.gpus_per_node={gpus_per_node}); "
            "allowed: resources.gpus_per_node >= 1, or resources.gpu_type=null"
        )
    return text


def min_nodes(resources: Any, nodes: int) -> int:
    """``resources.min_nodes`` checked against ``resources.nodes`` (None: ``nodes``)."""
    least = resources.get("min_nodes")
    if least is None:
        return nodes
    if isinstance(least, bool) or not isinstance(least, int) or not 1 <= least <= nodes:
        raise ConfigError(
            f"resources.min_nodes={least!r}: must be an integer from 1 to resources.nodes={nodes} "
            "(the fewest nodes the run goes on with after losing some), or null"
        )
    return least


def make_plan(cfg: DictConfig, run_dir: str | None = None, nodes_now: int | None = None) -> JobPlan:
    """The plan of ``cfg``; ``nodes_now``: the nodes this allocation trains on, when the run goes
    on with fewer than it was submitted with (``resources.min_nodes``)."""
    r = cfg.resources
    nodes = _positive("resources", "nodes", r.nodes)
    tasks = _positive("resources", "tasks_per_node", r.tasks_per_node)
    gpus = _positive("resources", "gpus_per_node", r.gpus_per_node, minimum=0)
    cpus = _positive("resources", "cpus_per_task", r.cpus_per_task)
    check_gpu_type(r.get("gpu_type"), gpus)
    device = cfg.cluster.device
    if device not in DEVICES:
        raise ConfigError(f"cluster.device={device!r}; allowed: {', '.join(DEVICES)}")
    if device == "gpu":
        if gpus < 1:
            raise ConfigError(
                "cluster.device=gpu needs resources.gpus_per_node >= 1 "
                f"(got {gpus}); use cluster.device=cpu for CPU-only nodes"
            )
        if tasks != gpus:
            raise ConfigError(
                f"resources.tasks_per_node={tasks} must equal resources.gpus_per_node={gpus} "
                "on GPU clusters (one rank per GPU)"
            )
    least = min_nodes(r, nodes)
    plan = JobPlan(
        experiment=str(cfg.experiment),
        nodes=nodes,
        tasks_per_node=tasks,
        gpus_per_node=gpus,
        cpus_per_task=cpus,
        world_size=nodes * tasks,
        device=device,
        parallelism=str(cfg.parallelism.name),
        time_limit_s=parse_time_limit(r.time),
        run_dir=run_dir,
        min_nodes=least,
        submitted_nodes=nodes,
    )
    if nodes_now is None or nodes_now == nodes:
        return plan
    if not least <= nodes_now <= nodes:
        raise ConfigError(
            f"this allocation trains on {nodes_now} node(s), but the run allows {least} to {nodes} "
            f"(resources.min_nodes={least}, resources.nodes={nodes})"
        )
    return plan.at_nodes(nodes_now)
