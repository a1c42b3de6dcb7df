"""The torchtitan config a run gets (``trainer=torchtitan``), as torchtitan's own dotted keys.

Pure and login-light: ``hpc-llm config`` prints it, the check before the queue sends its keys
to torchtitan's environment (:mod:`hpc_llm.job.rank.titan.check`), and every rank applies it to
torchtitan's ``Trainer.Config`` (:mod:`hpc_llm.job.rank.titan.run`). hpc_llm's sections say what
they say for LLM Foundry: ``train`` (batch, length, steps, optimizer, schedule), ``checkpoint``
(where, how often, how many), ``parallelism`` (DDP, FSDP, HSDP as torchtitan's replicate and
shard degrees), ``fault.collective_timeout_s``; ``trainer.options.overrides`` comes last.
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, OmegaConf

from hpc_llm.config.plan import JobPlan
from hpc_llm.config.validate import collective_timeout_s
from hpc_llm.errors import ConfigError

#: the one key that is not a dotted path: the arguments of torchtitan's ``default_adamw``
ADAMW = "optimizer(adamw)"
#: LLM Foundry's scheduler names -> torchtitan's decay_type
DECAY = {"cosine_with_warmup": "cosine", "linear_decay_with_warmup": "linear", "constant_with_warmup": "none"}


def batches(value: Any, key: str, steps: int | None = None) -> int:
    """``<N>ba`` as N (``1ep`` as every step: torchtitan counts steps)."""
    text = str(value)
    if text.endswith("ba") and text[:-2].isdigit():
        return int(text[:-2])
    if text == "1ep" and steps is not None:
        return steps
    raise ConfigError(f"{key}={value}: trainer=torchtitan counts steps; allowed: <N>ba, e.g. 10ba")


def titan_config(cfg: DictConfig, plan: JobPlan, checkpoint_folder: str) -> dict[str, Any]:
    """torchtitan's dotted keys and their values for this run (the model is built apart:
    :func:`model_section`)."""
    train = cfg.train
    steps = batches(train.max_duration, "train.max_duration")
    opt = train.get("optimizer") or {}
    sched = train.get("scheduler") or {}
    clip = ((train.get("algorithms") or {}).get("gradient_clipping") or {}).get("clipping_threshold")
    micro = train.get("device_train_microbatch_size", "auto")
    per_rank = int(train.global_train_batch_size) // plan.world_size
    out: dict[str, Any] = {
        "training.global_batch_size": int(train.global_train_batch_size),
        "training.local_batch_size": per_rank if micro == "auto" else min(int(micro), per_rank),
        "training.seq_len": int(train.max_seq_len),
        "training.steps": steps,
        "training.max_norm": float(clip) if clip is not None else 1.0,
        "training.mixed_precision_param": "float32" if str(train.get("precision", "fp32")) == "fp32" else "bfloat16",
        "debug.seed": int(train.get("seed", 17)),
        # torchtitan's AdamW param group (default_adamw), from LLM Foundry's optimizer section
        ADAMW: {
            "lr": float(opt.get("lr", 3e-4)),
            "betas": [float(b) for b in opt.get("betas", (0.9, 0.95))],
            "eps": float(opt.get("eps", 1e-8)),
            "weight_decay": float(opt.get("weight_decay", 0.0)),
        },
        "lr_scheduler.warmup_steps": batches(sched.get("t_warmup", "0ba"), "train.scheduler.t_warmup"),
        "lr_scheduler.decay_type": DECAY.get(str(sched.get("name", "")), "linear"),
        "lr_scheduler.min_lr_factor": float(sched.get("alpha_f", 0.0)),
        "checkpoint.enable": True,
        "checkpoint.folder": checkpoint_folder,
        "checkpoint.interval": batches(cfg.checkpoint.interval, "checkpoint.interval", steps),
        "checkpoint.keep_latest_k": int(cfg.checkpoint.keep) if int(cfg.checkpoint.keep) > 0 else 0,
        "checkpoint.last_save_model_only": False,
        "checkpoint.async_mode": "async" if trainer_options(cfg).get("async_checkpoint", True) else "disabled",
        "metrics.log_freq": 1,
        "comm.init_timeout_seconds": int(collective_timeout_s(cfg, plan)),
        "comm.train_timeout_seconds": int(collective_timeout_s(cfg, plan)),
    }
    out.update(parallelism_degrees(cfg, plan))
    if cfg.checkpoint.get("load_path"):
        out["checkpoint.initial_load_path"] = str(cfg.checkpoint.load_path)
        out["checkpoint.initial_load_model_only"] = False
    out.update(overrides(cfg))
    return out


def overrides(cfg: DictConfig) -> dict[str, Any]:
    """``trainer.options.overrides`` as dotted keys (``+trainer.options.overrides.training.gc_freq=3``
    nests; a key may also be written dotted: ``{training.gc_freq: 3}``)."""

    def flat(node: Any, prefix: str) -> dict[str, Any]:
        if not isinstance(node, dict) or not node:
            return {prefix: node}
        out: dict[str, Any] = {}
        for key, value in node.items():
            out.update(flat(value, f"{prefix}.{key}" if prefix else str(key)))
        return out

    given = trainer_options(cfg).get("overrides") or {}
    return flat(given, "") if given else {}


def parallelism_degrees(cfg: DictConfig, plan: JobPlan) -> dict[str, Any]:
    """DDP: every rank a replica; FSDP: every rank a shard; HSDP: ``replicas`` x ``shards``."""
    name = cfg.parallelism.name
    if name == "ddp":
        return {
            "parallelism.data_parallel_replicate_degree": plan.world_size,
            "parallelism.data_parallel_shard_degree": 1,
        }
    if name == "fsdp":
        return {"parallelism.data_parallel_replicate_degree": 1, "parallelism.data_parallel_shard_degree": -1}
    shards = cfg.parallelism.shards or plan.tasks_per_node
    return {
        "parallelism.data_parallel_replicate_degree": plan.world_size // int(shards),
        "parallelism.data_parallel_shard_degree": int(shards),
    }


def trainer_options(cfg: DictConfig) -> dict[str, Any]:
    raw = OmegaConf.select(cfg, "trainer.options", default=None)
    return dict(OmegaConf.to_container(raw, resolve=True)) if raw is not None else {}  # type: ignore[arg-type]


def model_section(cfg: DictConfig) -> dict[str, Any]:
    """``train.model``: a Llama 3 by Hugging Face's LlamaConfig names."""
    return dict(OmegaConf.to_container(cfg.train.model, resolve=True))  # type: ignore[arg-type]
