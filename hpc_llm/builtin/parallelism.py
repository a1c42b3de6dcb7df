"""Built-in parallelism strategies: ddp, fsdp, hsdp -> Composer's FSDP config.

LLM Foundry 0.22 reads ``fsdp_config`` from the train config and hands it to
Composer as ``parallelism_config={'fsdp': ...}``. Composer 0.32 picks FSDP2
(``fully_shard``) when ``FSDP_VERSION=2`` is in the environment; FSDP1 calls
``torch.cuda.current_device()`` and so needs a GPU. We default to FSDP2 on
CPU and FSDP1 on GPU.
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, OmegaConf

from hpc_llm import hookimpl
from hpc_llm.config.plan import JobPlan
from hpc_llm.errors import ConfigError, warn_once
from hpc_llm.plugins.base import ParallelismStrategy

# FSDP1 defaults from LLM Foundry's pretraining yamls; FSDP2 takes a subset. Checkpoints
# are sharded: every rank writes its own shard (Composer's FSDP1 default, "full", gathers
# the whole state on rank 0 first, which a 70B model does not fit). FSDP2's default is
# already "sharded".
FSDP1_DEFAULTS: dict[str, Any] = {
    "state_dict_type": "sharded",
    "sharding_strategy": "FULL_SHARD",
    "mixed_precision": "PURE",
    "activation_checkpointing": False,
    "activation_checkpointing_reentrant": False,
    "activation_cpu_offload": False,
    "limit_all_gathers": True,
}
FSDP2_KEYS = frozenset(
    {
        "reshard_after_forward",
        "activation_checkpointing",
        "activation_cpu_offload",
        "state_dict_type",
        "load_monolith_rank0_only",
        "mixed_precision",
        "verbose",
    }
)
FSDP1_KEYS = frozenset(
    {
        "sharding_strategy",
        "mixed_precision",
        "activation_checkpointing",
        "activation_checkpointing_reentrant",
        "activation_cpu_offload",
        "limit_all_gathers",
        "state_dict_type",
        "use_orig_params",
        "sync_module_states",
        "forward_prefetch",
        "backward_prefetch",
        "cpu_offload",
        "auto_wrap",
        "load_monolith_rank0_only",
        "verbose",
        "data_parallel_shard_degree",
        "data_parallel_replicate_degree",
        "load_planner",
        "save_planner",
        "keep_low_precision_grads",
        "ignored_modules",
        "sharded_ckpt_prefix_dir",
        "te_checkpoint_wrapper",
        "te_shard_fp8_weight",
    }
)


def fsdp_version(section: DictConfig, plan: JobPlan) -> int:
    version = section.fsdp_version
    if version is None:
        return 2 if plan.device == "cpu" else 1
    if version not in (1, 2):
        raise ConfigError(f"parallelism.fsdp_version={version!r}; allowed: 1, 2")
    if version == 1 and plan.device == "cpu":
        raise ConfigError(
            "parallelism.fsdp_version=1 needs GPUs (Composer's FSDP1 calls torch.cuda); "
            "use parallelism.fsdp_version=2 on CPU"
        )
    return version


class DDP(ParallelismStrategy):
    # any trainer: every rank a whole model: a plain meaning any trainer can take
    trainers = None
    name = "ddp"
    description = "data parallel (Composer DDP): every rank holds the full model"

    def train_config(self, section: DictConfig, plan: JobPlan) -> dict[str, Any]:
        return {}


class FSDP(ParallelismStrategy):
    trainers = ("llmfoundry", "torchtitan")
    name = "fsdp"
    description = "fully sharded data parallel over all ranks (FSDP2 on CPU, FSDP1 on GPU)"

    def validate(self, section: DictConfig, plan: JobPlan) -> None:
        version = fsdp_version(section, plan)
        allowed_keys = FSDP2_KEYS if version == 2 else FSDP1_KEYS
        unknown = [key for key in section.options or {} if key not in allowed_keys]
        if unknown and section.lenient:
            warn_once(
                f"fsdp_config: FSDP{version} is used ({'on CPU Composer needs FSDP2' if version == 2 else 'GPU'}), "
                f"which has no {', '.join(unknown)}: left out (parallelism.fsdp_version picks the version)"
            )
        elif unknown:
            raise ConfigError(
                f"parallelism.options.{unknown[0]}: not an FSDP{version} option; "
                f"allowed: {', '.join(sorted(allowed_keys))}"
            )

    def _fsdp_config(self, section: DictConfig, plan: JobPlan) -> dict[str, Any]:
        options = OmegaConf.to_container(section.options, resolve=True) if section.options else {}
        allowed_keys = FSDP2_KEYS if fsdp_version(section, plan) == 2 else FSDP1_KEYS
        options = {k: v for k, v in options.items() if k in allowed_keys}  # type: ignore[union-attr]
        if fsdp_version(section, plan) == 2:
            base: dict[str, Any] = {"mixed_precision": "DEFAULT"}
        else:
            base = dict(FSDP1_DEFAULTS)
        base.update(options)  # type: ignore[arg-type]
        return base

    def train_config(self, section: DictConfig, plan: JobPlan) -> dict[str, Any]:
        return {"fsdp_config": self._fsdp_config(section, plan)}

    def env(self, section: DictConfig, plan: JobPlan) -> dict[str, str]:
        return {"FSDP_VERSION": str(fsdp_version(section, plan))}


def hsdp_degrees(section: DictConfig, plan: JobPlan) -> tuple[int, int]:
    """(shards, replicas) with shards x replicas == world size, or a ConfigError."""
    world = plan.world_size
    shards, replicas = section.shards, section.replicas
    for key, value in (("shards", shards), ("replicas", replicas)):
        if value is not None and (not isinstance(value, int) or value < 1):
            raise ConfigError(f"parallelism.{key}={value!r}: must be an integer >= 1")
    if shards is None and replicas is None:
        if plan.nodes > 1:
            shards, replicas = plan.tasks_per_node, plan.nodes
        else:
            replicas = 2
    if shards is None:
        if world % replicas:
            raise ConfigError(
                f"parallelism.replicas={replicas} does not divide the world size {world} "
                f"({plan.nodes} node(s) x {plan.tasks_per_node} tasks); allowed: "
                + ", ".join(str(d) for d in _divisors(world))
            )
        shards = world // replicas
    if replicas is None:
        if world % shards:
            raise ConfigError(
                f"parallelism.shards={shards} does not divide the world size {world}; "
                f"allowed: {', '.join(str(d) for d in _divisors(world))}"
            )
        replicas = world // shards
    if shards * replicas != world:
        raise ConfigError(
            f"parallelism.shards={shards} x parallelism.replicas={replicas} = {shards * replicas} "
            f"is not the world size {world} ({plan.nodes} node(s) x {plan.tasks_per_node} tasks)"
        )
    if shards < 2 or replicas < 2:
        raise ConfigError(
            f"hsdp needs at least 2 shards and 2 replicas (got shards={shards}, replicas={replicas} "
            f"for world size {world}); use parallelism=fsdp or parallelism=ddp instead"
        )
    return shards, replicas


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


class HSDP(FSDP):
    trainers = ("llmfoundry", "torchtitan")
    name = "hsdp"
    description = "hybrid sharding: shard within a group, replicate across groups"

    def validate(self, section: DictConfig, plan: JobPlan) -> None:
        super().validate(section, plan)
        hsdp_degrees(section, plan)

    def train_config(self, section: DictConfig, plan: JobPlan) -> dict[str, Any]:
        shards, replicas = hsdp_degrees(section, plan)
        cfg = self._fsdp_config(section, plan)
        cfg["data_parallel_shard_degree"] = shards
        cfg["data_parallel_replicate_degree"] = replicas
        if fsdp_version(section, plan) == 1:
            cfg["sharding_strategy"] = "HYBRID_SHARD"
        return {"fsdp_config": cfg}


@hookimpl
def hpc_llm_register_parallelism(register) -> None:
    register(DDP())
    register(FSDP())
    register(HSDP())
