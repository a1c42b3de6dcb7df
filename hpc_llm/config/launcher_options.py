"""Typed configs of hpc_llm's Hydra launchers and sweeper (ConfigStore group hydra/launcher): the
launcher's options are config like the rest, so config/ checks them without importing launch/."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from hydra.core.config_store import ConfigStore


@dataclass
class LocalLauncherConf:
    _target_: str = "hydra_plugins.hpc_llm_launchers.hpc_llm_plugins.LocalLauncher"
    # Config node holding each job's resources (nodes, tasks_per_node), as for
    # the Slurm launcher; a Hydra app without it runs one rank per job.
    resources_key: str = "resources"
    # Deprecated: the node and rank count keys before resources_key (still read, with a warning).
    nodes_key: str | None = None
    tasks_key: str | None = None
    # Seconds to wait for one job's ranks before killing them (0: no limit).
    timeout_s: int = 0
    # Copy rank 0's whole output to the console while it runs; null: only with -v
    # (or HPC_LLM_LOG_LEVEL=INFO), else a live progress line and a summary. All
    # ranks always log to <run dir>/logs/rank<N>.log.
    stream: bool | None = None
    # How each rank starts Python; None: the trainer's environment (trainer.python), else this
    # interpreter (docs/reference/trainers.md).
    python: str | None = None


@dataclass
class SlurmLauncherConf:
    _target_: str = "hydra_plugins.hpc_llm_launchers.hpc_llm_plugins.SlurmLauncher"
    # true: block until every job ends and return their results (like any Hydra
    # launcher); false: submit, print each job id and run dir, and return.
    wait: bool = False
    # Write run dirs and batch scripts (<run dir>/sbatch.sh) without submitting.
    dry_run: bool = False
    # Slurm placement; None falls back to the cluster profile, then the
    # cluster's default partition.
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    # Time limit overriding the job's resources.time ([D-]HH:MM:SS).
    time: str | None = None
    # Signal Slurm sends before the time limit or at preemption, and how many
    # seconds before (sbatch --signal=SIG@LEAD). Never USR1: NCCL uses it.
    signal: str = "USR2"
    signal_lead_s: int = 120
    # Whole nodes only (sbatch --exclusive); null: the cluster profile's (GPU profiles: true).
    exclusive: bool | None = None
    # Extra #SBATCH flags, e.g. {constraint: h100, reservation: big}.
    extra_sbatch: dict[str, Any] = field(default_factory=dict)
    # Extra srun arguments, e.g. ["--cpu-bind=cores"].
    srun_args: list[str] = field(default_factory=list)
    # Shell lines run in the batch script before srun (module load ...).
    setup: list[str] = field(default_factory=list)
    # Variables passed to the job by name only (secrets are never written out).
    env_passthrough: list[str] = field(default_factory=list)
    # How each task starts Python; None: this interpreter (on a shared filesystem).
    python: str | None = None
    # sbatch template; None: the cluster profile's (default.sh.j2).
    template: str | None = None
    # Config nodes holding each job's resources and cluster profile.
    resources_key: str = "resources"
    cluster_key: str = "cluster"
    # Seconds between squeue polls while waiting.
    poll_s: float = 5.0
    # Points of a sweep that ask for the same resources go out as one job array
    # (one sbatch call, --array=0-N%K); at most this many of its tasks run at once.
    array_parallelism: int = 256
    # If sbatch refuses a point mid-sweep: false cancels what this invocation had
    # submitted (nothing is half-submitted); true keeps it running.
    keep_on_reject: bool = False
    # Ask the scheduler about every distinct job shape (sbatch --test-only) before
    # submitting anything: an impossible GPU count, memory, QOS or account is one line.
    test_only: bool = True
    # Copy the code the job imports (hpc_llm, its configs and templates, installed
    # plugins) into <sweep dir>/.hpc_llm/code at submit time and run the job from it,
    # so later edits to the checkout cannot change a queued run (host Python only:
    # with a container the image is the snapshot).
    snapshot: bool = False


@dataclass
class ValidatingSweeperConf:
    _target_: str = "hydra_plugins.hpc_llm_launchers.hpc_llm_plugins.ValidatingSweeper"
    max_batch_size: int | None = None
    params: dict[str, str] | None = field(default=None)
    # Dotted path of callable(job_cfg, run_dir) run on every job of the sweep
    # before any directory is created; raise to stop the sweep.
    validate: str | None = None
    # Dotted path of callable([(job_cfg, what validate returned, label)]) run once on the whole
    # sweep after every job is valid, before anything is created; raise to stop the sweep.
    check: str | None = None


#: hydra-submitit-launcher's option names, which users bring by habit, and where
#: hpc_llm takes each (resources are per job here, so a sweep can vary them)
SUBMITIT_NAMES = {
    "additional_parameters": "hydra.launcher.extra_sbatch (e.g. hydra.launcher.extra_sbatch={constraint: h100})",
    "timeout_min": "resources.time (e.g. resources.time=04:00:00)",
    "nodes": "resources.nodes",
    "tasks_per_node": "resources.tasks_per_node",
    "gpus_per_node": "resources.gpus_per_node",
    "cpus_per_task": "resources.cpus_per_task",
    "mem_gb": "resources.mem_per_node (e.g. resources.mem_per_node=64G)",
    "signal_delay_s": "hydra.launcher.signal_lead_s",
    "max_num_timeout": "fault.max_timeouts",
    "submitit_folder": "hydra.sweep.dir (each run dir holds its own logs)",
    "name": "hydra.job.name",
    **{
        k: f"hydra.launcher.extra_sbatch.{k}"
        for k in ("constraint", "exclude", "comment", "cpus_per_gpu", "gpus_per_task", "mem_per_cpu")
    },
    "gres": "resources.gpus_per_node and resources.gpu_type for GPUs (e.g. resources.gpu_type=h100), "
    "hydra.launcher.extra_sbatch.gres for other GRES",
    "mem_per_gpu": "hydra.launcher.extra_sbatch.mem_per_gpu",
}

#: by the whole target: hydra-submitit-launcher's own launcher class is also named SlurmLauncher
_CONF_OF_TARGET = {conf._target_: conf for conf in (LocalLauncherConf, SlurmLauncherConf)}


def launcher_hint(key: str) -> str:
    """Where hpc_llm takes a submitit launcher option (empty for other keys)."""
    where = SUBMITIT_NAMES.get(key)
    return f"; for submitit's {key} use {where}" if where else ""


def check_launcher_options(options: Mapping[str, Any]) -> None:
    """A key added to hpc_llm's launcher config (``+hydra.launcher.KEY=...``) that the launcher
    does not have would be dropped (the Slurm launcher takes ``**options``) or end in
    a traceback (the local one): refuse it in one line, before anything starts."""
    from hpc_llm.errors import ConfigError

    conf = _CONF_OF_TARGET.get(str(options.get("_target_", "")))
    if conf is None:
        return  # not ours: Hydra's own launchers check their options themselves
    import difflib

    known = [f.name for f in fields(conf)]
    for key in options:
        if key not in known:
            close = difflib.get_close_matches(str(key), known, n=1, cutoff=0.6)
            mean = f"; did you mean hydra.launcher.{close[0]}?" if close and not launcher_hint(str(key)) else ""
            raise ConfigError(
                f"unknown config key 'hydra.launcher.{key}'{mean}{launcher_hint(str(key))}; "
                f"allowed keys under hydra.launcher: {', '.join(known)}"
            )


def register_launcher_configs() -> None:
    cs = ConfigStore.instance()
    cs.store(group="hydra/launcher", name="local", node=LocalLauncherConf, provider="hpc_llm")
    cs.store(group="hydra/launcher", name="slurm", node=SlurmLauncherConf, provider="hpc_llm")
    cs.store(group="hydra/sweeper", name="hpc_llm", node=ValidatingSweeperConf, provider="hpc_llm")
