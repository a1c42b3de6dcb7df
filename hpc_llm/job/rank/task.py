"""The in-job task: one rank of one training run.

Every launcher (local processes, Slurm tasks, containers) ends up calling
:func:`run` once per rank with the composed config. It reads as the run's
story: set up (distributed environment, node-local working dir, the run's
record), check (preflight), train (the run's trainer: LLM Foundry by default,
:mod:`hpc_llm.job.rank.foundry_train`; torchtitan, :mod:`hpc_llm.job.rank.titan.run`),
evaluate (the post-train evaluators) and record (results.json, through
:mod:`hpc_llm.rundir.record`). On the Slurm signal it saves and requeues
(:mod:`hpc_llm.job.rank.preemption`).
"""

from __future__ import annotations

import logging
import os
import time
import traceback
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from hpc_llm.config.validate import ResolvedJob, resolve_job
from hpc_llm.job import heartbeat
from hpc_llm.job.env import DistEnv, JobEnv
from hpc_llm.job.rank import preemption, preflight, safe_load
from hpc_llm.job.rank.context import JobContext
from hpc_llm.job.rank.measure import progress_figures
from hpc_llm.rundir import provenance
from hpc_llm.rundir.layout import RunDir, job_scratch
from hpc_llm.rundir.record import RunRecord, run_info

log = logging.getLogger(__name__)


def run(cfg: DictConfig) -> dict[str, Any]:
    started = time.time()
    job, ctx = set_up(cfg, started)
    try:
        if cfg.preflight.enabled:
            # before anything else touches the allocation: a bad node stops the job here
            preflight.run_preflight(cfg, job.health_checks, ctx)
            if cfg.preflight.only:
                return _record(
                    ctx, lambda r: r.completed({"preflight": ctx.preflight, "wallclock_s": _since(started)}, batch=0)
                )
        if ctx.record is not None:  # the config the stack gets (hpc-llm config prints the same)
            write_stack_config(ctx, job.trainer.stack_config(cfg, job, run_name=""))
        # the trainer (trainer.name: LLM Foundry's by default) trains, resuming where the run's
        # checkpoints say, under the contract of docs/reference/trainers.md
        trained = job.trainer.train(cfg, job, ctx)
        figures = evaluate(cfg, job, ctx, trained.handle)
        figures.update(trained.figures(ctx, job_s=time.time() - started))
        if "checkpoint" not in figures:  # a trainer that knows its own last save says so
            figures.update(
                checkpoint=job.checkpoint.latest(cfg.checkpoint, job.plan),
                checkpoint_bytes=job.checkpoint.size_bytes(cfg.checkpoint, job.plan),
            )
        batch = trained.batch
        # closed before the run is called completed: the trackers' runs end (MLflow's FINISHED)
        # and the uploads Composer still holds finish. Recorded first, a user (or a test) who
        # saw "completed" found the MLflow run still RUNNING (seen under load); a close that
        # fails is the step's failure, as it was
        trained.close()
        return _record(ctx, lambda r: r.completed(figures, batch=batch))
    except preemption.Preempted as stop:
        after_stop(cfg, job, ctx, stop)
        raise SystemExit(0) from None
    except preflight.CheckFailed as failed:
        after_failed_preflight(cfg, job, ctx, failed)
        raise SystemExit(1) from None  # the reason is logged and in results.json
    except BaseException as caught:
        # a refused checkpoint (hpc_llm.job.rank.safe_load) as its one line, not DCP's wrapper
        exc = safe_load.unwrap(caught)
        if ctx.record is not None:
            ctx.record.failed(
                f"{type(exc).__name__}: {exc}",
                progress_figures(ctx),
                status="interrupted" if supervised() else "failed",
            )
            log.error("training failed:\n%s", traceback.format_exc())
        if exc is not caught:
            raise exc from None
        raise


# -- set up --------------------------------------------------------------------


def set_up(cfg: DictConfig, started: float) -> tuple[ResolvedJob, JobContext]:
    """This rank's distributed environment, its node-local working dir and (rank 0) the run's record."""
    heartbeat.phase("setup")
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    env = JobEnv.current()
    dist = env.dist()
    os.environ.update(dist.as_environ())
    job = resolve_job(cfg, str(run_dir), nodes_now=nodes_now(cfg, dist.world_size))
    if dist.world_size != job.plan.world_size:
        raise RuntimeError(
            f"launched {dist.world_size} ranks but the config asks for {job.plan.world_size} "
            f"({job.plan.nodes} node(s) x {job.plan.tasks_per_node} tasks)"
        )
    ctx = JobContext(job.plan, dist, run_dir, node_local_dir(cfg, run_dir, dist), cfg=cfg)
    if dist.rank == 0:
        ctx.record = RunRecord.open(
            run_dir,
            job.plan,
            {**run_info(cfg), "provenance": provenance.for_results(run_dir)},
            job_id=env.job_id,
            restart=env.restart,
            started_at=started,
            generation=env.generation,
            nodes=list(env.nodes),
            alloc_started_at=env.alloc_start,
        )
        if env.forked_at is not None:
            ctx.record.note(forked_at=env.forked_at)
    os.chdir(ctx.node_dir)
    os.environ.update({k: str(v) for k, v in cfg.cluster.env.items()})
    os.environ.update(job.parallelism.env(cfg.parallelism, job.plan))
    return job, ctx


def nodes_now(cfg: DictConfig, world_size: int) -> int | None:
    """The nodes this generation trains on, when the supervisor started it on fewer than the run
    was submitted with (``resources.min_nodes``: a node lost with no spare); None: as submitted.
    The plan is then made for them: the per-rank batch and HSDP's replicas follow, the global
    batch stays (``resolve_job`` refuses a size outside ``[min_nodes, nodes]``)."""
    per_node = int(cfg.resources.tasks_per_node)
    if world_size % per_node or world_size // per_node == int(cfg.resources.nodes):
        return None
    return world_size // per_node


def node_local_dir(cfg: DictConfig, run_dir: Path, dist: DistEnv) -> Path:
    """Per-node working directory outside the shared run dir (docs/upstream-fixes.md, upstream fix 1)."""
    path = scratch_path(cfg, run_dir, JobEnv.current().job_id, dist.node_rank)
    path.mkdir(parents=True, exist_ok=True)
    return path


def scratch_path(cfg: DictConfig, run_dir: Path, job_id: str | None, node_rank: int) -> Path:
    """``<cluster.scratch, else $TMPDIR, else /tmp>/hpc_llm-<job>/node<node rank>`` (the node's
    agent removes it when the allocation ends)."""
    return job_scratch(cfg.cluster.scratch, job_id, run_dir) / f"node{node_rank}"


def supervised() -> bool:
    """A supervisor (hpc_llm.job.supervisor) watches this step and decides what a stop means."""
    return JobEnv.current().supervised


def write_stack_config(ctx: JobContext, stack: dict[str, Any]) -> None:
    """``train_config.yaml``: what the trainer's stack gets (LLM Foundry's trainer writes it
    again with its run name and tracker tags)."""
    import yaml

    RunDir(ctx.run_dir).train_config.write_text(yaml.safe_dump(stack, sort_keys=False))


# -- evaluate --------------------------------------------------------------------

#: rank 0 may spend long on a rank-0-only step (loading a 30B model for the
#: inference check); the others wait this long, past the training group's timeout
POST_TRAIN_TIMEOUT_S = 4 * 3600


def evaluate(cfg: DictConfig, job: ResolvedJob, ctx: JobContext, trainer: Any) -> dict[str, Any]:
    """Every evaluator's ``after_train``, in order. Their metrics go under ``eval``,
    except the keys an evaluator declares as top level (``Evaluator.top_level_keys``)."""
    figures: dict[str, Any] = {"eval": {}}
    waiting = _post_train_group()
    for ev in job.evaluators:
        for key, value in ev.after_train(cfg.eval, trainer, ctx).items():
            if key in ev.top_level_keys:
                figures[key] = value
            else:
                figures["eval"][key] = value
    if waiting is not None:
        import torch.distributed as tdist

        tdist.barrier(group=waiting)
    return figures


def _post_train_group() -> Any:
    """A gloo group with a long timeout for the ranks to wait on each other after training."""
    import datetime

    import torch.distributed as tdist

    if not tdist.is_initialized() or tdist.get_world_size() == 1:
        return None
    return tdist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=POST_TRAIN_TIMEOUT_S))


# -- record ------------------------------------------------------------------------


def _record(ctx: JobContext, write: Any) -> dict[str, Any]:
    """Rank 0 writes the record with ``write(record)``; every rank returns the same dict shape."""
    if ctx.record is None:
        return {"rank": ctx.dist.rank}
    results: dict[str, Any] = write(ctx.record)
    return results


def _since(t: float) -> float:
    return round(time.time() - t, 3)


def after_stop(cfg: DictConfig, job: ResolvedJob, ctx: JobContext, stop: preemption.Preempted) -> None:
    """Global rank 0 records the stop; under the supervisor every rank exits 0 and it requeues."""
    record = ctx.record
    latest = stop.checkpoint or job.checkpoint.latest(cfg.checkpoint, job.plan)
    if record is not None:
        record.note(
            signal=stop.signal_name,
            signal_time=stop.signal_time,
            stopped_at_batch=stop.batch,
            save_s=round(stop.save_s, 3),
        )
        figures = {**progress_figures(ctx), "batches_done": stop.batch, "checkpoint": latest}
        cause = "watchdog" if stop.signal_name == "watchdog" else None
        if supervised():
            record.stopped(figures, batch=stop.batch, cause=cause)
            log.warning("%s: checkpoint at batch %d saved in %.1fs", stop.signal_name, stop.batch, stop.save_s)
        else:
            record.stopped(
                figures,
                batch=stop.batch,
                cause=cause,
                status="failed",
                error=f"stopped by {stop.signal_name} after batch {stop.batch} and not requeued "
                f"(no Slurm supervisor); resume from {latest}",
            )
    if not supervised():
        raise SystemExit(1)


def after_failed_preflight(cfg: DictConfig, job: ResolvedJob, ctx: JobContext, failed: preflight.CheckFailed) -> None:
    """Record why (rank 0); with preflight.exclude_bad_nodes, the supervisor requeues away from the named nodes.

    Every rank reaches the same decision from the same figures. Rank 0 writes
    results.json before anyone exits (a rank exiting 1 first would make srun
    kill rank 0).
    """
    everyone = set((ctx.preflight or {}).get("nodes") or [])
    requeue = bool(cfg.preflight.exclude_bad_nodes and supervised() and failed.nodes and set(failed.nodes) < everyone)
    if ctx.record is not None:
        where = f" (nodes: {', '.join(failed.nodes)})" if failed.nodes else ""
        reason = f"preflight check '{(ctx.preflight or {}).get('failed_check')}' failed: {failed.reason}{where}"
        figures = {**progress_figures(ctx), "batches_done": 0}
        if requeue:
            figures["excluded_nodes"] = failed.nodes
        ctx.record.failed(
            reason,
            figures,
            batch=0,
            cause="preflight" if requeue else "preflight_failed",
            suspects=failed.nodes,
            status="interrupted" if requeue else "failed",
        )
        log.error("%s; %s", reason, "requeueing without them" if requeue else "not training")
    preflight.barrier()
