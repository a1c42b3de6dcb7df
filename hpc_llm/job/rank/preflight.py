"""Preflight inside the job: health checks on the allocation before training.

The checks run on every rank after the default process group is up (gloo on
CPU, NCCL on GPUs: the backend Composer would pick, so Composer reuses the
group). Every verdict is computed from figures gathered from all ranks, so
every rank agrees on whether to stop. In-job only.
"""

from __future__ import annotations

import datetime
import logging
import os
import socket
from typing import Any

# CheckFailed lives with the other exceptions plugin authors raise
# (hpc_llm.errors); it stays importable from here, as before
from hpc_llm.errors import CheckFailed

log = logging.getLogger(__name__)


def node_name() -> str:
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


def init_process_group(timeout_s: int = 600) -> None:
    import torch
    import torch.distributed as dist

    if dist.is_initialized():
        return
    # the backend Composer picks (NCCL whenever CUDA is there), so it reuses this group
    gpu = torch.cuda.is_available()
    if gpu:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(
        backend="nccl" if gpu else "gloo",
        init_method="env://",
        timeout=datetime.timedelta(seconds=timeout_s),
    )


def gather(value: Any) -> list[Any]:
    import torch.distributed as dist

    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, value)
    return out


def node_names() -> list[str]:
    """Node name of every rank, by rank."""
    return gather(node_name())


def run_preflight(cfg: Any, checks: tuple[Any, ...], ctx: Any) -> dict[str, Any]:
    """Run ``checks`` in order; returns the record for results.json or raises CheckFailed."""
    init_process_group()
    names = node_names()
    out: dict[str, Any] = {"passed": True, "nodes": sorted(set(names)), "checks": {}}
    ctx.preflight = out
    for check in checks:
        try:
            out["checks"][check.name] = check.run(cfg.preflight, ctx)
        except CheckFailed as failed:
            if failed.details is not None:
                out["checks"][check.name] = failed.details
            out.update(passed=False, failed_check=check.name, reason=failed.reason, bad_nodes=failed.nodes)
            _log(out, ctx)
            raise
    _log(out, ctx)
    return out


def _log(out: dict[str, Any], ctx: Any) -> None:
    if ctx.dist.rank == 0:
        from hpc_llm.results.preflight import summary

        log.info("preflight:\n%s", summary(out))


def barrier() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()
