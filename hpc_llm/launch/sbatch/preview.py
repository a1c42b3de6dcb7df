"""One Slurm job composed, checked and rendered exactly as it would be submitted, without
submitting it: ``hpc-llm render`` prints its script, ``hpc-llm doctor`` checks the cluster
against what it asks for. No torch here (login-node path)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hpc_llm.config.compose import compose


@dataclass
class Job:
    """The composed job: its config, the launcher's options, run dir and rendered spec."""

    cfg: Any
    opts: Any
    run_dir: str
    spec: Any
    #: the LLM Foundry train config the job would run
    train: Any = None


def compose_job(overrides: Sequence[str]) -> Job:
    """Job 0 of ``python -m hpc_llm <overrides>`` on the Slurm launcher (unless another is
    named), after the submit path's own checks (``validate_job``)."""
    from omegaconf import DictConfig, OmegaConf, open_dict

    from hpc_llm.app import validate_job
    from hpc_llm.config.launcher_options import SlurmLauncherConf
    from hpc_llm.launch.sbatch.spec import build_spec
    from hpc_llm.launch.sweeper import job_run_dir

    overrides = list(overrides)
    if not any(o.startswith(("hydra/launcher=", "hydra.launcher=")) for o in overrides):
        overrides.append("hydra/launcher=slurm")
    cfg = compose(overrides)
    with open_dict(cfg):
        cfg.hydra.job.num = 0
    fields = SlurmLauncherConf.__dataclass_fields__
    opts: DictConfig = OmegaConf.merge(  # type: ignore[assignment]
        OmegaConf.structured(SlurmLauncherConf), {k: v for k, v in cfg.hydra.launcher.items() if k in fields}
    )
    run_dir = job_run_dir(cfg)
    train = validate_job(cfg, run_dir, preview=True)
    return Job(cfg, opts, run_dir, build_spec(cfg, opts, run_dir), train)
