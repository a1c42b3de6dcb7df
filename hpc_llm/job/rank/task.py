"""The in-job task: one rank of one training run.

Every launcher (local processes, Slurm tasks, containers) ends up calling
:func:`run` once per rank with the composed config. It reads as the run's
story: set up (distributed environment, node-local working dir, the run's
record), check (preflight), train (LLM Foundry), evaluate (the post-train
evaluators) and record (results.json, through :mod:`hpc_llm.rundir.record`). On the
Slurm signal it saves and requeues (:mod:`hpc_llm.job.rank.preemption`).
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from hpc_llm.config import trackers
from hpc_llm.config.train_config import build_train_config
from hpc_llm.config.validate import ResolvedJob, resolve_job
from hpc_llm.job import heartbeat
from hpc_llm.job.env import DistEnv, JobEnv
from hpc_llm.job.rank import context, fence, preemption, preflight, safe_load
from hpc_llm.job.rank.context import JobContext
from hpc_llm.job.rank.measure import kept_figures, progress_figures, training_figures
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
        trainer, train_s = train(cfg, job, ctx)
        figures = evaluate(cfg, job, ctx, trainer)
        figures.update(training_figures(ctx, trainer, train_s=train_s, job_s=time.time() - started))
        figures.update(
            checkpoint=job.checkpoint.latest(cfg.checkpoint, job.plan),
            checkpoint_bytes=job.checkpoint.size_bytes(cfg.checkpoint, job.plan),
        )
        batch = int(trainer.state.timestamp.batch)
        # closed before the run is called completed: the trackers' runs end (MLflow's FINISHED)
        # and the uploads Composer still holds finish. Recorded first, a user (or a test) who
        # saw "completed" found the MLflow run still RUNNING (seen under load); a close that
        # fails is the step's failure, as it was
        trainer.close()
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


def run_name(experiment: str, run_dir: Path) -> str:
    """Stable across requeues of the same run (autoresume keys on it)."""
    return RunDir(run_dir).run_name(experiment)


def supervised() -> bool:
    """A supervisor (hpc_llm.job.supervisor) watches this step and decides what a stop means."""
    return JobEnv.current().supervised


# -- train -----------------------------------------------------------------------


def train(cfg: DictConfig, job: ResolvedJob, ctx: JobContext) -> tuple[Any, float]:
    """The plugins' train config, their preparation, then LLM Foundry's ``train``."""
    train_cfg = build_train_config(cfg, job, run_name=run_name(job.plan.experiment, ctx.run_dir))
    if ctx.record is not None:  # rank 0: the tracker run's tags (the trackers log from rank 0)
        items = ctx.record.attempts.items
        trackers.add_job_tags(
            train_cfg,
            job_ids=list(dict.fromkeys(str(a.job_id) for a in items if a.job_id)),
            attempt=len(items),
            commit=((ctx.record.info.get("provenance") or {}).get("git") or {}).get("commit"),
        )
    if ctx.dist.rank == 0:
        RunDir(ctx.run_dir).train_config.write_text(yaml.safe_dump(train_cfg, sort_keys=False))
    heartbeat.phase("data")
    job.data.prepare(cfg.data, ctx)
    job.parallelism.prepare(cfg.parallelism, ctx)
    job.checkpoint.prepare(cfg.checkpoint, ctx)
    for ev in job.evaluators:
        ev.prepare(cfg.eval, ctx)

    # The training stack is imported only here, inside the job.
    from hpc_llm.job.rank import compat, foundry, stale_shm

    compat.apply()
    fence.guard_checkpoints()
    context.CURRENT = ctx
    foundry.register()
    # A killed or requeued predecessor leaves Streaming's shared memory behind ("reused local
    # directory"): local rank 0 of every node removes it (upstream fix 8). The node's other
    # ranks need not wait: none registers anything before LLM Foundry's rendezvous, which this
    # rank joins only after.
    if ctx.dist.local_rank == 0:
        stale_shm.clean(own=ctx.node_dir.resolve())
    from llmfoundry.command_utils import train as foundry_train

    heartbeat.phase("build")
    t0 = time.time()
    with training_done_goes_on(), noting_the_rendezvous(ctx):
        trainer = foundry_train(OmegaConf.create(train_cfg))
    train_s = time.time() - t0
    note_training_end(ctx, trainer, train_s)
    return trainer, train_s


def note_training_end(ctx: JobContext, trainer: Any, train_s: float) -> None:
    """The attempt's record as training ends, before the post-train stage: the final checkpoint
    (Composer's saver writes it in its own fit_end, after hpc_llm's callback has run its, so
    that callback cannot see it) and, for an attempt that found training done, where it
    resumed (no fit ran, so no fit_start noted it). Without them a preemption in the
    post-train stage looked like an attempt that saved nothing, resumed at batch 0.

    And what it trained (the loss history, tokens/s, MFU), kept now: a preemption or time limit
    in the post-train stage finds no batch boundary to stop at, so the ranks are killed after
    the grace time and this attempt never reaches a close of its own (nor does one whose node
    dies there). Kept only at the close, the loss was lost, and a run completed by an attempt
    that resumed at max_duration said train_loss: null (issue #43)."""
    from composer.callbacks import CheckpointSaver

    if ctx.record is None:
        return
    batch = int(trainer.state.timestamp.batch)
    changes: dict[str, Any] = {"last_batch": batch}
    if getattr(trainer, SKIPPED_FIT, False):
        changes["resumed_at_batch"] = batch
    saver = next((cb for cb in trainer.state.callbacks if isinstance(cb, CheckpointSaver)), None)
    if saver is not None and saver.last_checkpoint_batch is not None:
        changes["checkpoint_batch"] = int(saver.last_checkpoint_batch)
    ctx.record.note(**changes)
    # after the note: the history is merged at the batch this attempt resumed at
    ctx.record.trained(kept_figures(ctx, tokens=int(trainer.state.timestamp.token), train_s=train_s))


@contextlib.contextmanager
def noting_the_rendezvous(ctx: JobContext) -> Iterator[None]:
    """Rank 0 notes when LLM Foundry's process-group start and first barrier are done (the
    attempt's ``rendezvous_at``: one phase of a restart's cost, benchmarks/faults.py). Wraps
    LLM Foundry 0.22's own ``_initialize_dist_with_barrier``; without it nothing is noted."""
    # the module, not the function the package re-exports under the same name
    module = importlib.import_module("llmfoundry.command_utils.train")
    original = getattr(module, "_initialize_dist_with_barrier", None)
    if original is None or ctx.record is None:
        yield
        return
    record = ctx.record

    def initialize(*args: Any, **kwargs: Any) -> Any:
        out = original(*args, **kwargs)
        record.note(rendezvous_at=time.time())
        return out

    setattr(module, "_initialize_dist_with_barrier", initialize)  # noqa: B010 - mypy: a private name
    try:
        yield
    finally:
        setattr(module, "_initialize_dist_with_barrier", original)  # noqa: B010 - mypy: a private name


#: set on a Trainer whose fit found training already done (training_done_goes_on)
SKIPPED_FIT = "_hpc_llm_training_was_done"


@contextlib.contextmanager
def training_done_goes_on() -> Iterator[None]:
    """A run whose training is done never trains again: an attempt that resumes from the
    checkpoint at max_duration (a preemption or time limit hit the post-train stage) goes on
    to the post-train stage. Composer's fit would raise "max_duration ... is less than or
    equal to the elapsed training duration", and the run would fail after every batch was
    trained (docs/design/decision-table.md)."""
    from composer import Trainer

    original = Trainer.fit

    def fit(self: Any, *args: Any, **kwargs: Any) -> Any:
        md = self.state.max_duration
        if not args and not kwargs and md is not None and md <= self.state.timestamp.get(md.unit):
            log.warning("training already reached max_duration (%s): going on to the post-train stage", md)
            heartbeat.phase("post")
            setattr(self, SKIPPED_FIT, True)
            return None
        return original(self, *args, **kwargs)

    Trainer.fit = fit  # type: ignore[method-assign]
    try:
        yield
    finally:
        Trainer.fit = original  # type: ignore[method-assign]


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
    latest = job.checkpoint.latest(cfg.checkpoint, job.plan)
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
