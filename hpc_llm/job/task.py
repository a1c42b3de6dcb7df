"""The in-job task: one rank of one training run.

Every launcher (local processes, Slurm tasks, containers) ends up calling
:func:`run` once per rank with the composed config. It wires the rank's
distributed environment, moves into node-local scratch, asks the plugins for
the LLM Foundry train config, trains with ``llmfoundry.command_utils.train``
and, on global rank 0, writes ``results.json``. On the Slurm signal it saves
and requeues (hpc_llm.job.preemption).
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import yaml
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from hpc_llm.config.validate import ResolvedJob, resolve_job
from hpc_llm.job import context, distenv, health, preemption
from hpc_llm.job.context import JobContext
from hpc_llm.job.results import collect_results, failed_results, write_results
from hpc_llm.results import base_results, run_info
from hpc_llm.trainconfig import build_train_config

log = logging.getLogger(__name__)

POST_TRAIN_KEYS = ("conversion_ok", "hf_model_dir", "hf_model_bytes", "inference_ok")


def node_local_dir(cfg: DictConfig, run_dir: Path, dist: distenv.DistEnv) -> Path:
    """Per-node working directory outside the shared run dir (DESIGN.md hazard 1)."""
    base = cfg.cluster.scratch or os.environ.get("TMPDIR") or tempfile.gettempdir()
    job = os.environ.get("SLURM_JOB_ID") or hashlib.sha1(str(run_dir).encode()).hexdigest()[:10]
    path = Path(base) / f"hpc_llm-{job}" / f"node{dist.node_rank}"
    path.mkdir(parents=True, exist_ok=True)
    return path


def run_name(plan_experiment: str, run_dir: Path) -> str:
    """Stable across requeues of the same run (autoresume keys on it)."""
    return f"{plan_experiment}-{run_dir.parent.name}-{run_dir.name}"


def restart_count() -> int:
    return int(os.environ.get("SLURM_RESTART_COUNT") or 0)


def run(cfg: DictConfig) -> dict[str, Any]:
    started = time.time()
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    dist = distenv.from_environ(os.environ)
    os.environ.update(dist.as_environ())
    job = resolve_job(cfg, str(run_dir))
    if dist.world_size != job.plan.world_size:
        raise RuntimeError(
            f"launched {dist.world_size} ranks but the config asks for {job.plan.world_size} "
            f"({job.plan.nodes} node(s) x {job.plan.tasks_per_node} tasks)"
        )
    ctx = JobContext(job.plan, dist, run_dir, node_local_dir(cfg, run_dir, dist), cfg=cfg)
    if dist.rank == 0:
        ctx.attempts = preemption.Attempts.load(run_dir)
        ctx.attempts.items.append(
            preemption.Attempt(job_id=os.environ.get("SLURM_JOB_ID"), restart=restart_count(), started_at=started)
        )
        ctx.attempts.save()
    try:
        if restart_count() > cfg.preemption.max_requeues:
            raise RuntimeError(
                f"requeued {restart_count()} times, more than preemption.max_requeues="
                f"{cfg.preemption.max_requeues}; not training again"
            )
        return _train(cfg, job, ctx, started)
    except preemption.Preempted as stop:
        _after_preemption(cfg, job, ctx, stop)
        raise SystemExit(0) from None
    except health.CheckFailed as failed:
        _after_failed_preflight(cfg, job, ctx, failed)
        raise SystemExit(1) from None  # the reason is logged and in results.json
    except BaseException as exc:
        if dist.rank == 0:
            _finish_attempt(ctx, "failed")
            write_results(run_dir, _with_attempts(failed_results(job.plan, ctx, f"{type(exc).__name__}: {exc}"), ctx))
            log.error("training failed:\n%s", traceback.format_exc())
        raise


def _train(cfg: DictConfig, job: ResolvedJob, ctx: JobContext, started: float) -> dict[str, Any]:
    os.chdir(ctx.node_dir)
    os.environ.update({k: str(v) for k, v in cfg.cluster.env.items()})
    os.environ.update(job.parallelism.env(cfg.parallelism, job.plan))
    if cfg.preflight.enabled:
        # before anything else touches the allocation: a bad node stops the job here
        health.run_preflight(cfg, job.health_checks, ctx)
        if cfg.preflight.only:
            return _preflight_only(job, ctx, started)
    train_cfg = build_train_config(cfg, job, run_name=run_name(job.plan.experiment, ctx.run_dir))
    if ctx.dist.rank == 0:
        (ctx.run_dir / "train_config.yaml").write_text(yaml.safe_dump(train_cfg, sort_keys=False))

    job.data.prepare(cfg.data, ctx)
    job.parallelism.prepare(cfg.parallelism, ctx)
    job.checkpoint.prepare(cfg.checkpoint, ctx)
    for ev in job.evaluators:
        ev.prepare(cfg.eval, ctx)

    # The training stack is imported only here, inside the job.
    from streaming.base.util import clean_stale_shared_memory

    from hpc_llm.job import compat, foundry

    compat.apply()
    context.CURRENT = ctx
    foundry.register()
    # A killed or requeued predecessor leaves Streaming's shared memory behind
    # ("reused local directory"); local rank 0 of every node removes it, all wait.
    clean_stale_shared_memory()
    from llmfoundry.command_utils import train

    t0 = time.time()
    trainer = train(OmegaConf.create(train_cfg))
    train_s = time.time() - t0

    eval_metrics: dict[str, Any] = {}
    waiting = _post_train_group()
    for ev in job.evaluators:
        eval_metrics.update(ev.after_train(cfg.eval, trainer, ctx))
    if waiting is not None:
        # rank 0 may spend long on a rank-0-only step (loading a 30B model for the
        # inference check); the others wait here, past the training group's timeout
        import torch.distributed as tdist

        tdist.barrier(group=waiting)
    # the post-train verdicts the report's "conversion, inference & evaluation OK?" reads
    top = {k: eval_metrics.pop(k) for k in POST_TRAIN_KEYS if k in eval_metrics}
    results = collect_results(
        cfg, job, ctx, trainer, eval_metrics=eval_metrics, train_s=train_s, job_s=time.time() - started
    )
    results.update(top)
    if ctx.dist.rank == 0:
        _finish_attempt(ctx, "completed", int(trainer.state.timestamp.batch))
        write_results(ctx.run_dir, _with_attempts(results, ctx))
    trainer.close()
    return results


POST_TRAIN_TIMEOUT_S = 4 * 3600


def _post_train_group() -> Any:
    """A gloo group with a long timeout for the ranks to wait on each other after training."""
    import datetime

    import torch.distributed as tdist

    if not tdist.is_initialized() or tdist.get_world_size() == 1:
        return None
    return tdist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=POST_TRAIN_TIMEOUT_S))


def _preflight_only(job: ResolvedJob, ctx: JobContext, started: float) -> dict[str, Any]:
    """``hpc-llm preflight``: the checks passed; record them and stop without training."""
    results = base_results(job.plan, "completed")
    results.update(preflight=ctx.preflight, batches_done=0, wallclock_s=round(time.time() - started, 3),
                   finished_at=time.time())
    if ctx.dist.rank == 0:
        _finish_attempt(ctx, "completed", 0)
        write_results(ctx.run_dir, _with_attempts(results, ctx))
    return results


def _after_failed_preflight(cfg: DictConfig, job: ResolvedJob, ctx: JobContext, failed: health.CheckFailed) -> None:
    """Record why (rank 0); with preflight.exclude_bad_nodes, requeue away from the named nodes.

    Every rank reaches the same decision from the same figures. Rank 0 writes
    results.json before anyone exits (a rank exiting 1 first would make srun
    kill rank 0), and all exit 0 together when the job is requeued.
    """
    job_id = os.environ.get("SLURM_JOB_ID")
    everyone = set((ctx.preflight or {}).get("nodes") or [])
    requeue = bool(cfg.preflight.exclude_bad_nodes and job_id and failed.nodes
                   and set(failed.nodes) < everyone and restart_count() < cfg.preemption.max_requeues)
    if ctx.dist.rank == 0:
        where = f" (nodes: {', '.join(failed.nodes)})" if failed.nodes else ""
        reason = f"preflight check '{(ctx.preflight or {}).get('failed_check')}' failed: {failed.reason}{where}"
        _finish_attempt(ctx, "preflight failed", 0)
        results = failed_results(job.plan, ctx, reason)
        results["batches_done"] = 0
        if requeue:
            results.update(status="requeued", excluded_nodes=failed.nodes)
        write_results(ctx.run_dir, _with_attempts(results, ctx))
        if requeue:
            log.warning("%s; requeueing job %s excluding %s", reason, job_id, ", ".join(failed.nodes))
            try:
                health.exclude_and_requeue(str(job_id), failed.nodes)
            except Exception as exc:  # the reason is recorded either way
                log.error("could not requeue job %s excluding %s: %s", job_id, failed.nodes, exc)
        else:
            log.error("%s; not training", reason)
    health.barrier()
    if requeue:
        raise SystemExit(0)


def _finish_attempt(ctx: JobContext, how: str, batch: int | None = None) -> None:
    if ctx.attempts is None:
        return
    a = ctx.attempts.current
    a.ended = how
    if batch is not None:
        a.last_batch = batch
    ctx.attempts.save()


def _with_attempts(results: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    """Add what the report needs: run info and the record of every attempt."""
    if ctx.cfg is not None:
        results.update(run_info(ctx.cfg))
    if ctx.attempts is None:
        return results
    items = ctx.attempts.items
    results["restarts"] = max(restart_count(), len(items) - 1)
    results["batches_lost"] = ctx.attempts.batches_lost()
    results["attempts"] = ctx.attempts.summary()
    requeues = [a.signal_to_requeue_s for a in items if a.signal_to_requeue_s is not None]
    results["signal_to_requeue_s"] = requeues[-1] if requeues else None
    results["slurm_job_ids"] = sorted({a.job_id for a in items if a.job_id}, key=str)
    return results


def _after_preemption(cfg: DictConfig, job: ResolvedJob, ctx: JobContext, stop: preemption.Preempted) -> None:
    """Global rank 0 records the stop and requeues the job once; the others just exit."""
    if ctx.dist.rank != 0 or ctx.attempts is None:
        return
    a = ctx.attempts.current
    a.ended, a.signal, a.signal_time = "preempted", stop.signal_name, stop.signal_time
    a.stopped_at_batch = a.last_batch = stop.batch
    a.save_s = round(stop.save_s, 3)
    job_id = os.environ.get("SLURM_JOB_ID")
    if job_id and restart_count() < cfg.preemption.max_requeues:
        a.signal_to_requeue_s = round(preemption.requeue(job_id) - stop.signal_time, 3)
        a.requeued = True
        ctx.attempts.save()
        interim = failed_results(job.plan, ctx, None)
        interim["status"] = "requeued"
        interim["batches_done"] = stop.batch
        write_results(ctx.run_dir, _with_attempts(interim, ctx))
        log.warning("%s: checkpoint at batch %d saved in %.1fs; job %s requeued",
                    stop.signal_name, stop.batch, stop.save_s, job_id)
        return
    ctx.attempts.save()
    reason = (
        f"stopped by {stop.signal_name} after batch {stop.batch} and not requeued: "
        + (f"preemption.max_requeues={cfg.preemption.max_requeues} reached" if job_id else "not running under Slurm")
        + f"; resume from {job.checkpoint.latest(cfg.checkpoint, job.plan)}"
    )
    final = failed_results(job.plan, ctx, reason)
    final["batches_done"] = stop.batch
    final["checkpoint"] = job.checkpoint.latest(cfg.checkpoint, job.plan)
    write_results(ctx.run_dir, _with_attempts(final, ctx))
    raise SystemExit(1)
