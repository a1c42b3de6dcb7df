"""Login-side validation: a composed config -> a ResolvedJob, or one ConfigError.

Runs for every job of a sweep before anything is created or submitted (from
the hpc_llm sweeper), and again inside the job. Pure: no training stack.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from omegaconf import DictConfig

from hpc_llm.config.llmfoundry_keys import TRAIN_CONFIG_KEYS
from hpc_llm.errors import ConfigError
from hpc_llm.plan import JobPlan, make_plan
from hpc_llm.plugins.base import (
    CheckpointBackend,
    ContainerRuntime,
    DataSource,
    Evaluator,
    ParallelismStrategy,
)
from hpc_llm.plugins.manager import get_plugins


@dataclass(frozen=True)
class ResolvedJob:
    plan: JobPlan
    data: DataSource
    parallelism: ParallelismStrategy
    checkpoint: CheckpointBackend
    evaluators: tuple[Evaluator, ...]
    container: ContainerRuntime


def check_train_keys(train: Mapping[str, object]) -> None:
    for key in train:
        if key not in TRAIN_CONFIG_KEYS:
            close = sorted(k for k in TRAIN_CONFIG_KEYS if k[:4] == str(key)[:4])
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise ConfigError(
                f"train.{key} is not an LLM Foundry train-config key{hint} "
                "(see llmfoundry.utils.config_utils.TrainConfig)"
            )


def resolve_job(cfg: DictConfig, run_dir: str | None = None) -> ResolvedJob:
    plan = make_plan(cfg, run_dir)
    plugins = get_plugins(cfg.plugins.block)
    data = plugins.get("data", cfg.data.name)
    par = plugins.get("parallelism", cfg.parallelism.name)
    ckpt = plugins.get("checkpoint", cfg.checkpoint.name)
    evals = tuple(plugins.get("evaluator", name) for name in cfg.eval.evaluators)
    container = plugins.get("container", cfg.container.name)
    if len(set(cfg.eval.evaluators)) != len(cfg.eval.evaluators):
        raise ConfigError(f"eval.evaluators={list(cfg.eval.evaluators)} lists an evaluator twice")
    data.validate(cfg.data, plan)
    par.validate(cfg.parallelism, plan)
    ckpt.validate(cfg.checkpoint, plan)
    for ev in evals:
        ev.validate(cfg.eval, plan)
    container.validate(cfg.container, plan)
    check_train_keys(cfg.train)
    return ResolvedJob(plan, data, par, ckpt, evals, container)  # type: ignore[arg-type]
