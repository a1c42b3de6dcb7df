"""What hpc_llm's launchers share: Hydra setup and per-job config composition."""

from __future__ import annotations

from collections.abc import Sequence

from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, open_dict

from hpc_llm.errors import Failed


class JobFailed(Failed):
    """A launched job ended badly; the message is one line naming where to look."""


class BaseLauncher(Launcher):
    #: prefix of hydra.job.id ("local_3", "slurm_3")
    kind = "base"

    def __init__(self) -> None:
        self.config: DictConfig | None = None
        self.task_function: TaskFunction | None = None
        self.hydra_context: HydraContext | None = None
        #: job configs the sweeper already composed and validated, by overrides
        self.precomposed: dict[tuple[str, ...], DictConfig] = {}

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config = config
        self.task_function = task_function
        self.hydra_context = hydra_context

    def job_config(self, overrides: Sequence[str], idx: int) -> DictConfig:
        """The composed config of job ``idx`` (reusing the sweeper's when it has it)."""
        if self.config is None or self.hydra_context is None:
            raise RuntimeError("launcher used before Hydra called setup()")
        # each job's config is used once: take the sweeper's own (a copy costs ~20 ms a job)
        cached = self.precomposed.pop(tuple(overrides), None)
        if cached is not None:
            cfg = cached
        else:
            cfg = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
        with open_dict(cfg):
            cfg.hydra.job.id = f"{self.kind}_{idx}"
            cfg.hydra.job.num = idx
        return cfg
