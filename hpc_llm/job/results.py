"""Collect a finished rank's figures into results.json (in-job only)."""

from __future__ import annotations

import resource
import time
from typing import Any

from omegaconf import DictConfig

from hpc_llm.config.validate import ResolvedJob
from hpc_llm.job.context import JobContext
from hpc_llm.plan import JobPlan
from hpc_llm.results import base_results, write_results

__all__ = ["collect_results", "failed_results", "write_results"]


def peak_memory_bytes() -> int:
    import torch

    if torch.cuda.is_available():
        return int(torch.cuda.max_memory_allocated())
    # ru_maxrss is in KiB on Linux: the peak resident set of this rank process.
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def failed_results(plan: JobPlan, ctx: JobContext | None, error: str) -> dict[str, Any]:
    out = base_results(plan, "failed")
    out["error"] = error
    if ctx is not None and ctx.loss_history:
        out["batches_done"] = ctx.loss_history[-1][0]
        out["train_loss"] = ctx.loss_history[-1][1]
    if ctx is not None and ctx.preflight is not None:
        out["preflight"] = ctx.preflight
    if ctx is not None and ctx.watchdog_events:
        out["watchdog_events"] = ctx.watchdog_events
    out["finished_at"] = time.time()
    return out


def collect_results(
    cfg: DictConfig,
    job: ResolvedJob,
    ctx: JobContext,
    trainer: Any,
    *,
    eval_metrics: dict[str, Any],
    train_s: float,
    job_s: float,
) -> dict[str, Any]:
    from composer.utils import dist

    state = trainer.state
    out = base_results(job.plan, "completed")
    out["batches_done"] = int(state.timestamp.batch)
    out["tokens_done"] = int(state.timestamp.token)
    out["train_s"] = round(train_s, 3)
    out["fit_s"] = round(state.timestamp.total_wct.total_seconds(), 3)
    out["wallclock_s"] = round(job_s, 3)
    tps = ctx.metrics.get("throughput/tokens_per_sec")
    out["tokens_per_sec"] = tps if tps is not None else (out["tokens_done"] / train_s if train_s else None)
    out["mfu"] = ctx.metrics.get("throughput/device/mfu")
    if ctx.loss_history:
        out["train_loss_first"] = ctx.loss_history[0][1]
        out["train_loss"] = ctx.loss_history[-1][1]
        out["train_loss_history"] = ctx.loss_history
    per_rank = dist.all_gather_object(peak_memory_bytes())
    out["peak_memory_bytes_per_rank"] = per_rank
    out["peak_memory_bytes"] = max(per_rank)
    out["checkpoint"] = job.checkpoint.latest(cfg.checkpoint, job.plan)
    out["checkpoint_bytes"] = job.checkpoint.size_bytes(cfg.checkpoint, job.plan)
    out["eval"] = eval_metrics
    if ctx.preflight is not None:
        out["preflight"] = ctx.preflight
    out["watchdog_events"] = ctx.watchdog_events
    mesh = getattr(state, "device_mesh", None)
    if mesh is not None and mesh.mesh_dim_names:
        out["device_mesh"] = dict(zip(mesh.mesh_dim_names, (int(s) for s in mesh.mesh.shape)))
    out["finished_at"] = time.time()
    return out
