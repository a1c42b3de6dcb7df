"""A BasicSweeper that validates every job of the sweep before creating anything.

Hydra's BasicSweeper creates the sweep directory and writes multirun.yaml
before a single job config is checked; a bad value in job 3 of 4 then leaves
a half-made sweep behind. This sweeper composes every job first and runs the
launcher's ``check_job`` (if it has one) and the configured ``validate``
callable on each; only then does it hand over to BasicSweeper.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.utils import get_method
from omegaconf import DictConfig, open_dict, read_write

from hpc_llm.errors import ConfigError


def job_run_dir(job_cfg: DictConfig) -> str:
    return os.path.abspath(os.path.join(str(job_cfg.hydra.sweep.dir), str(job_cfg.hydra.sweep.subdir)))


class ValidatingSweeper(BasicSweeper):
    def __init__(
        self,
        max_batch_size: int | None = None,
        params: dict[str, str] | None = None,
        validate: str | None = None,
    ) -> None:
        super().__init__(max_batch_size=max_batch_size, params=params)
        self.validate = validate

    _validated = False

    def compose_jobs(self, arguments: list[str]) -> dict[tuple[str, ...], DictConfig]:
        """Every job config of the sweep by its overrides, numbered as the launcher numbers them."""
        if self.hydra_context is None or self.config is None:
            raise RuntimeError("sweeper used before Hydra called setup()")
        parser = OverridesParser.create(config_loader=self.hydra_context.config_loader)
        overrides = parser.parse_overrides(self._parse_config() + list(arguments))
        jobs: dict[tuple[str, ...], DictConfig] = {}
        for batch in self.split_arguments(overrides, None):
            for job_overrides in batch:
                cfg = self.hydra_context.config_loader.load_sweep_config(self.config, list(job_overrides))
                with open_dict(cfg):
                    cfg.hydra.job.num = len(jobs)
                jobs[tuple(job_overrides)] = cfg
        return jobs

    def _run_dir_override(self) -> str | None:
        """``hydra.run.dir=X`` given on the command line (every invocation is a sweep, so Hydra
        itself would ignore it)."""
        if self.config is None:
            raise RuntimeError("sweeper used before Hydra called setup()")
        parser = OverridesParser.create()
        for override in parser.parse_overrides(list(self.config.hydra.overrides.hydra)):
            if override.key_or_group == "hydra.run.dir":
                return str(override.value())
        return None

    def _honour_run_dir(self, jobs: dict[tuple[str, ...], DictConfig]) -> None:
        """A one-point run goes exactly to ``hydra.run.dir``, as in Hydra's RUN mode; a sweep
        of several points is refused (each needs its own dir: hydra.sweep.dir/subdir)."""
        run_dir = self._run_dir_override()
        if run_dir is None:
            return
        if len(jobs) > 1:
            raise ConfigError(
                f"hydra.run.dir={run_dir} names one run's directory, but this sweep has {len(jobs)} jobs; "
                "allowed: hydra.sweep.dir=DIR (job N goes to DIR/${hydra.sweep.subdir}, default DIR/N)"
            )
        if self.config is None:
            raise RuntimeError("sweeper used before Hydra called setup()")
        for cfg in (self.config, *jobs.values()):
            with read_write(cfg.hydra), open_dict(cfg.hydra):
                cfg.hydra.sweep.dir = run_dir
                cfg.hydra.sweep.subdir = "."

    def sweep(self, arguments: list[str]) -> Any:
        check_job: Callable[[DictConfig], None] | None = getattr(self.launcher, "check_job", None)
        validate = get_method(self.validate) if self.validate else None
        if self.config is None:
            raise RuntimeError("sweeper used before Hydra called setup()")
        # Resolve ${now:...} in the sweep dir on the master config first: every job
        # config copies its resolver cache, so all jobs land in the same sweep dir.
        str(self.config.hydra.sweep.dir)
        jobs = self.compose_jobs(arguments)
        self._honour_run_dir(jobs)
        for cfg in jobs.values():
            if validate:
                validate(cfg, job_run_dir(cfg))
            if check_job:
                check_job(cfg)
        self._validated = True
        if hasattr(self.launcher, "precomposed"):
            # Composing costs ~0.2 s a job; the launcher reuses these instead of
            # composing every job a second time (the login node should answer fast).
            self.launcher.precomposed = jobs  # type: ignore[union-attr]
        return super().sweep(arguments)

    def validate_batch_is_legal(self, batch: Any) -> None:
        if not self._validated:  # compose_jobs() already composed every job
            super().validate_batch_is_legal(batch)
