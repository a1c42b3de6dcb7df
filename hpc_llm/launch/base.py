"""What hpc_llm's launchers share: Hydra setup, the start of a sweep, per-job config
composition, the hooks the sweeper calls, and what a person sees of each job."""

from __future__ import annotations

import copy
import pickle
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from hydra.core.utils import JobReturn, configure_log, filter_overrides, setup_globals
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf, open_dict

from hpc_llm.config import foundry_yaml
from hpc_llm.config.store import require_schema
from hpc_llm.errors import Failed, warn_once
from hpc_llm.results import console
from hpc_llm.rundir import provenance
from hpc_llm.rundir.record import read_results


def copy_config(cfg: DictConfig) -> DictConfig:
    """A deep copy of ``cfg``: a pickle round trip (OmegaConf's __getstate__), ~3x faster than
    copy.deepcopy on a composed job config, which a sweep makes once or twice a point."""
    try:
        return pickle.loads(pickle.dumps(cfg, protocol=pickle.HIGHEST_PROTOCOL))
    except (pickle.PicklingError, AttributeError, TypeError):  # a structured config pickle cannot name
        return copy.deepcopy(cfg)


class LazyJobReturn(JobReturn):
    """A JobReturn whose ``cfg`` is made by ``make_cfg`` when first read (and its ``hydra_cfg``
    by ``make_hydra_cfg``, when one is set and no ``hydra_cfg`` was given)."""

    def __init__(self, make_cfg: Callable[[], DictConfig]) -> None:
        self._make_cfg: Callable[[], DictConfig] | None = make_cfg
        self.make_hydra_cfg: Callable[[], DictConfig] | None = None
        super().__init__()

    @property
    def hydra_cfg(self) -> Any:
        if self.__dict__.get("_hydra_cfg") is None and self.make_hydra_cfg is not None:
            self.__dict__["_hydra_cfg"], self.make_hydra_cfg = self.make_hydra_cfg(), None
        return self.__dict__.get("_hydra_cfg")

    @hydra_cfg.setter
    def hydra_cfg(self, value: Any) -> None:
        self.__dict__["_hydra_cfg"] = value
        if value is not None:
            self.make_hydra_cfg = None

    @property
    def cfg(self) -> Any:
        if self.__dict__.get("_cfg") is None and self._make_cfg is not None:
            self.__dict__["_cfg"], self._make_cfg = self._make_cfg(), None
        return self.__dict__.get("_cfg")

    @cfg.setter
    def cfg(self, value: Any) -> None:
        self.__dict__["_cfg"] = value
        if value is not None:
            self._make_cfg = None


def hydra_node_copy(cfg: DictConfig) -> DictConfig:
    """What Hydra's ``HydraConfig.set_config(cfg)`` keeps (and a JobReturn's ``hydra_cfg`` is): a
    copy of the hydra node alone, interpolating into the job's config; without setting the
    process-wide HydraConfig to it. The same steps as set_config's (hydra/core/hydra_config.py)."""
    OmegaConf.set_readonly(cfg.hydra, True)
    made = OmegaConf.masked_copy(cfg, "hydra")
    made.hydra._set_parent(cfg)
    return made


class JobFailed(Failed):
    """A launched job ended badly; the message is one line naming where to look."""


def shown(overrides: Sequence[str]) -> str:
    """A job's overrides as a person reads them in one line."""
    return " ".join(filter_overrides(overrides)) or "(defaults)"


def resource_key(resources_key: str, old_key: str | None, old_name: str, field: str) -> str:
    """The config key of one resource field; ``nodes_key`` / ``tasks_key`` (the local launcher's
    names before ``resources_key``) still work, with a deprecation warning."""
    if old_key:
        warn_once(
            f"hydra.launcher.{old_name} is deprecated; use hydra.launcher.resources_key "
            f"(the config node holding nodes and tasks_per_node, default 'resources')"
        )
        return old_key
    return f"{resources_key}.{field}"


class BaseLauncher(Launcher):
    """A Hydra launcher of hpc_llm: the sweeper (hpc_llm.launch.sweeper) calls
    :meth:`check_job` on every job before anything is created, then :meth:`launch`."""

    #: prefix of hydra.job.id ("local_3", "slurm_3")
    kind = "base"

    def __init__(self) -> None:
        self.config: DictConfig | None = None
        self.task_function: TaskFunction | None = None
        self.hydra_context: HydraContext | None = None
        #: job configs the sweeper already composed and validated, by overrides
        self.precomposed: dict[tuple[str, ...], DictConfig] = {}
        #: provenance of this invocation (collected once per sweep: git is not free)
        self.provenance: tuple[dict[str, Any], str] = ({}, "")

    # -- hooks the sweeper calls ---------------------------------------------
    def check_job(self, cfg: DictConfig) -> None:
        """Raise a one-line ConfigError if this launcher cannot run job ``cfg``; nothing exists yet."""

    # -- shared steps of launch() ----------------------------------------------
    def begin_sweep(self) -> Path:
        """What every launch starts with: Hydra's globals and logging, the sweep dir, provenance."""
        if self.config is None or self.hydra_context is None:
            raise RuntimeError("launcher used before Hydra called setup()")
        setup_globals()
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        self.provenance = provenance.collect()
        return sweep_dir

    def print_summary(self, run_dir: str | Path, title: str) -> dict[str, Any] | None:
        """The summary table of a finished job (from its results.json), if it wrote one."""
        results = read_results(run_dir)
        if results is not None:
            from rich.console import Console  # only here: a submit that shows no summary never imports rich

            Console(width=max(100, Console().width)).print(console.summary(results, title=title))
        return results

    @staticmethod
    def experiment(cfg: DictConfig) -> str | None:
        value = OmegaConf.select(cfg, "experiment", default=None)
        return str(value) if value is not None else None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        if getattr(task_function, "__module__", None) == "hpc_llm.app":  # hpc_llm's own app, not any Hydra app
            require_schema(config)
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
            foundry_yaml.apply(cfg)
        with open_dict(cfg):
            cfg.hydra.job.id = f"{self.kind}_{idx}"
            cfg.hydra.job.num = idx
        return cfg
