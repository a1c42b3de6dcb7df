"""Entry point of one rank: ``python -m hpc_llm.job.rank.entry <payload>``.

The launcher pickles (task function, job config) once per job
(:mod:`hpc_llm.rundir.payload`); every rank loads it, makes Hydra's
runtime config available (``HydraConfig.get()``), runs the task function
with the job config, and rank 0 stores the return value for the launcher.
The task function is any Hydra task function.

Under the job's supervisor (:mod:`hpc_llm.job.supervisor`) the ranks are
forked by their node's agent (:mod:`hpc_llm.job.agent`), which passes the
payload it read once; every rank then also keeps a heartbeat
(:mod:`hpc_llm.job.heartbeat`), checks its generation's fence before it writes
(:mod:`hpc_llm.job.rank.fence`) and, if the task function dies of an
exception, leaves a failure report (:mod:`hpc_llm.job.failures`) that lets the
supervisor tell a user error from a machine's.
"""

from __future__ import annotations

import copy
import logging
import pickle
import sys
from pathlib import Path
from typing import Any

import cloudpickle
from hydra._internal.callbacks import Callbacks
from hydra.core.hydra_config import HydraConfig
from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, run_job, setup_globals
from hydra.types import HydraContext
from omegaconf import DictConfig, open_dict, read_write

from hpc_llm.job import failures, heartbeat
from hpc_llm.job.env import JobEnv
from hpc_llm.job.rank import fence, preemption
from hpc_llm.rundir.layout import RunDir
from hpc_llm.rundir.payload import Payload, read_payload


def _is_rank0() -> bool:
    return JobEnv.current().is_rank0


def run_payload(path: Path, payload: Payload | None = None) -> Any:
    """Run the job's task function in this rank: ``payload`` as read from ``path`` (a rank
    forked by its node's agent gets the agent's copy, read once per allocation)."""
    # First thing, before the training stack loads: the Slurm stop signal is
    # recorded (and acted on at the next batch boundary) instead of killing us.
    preemption.install()
    job = JobEnv.current()
    rd = RunDir.of_payload(path)
    run_dir = rd.root
    if job.heartbeat_s:
        heartbeat.start(job.rank, job.heartbeat_s)
    fence.install()
    if job.is_rank0:
        rd.return_value.unlink(missing_ok=True)  # from an earlier attempt
    if payload is None:
        try:
            payload = read_payload(path)
        except (pickle.UnpicklingError, EOFError, ValueError) as exc:
            raise TypeError(f"{path} is not a job payload written by this version of hpc_llm ({exc})") from exc
    if not isinstance(payload.config, DictConfig):
        raise TypeError(f"{path} is not a job payload written by this version of hpc_llm")
    # What Hydra's launchers do in a job process: the launching process's state
    # (its registered resolvers among them), then Hydra's own resolvers.
    Singleton.set_state(payload.singleton_state)
    setup_globals()
    try:
        if payload.hydra_context is not None:
            value, result = _run_hydra_job(payload)
        else:
            value = result = _run_task(payload)
    except (SystemExit, KeyboardInterrupt):
        raise
    except BaseException as exc:
        # a rank of a generation that has ended reports nothing: the supervisor has moved on, and
        # its errors (a peer gone, the fence itself) would be taken for the next generation's history
        if job.supervised and not fence.ended():
            failures.report(run_dir, exc, rank=job.rank, node=heartbeat.node_name(), batch=heartbeat.current_batch())
        raise
    if job.is_rank0:
        try:
            blob = cloudpickle.dumps(result)
        except Exception:  # an unpicklable return value is still a success
            blob = cloudpickle.dumps(repr(result))
        rd.return_value.write_bytes(blob)
    return value


def _run_task(payload: Payload) -> Any:
    """The task function on the job config without its hydra node (the launcher ran run_job)."""
    HydraConfig.instance().set_config(payload.config)
    task_cfg = copy.deepcopy(payload.config)
    with read_write(task_cfg), open_dict(task_cfg):
        del task_cfg["hydra"]
    return payload.task_function(task_cfg)


def _run_hydra_job(payload: Payload) -> tuple[Any, JobReturn]:
    """Hydra's own ``run_job`` (output dir, hydra.job.chdir, env_set, job logging, callbacks,
    .hydra/ files), as in any Hydra launcher's job process. Rank 0 does all of it; the other
    ranks only run the task (no log file, config files or callbacks of their own). A task that
    raised is re-raised, so the step fails as it would have without Hydra."""
    config = payload.config
    context = payload.hydra_context
    if not _is_rank0():
        config = copy.deepcopy(config)
        # Hydra marks the hydra node read-only on its own: the flag must be lifted there.
        with read_write(config.hydra), open_dict(config.hydra):
            config.hydra.output_subdir = None
        context = HydraContext(config_loader=context.config_loader, callbacks=Callbacks())
    ret = run_job(
        hydra_context=context,
        task_function=payload.task_function,
        config=config,
        job_dir_key="hydra.sweep.dir",
        job_subdir_key="hydra.sweep.subdir",
        configure_logging=_is_rank0(),
    )
    if ret.status == JobStatus.FAILED:
        raise ret._return_value
    return ret._return_value, ret


def configure_logging() -> None:
    rank = JobEnv.current().rank
    logging.basicConfig(
        level=logging.INFO,
        format=f"%(asctime)s rank{rank} %(levelname)s %(name)s: %(message)s",
    )


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        sys.exit("usage: python -m hpc_llm.job.rank.entry <payload.pkl>")
    configure_logging()
    run_payload(Path(args[0]))


if __name__ == "__main__":
    main()
