"""The Hydra application: ``python -m hpc_llm [+experiment=NAME] [overrides]``.

``task`` is the Hydra task function; launchers run it once per rank inside
the job. ``main`` composes the config (typed schemas + ``conf/``), lets the
sweeper validate every job and the launcher start them, and turns bad input
into one line on stderr (exit 2) instead of a traceback.
"""

from __future__ import annotations

import gc
import os
import shlex
import sys
from typing import Any

from omegaconf import DictConfig

from hpc_llm.paths import conf_dir
from hpc_llm.results.console import LOG_LEVEL_ENV


def task(cfg: DictConfig) -> Any:
    from hpc_llm.config.store import require_schema
    from hpc_llm.job.rank.task import run

    require_schema(cfg)  # under Hydra's own launchers, which hpc_llm's checks do not reach

    return run(cfg)


def validate_job(cfg: DictConfig, run_dir: str, preview: bool = False) -> dict[str, Any]:
    """Sweeper hook: every job of a sweep is checked before anything starts (``preview``:
    ``hpc-llm render``, where data not prepared yet is a warning). Returns the job's train
    config, for :func:`check_sweep`."""
    from hpc_llm.config.validate import resolve_job
    from hpc_llm.errors import ConfigError
    from hpc_llm.launch.job_python import check_trainer_python
    from hpc_llm.launch.precheck import warm_up

    if cfg.hydra.job.chdir:
        raise ConfigError(
            "hydra.job.chdir=true: hpc_llm's ranks each work in node-local scratch (Composer's signal files "
            "must not be shared between nodes) and write to the run dir by its absolute path; allowed: false"
        )
    job = resolve_job(cfg, run_dir, preview=preview)
    check_trainer_python(cfg)  # trainer=torchtitan's own venv, made or named
    warm_up(cfg)  # the check's stack imports while the other points are composed (at the first one)
    train = job.trainer.stack_config(cfg, job, run_name="validate")
    # binds depend on the whole config (data, checkpoints, run dir): conflicts show here
    job.container.wrap(cfg.container, job.mounts(cfg), ["python"])
    return train


def check_sweep(points: list[tuple[DictConfig, Any, str]]) -> None:
    """Sweeper hook, once every job is valid: each job's train config (``validate_job``'s) through
    LLM Foundry's and Composer's own code in the job's environment (hpc_llm/launch/precheck.py)."""
    from hpc_llm.launch.precheck import check_sweep as check
    from hpc_llm.launch.precheck import point_of
    from hpc_llm.launch.sweeper import job_run_dir

    check([point_of(cfg, train, label, job_run_dir(cfg)) for cfg, train, label in points if isinstance(train, dict)])


#: the command line as the user typed it, for hpc_llm.rundir.provenance
COMMAND_ENV = "HPC_LLM_COMMAND"


#: flags that name another primary config or its directory (their config.yaml may set no hydra.mode)
_OTHER_PRIMARY = ("-cn", "--config-name", "-cp", "--config-path")


def _mode_known(args: list[str]) -> bool:
    """Whether hpc_llm's own conf/config.yaml is the primary config and the command line leaves
    ``hydra.mode`` to it (MULTIRUN)."""
    return not any(
        a in _OTHER_PRIMARY or a.startswith(tuple(f"{f}=" for f in _OTHER_PRIMARY)) or "hydra.mode" in a.split("=")[0]
        for a in args
    )


def _multirun_without_composing_twice(known: bool) -> None:
    """Hydra composes the whole config once only to read ``hydra.mode`` from it (``Hydra.get_mode``,
    ~0.2 s of every ``python -m hpc_llm``), then again to run. Every hpc_llm invocation runs
    with ``--multirun`` (main inserts it) and hpc_llm's conf/config.yaml sets ``hydra.mode:
    MULTIRUN``, so the answer is known without composing (``known``); Hydra then runs the
    multirun as before (its ``_run_app``: mode MULTIRUN and ``--multirun`` add no override).
    Where another primary config is named or the command line sets ``hydra.mode``, Hydra's own
    get_mode answers (installed once a process; ``known`` is each call's)."""
    from hydra._internal.hydra import Hydra
    from hydra.types import RunMode

    global _MODE_KNOWN
    _MODE_KNOWN = known
    composing = Hydra.get_mode
    if getattr(composing, "hpc_llm", False):
        return

    def get_mode(self: Hydra, config_name: str | None, overrides: list[str]) -> Any:
        return RunMode.MULTIRUN if _MODE_KNOWN else composing(self, config_name, overrides)

    get_mode.hpc_llm = True  # type: ignore[attr-defined]
    Hydra.get_mode = get_mode  # type: ignore[method-assign]


_MODE_KNOWN = False


def main(argv: list[str] | None = None) -> None:
    import hydra

    from hpc_llm.config import interpolation_cache
    from hpc_llm.config.hydra_errors import one_line_errors
    from hpc_llm.config.overrides import adding_keys
    from hpc_llm.config.store import register_configs

    if argv is not None:
        sys.argv = [sys.argv[0], *argv]
    # as typed, for the runs' provenance (hpc_llm.rundir.provenance), before the edits below
    os.environ[COMMAND_ENV] = shlex.join(sys.argv)
    if {"-v", "--verbose"} & set(sys.argv[1:]):
        # everything the ranks print, on the console too (hpc_llm.results.console); Hydra has no -v
        sys.argv = [a for a in sys.argv if a not in ("-v", "--verbose")]
        os.environ.setdefault(LOG_LEVEL_ENV, "INFO")
    sys.argv = [sys.argv[0], *adding_keys(sys.argv[1:])]
    modes = {
        "-m",
        "--multirun",
        "-r",
        "--run",
        "-c",
        "--cfg",
        "-i",
        "--info",
        "-sc",
        "--shell-completion",
        "-h",
        "--help",
        "-hh",
        "--hydra-help",
    }
    shows = {"-c", "--cfg", "-i", "--info"}
    if shows & set(sys.argv[1:]):
        # Hydra takes one mode and raises a ValueError on `-m ... --cfg job`; every hpc_llm
        # invocation is a sweep anyway, so -m adds nothing to showing a config
        sys.argv = [a for a in sys.argv if a not in ("-m", "--multirun")]
    named = any(a in ("-cn", "--config-name") or a.startswith("--config-name=") for a in sys.argv[1:])
    if named and not any(a.startswith("hydra/sweeper=") for a in sys.argv[1:]):
        # another primary config brings Hydra's BasicSweeper, which makes the sweep dir before
        # any check; hpc_llm's sweeper refuses a config that is not hpc_llm's first
        # (next to the other overrides: argparse takes them as one run of positionals)
        at = next((i for i, a in enumerate(sys.argv) if i and "=" in a and not a.startswith("-")), len(sys.argv))
        sys.argv.insert(at, "hydra/sweeper=hpc_llm")
    if not modes & set(sys.argv[1:]):
        # conf/config.yaml sets hydra.mode=MULTIRUN, but Hydra falls back to RUN
        # mode (and a misleading "Ambiguous value" error) whenever the config
        # fails to compose; asking for multirun explicitly keeps the real error.
        sys.argv.insert(1, "--multirun")
    _multirun_without_composing_twice(_mode_known(sys.argv[1:]))
    register_configs()
    interpolation_cache.install()  # a sweep reads the same interpolations in every point
    # This process lives seconds and keeps what it builds until it ends (a sweep's configs,
    # ~1,000 objects each): with Python's default thresholds (700, 10, 10) the cyclic collector
    # ran ~500 times in a 100-point submit, 4 of them over every object, ~0.2 s of CPU; these
    # still collect the young cycles (a point's discarded copies), 70 times less often.
    gc.set_threshold(50_000, 20, 100)
    hydra_main = hydra.main(config_path=str(conf_dir()), config_name="config", version_base="1.3")(task)
    with one_line_errors():
        hydra_main()


if __name__ == "__main__":  # pragma: no cover
    main()
