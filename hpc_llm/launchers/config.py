"""Typed configs of hpc_llm's Hydra launchers and sweeper (ConfigStore group hydra/launcher)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from hydra.core.config_store import ConfigStore


@dataclass
class LocalLauncherConf:
    _target_: str = "hydra_plugins.hpc_llm_launchers.hpc_llm_plugins.LocalLauncher"
    # Config keys holding each job's node and rank counts; a Hydra app without
    # them runs one rank per job.
    nodes_key: str = "resources.nodes"
    tasks_key: str = "resources.tasks_per_node"
    # Seconds to wait for one job's ranks before killing them (0: no limit).
    timeout_s: int = 0
    # Copy rank 0's output to the console while it runs (all ranks always log
    # to <run dir>/logs/rank<N>.log).
    stream: bool = True


@dataclass
class ValidatingSweeperConf:
    _target_: str = "hydra_plugins.hpc_llm_launchers.hpc_llm_plugins.ValidatingSweeper"
    max_batch_size: Optional[int] = None
    params: Optional[dict[str, str]] = field(default=None)
    # Dotted path of callable(job_cfg, run_dir) run on every job of the sweep
    # before any directory is created; raise to stop the sweep.
    validate: Optional[str] = None


def register_launcher_configs() -> None:
    cs = ConfigStore.instance()
    cs.store(group="hydra/launcher", name="local", node=LocalLauncherConf, provider="hpc_llm")
    cs.store(group="hydra/sweeper", name="hpc_llm", node=ValidatingSweeperConf, provider="hpc_llm")
