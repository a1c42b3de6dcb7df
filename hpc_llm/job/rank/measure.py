"""What a finished rank measured, as results.json fields (in-job only: torch, Composer)."""

from __future__ import annotations

import os
import resource
import socket
from typing import Any

from hpc_llm.job.env import container_image
from hpc_llm.job.rank.context import JobContext


def peak_memory_bytes() -> int:
    import torch

    if torch.cuda.is_available():
        return int(torch.cuda.max_memory_allocated())
    # ru_maxrss is in KiB on Linux: the peak resident set of this rank process.
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def container() -> dict[str, Any] | None:
    """The container this rank runs in, read from inside it; None outside one.

    Apptainer: ``/.singularity.d`` exists only inside an Apptainer (or Singularity) container
    and the runtime sets ``APPTAINER_CONTAINER`` to the image it started; the runtime's
    version comes in through the batch script (hpc_llm.builtin.container_runtimes). pyxis:
    the batch script's ``PYXIS_CONTAINER_IMAGE`` (every step of the job starts in it, or does
    not start) and enroot's version, from the batch host.
    """
    pyxis_image = os.environ.get("PYXIS_CONTAINER_IMAGE")
    if pyxis_image:  # (first: an image made for both runtimes may have a /.singularity.d)
        return {
            "image": pyxis_image,
            "runtime": "pyxis",
            "enroot_version": os.environ.get("HPC_LLM_ENROOT_VERSION") or None,
        }
    if not os.path.isdir("/.singularity.d"):
        return None
    return {
        "image": container_image(),
        "apptainer_version": os.environ.get("HPC_LLM_APPTAINER_VERSION") or None,
    }


def placement(ctx: JobContext) -> dict[str, Any]:
    """Where this rank ran: node, node rank, local rank, working directory, container."""
    return {
        "rank": ctx.dist.rank,
        "local_rank": ctx.dist.local_rank,
        "node_rank": ctx.dist.node_rank,
        "node": os.environ.get("SLURMD_NODENAME") or socket.gethostname(),
        "cwd": os.getcwd(),
        "container": container(),
    }


def progress_figures(ctx: JobContext) -> dict[str, Any]:
    """What is known at any point of a run: the loss so far, preflight, watchdog events."""
    out: dict[str, Any] = {}
    if ctx.loss_history:
        out["batches_done"] = ctx.loss_history[-1][0]
        out["train_loss"] = ctx.loss_history[-1][1]
        # a stop keeps this attempt's history too: the next attempt's record goes on from it
        out["train_loss_history"] = ctx.loss_history
    if ctx.preflight is not None:
        out["preflight"] = ctx.preflight
    if ctx.watchdog_events:
        out["watchdog_events"] = ctx.watchdog_events
    return out


def throughput(ctx: JobContext, *, tokens: int | None = None, train_s: float | None = None) -> dict[str, Any]:
    """tokens_per_sec and mfu of this attempt's training: Composer's SpeedMonitor, else
    ``tokens / train_s``. None for an attempt that trained no batch (it resumed at max_duration,
    after a stop in the post-train stage): the run's tokens over its load time is no throughput,
    and the record keeps the figures of the attempt that trained (record.carry_training)."""
    if not ctx.loss_history:
        return {"tokens_per_sec": None, "mfu": None}
    tps = ctx.metrics.get("throughput/tokens_per_sec")
    if tps is None and tokens is not None and train_s:
        tps = tokens / train_s
    return {"tokens_per_sec": tps, "mfu": ctx.metrics.get("throughput/device/mfu")}


def kept_figures(ctx: JobContext, *, tokens: int | None = None, train_s: float | None = None) -> dict[str, Any]:
    """What this attempt has trained so far, for the record to keep whatever ends the attempt
    next (RunRecord.trained): its loss history and throughput. Rank 0 alone; no collective."""
    return {**progress_figures(ctx), **throughput(ctx, tokens=tokens, train_s=train_s)}


def training_figures(ctx: JobContext, trainer: Any, *, train_s: float, job_s: float) -> dict[str, Any]:
    """Throughput, loss, memory and mesh of a finished fit (a collective: call on every rank)."""
    from composer.utils import dist

    state = trainer.state
    out = progress_figures(ctx)
    tokens = int(state.timestamp.token)
    out.update(
        batches_done=int(state.timestamp.batch),
        tokens_done=tokens,
        train_s=round(train_s, 3),
        fit_s=round(state.timestamp.total_wct.total_seconds(), 3),
        wallclock_s=round(job_s, 3),
        **throughput(ctx, tokens=tokens, train_s=train_s),
        watchdog_events=ctx.watchdog_events,
    )
    if ctx.loss_history:
        out["train_loss_first"] = ctx.loss_history[0][1]
    per_rank = dist.all_gather_object({**placement(ctx), "peak_memory_bytes": peak_memory_bytes()})
    out["ranks"] = per_rank
    out["peak_memory_bytes_per_rank"] = [r["peak_memory_bytes"] for r in per_rank]
    out["peak_memory_bytes"] = max(out["peak_memory_bytes_per_rank"])
    mesh = getattr(state, "device_mesh", None)
    if mesh is not None and mesh.mesh_dim_names:
        out["device_mesh"] = dict(zip(mesh.mesh_dim_names, (int(s) for s in mesh.mesh.shape), strict=True))
    return out
