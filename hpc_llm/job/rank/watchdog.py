"""Throughput watchdog: warn (or checkpoint and requeue) when training slows down.

Each batch's tokens/s is compared with the running median of recent healthy
batches; ``patience`` batches in a row below ``fraction`` of it is an event.
On GPUs MFU is tokens/s times a constant (FLOPs per token / peak), so the
ratio is the same whether one watches MFU or tokens/s; tokens/s also works
on CPU. Slow batches are kept out of the median so that a long slowdown does
not become the new normal. The Composer side is
:mod:`hpc_llm.job.rank.watchdog_callback`; other trainers get it from
:class:`hpc_llm.job.rank.step_duties.StepDuties`. Both report through :func:`slowed`.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections import deque
from typing import Any

log = logging.getLogger(__name__)


class ThroughputWatch:
    """The decision, without Composer: feed it one throughput figure per batch."""

    def __init__(self, window: int, fraction: float, patience: int) -> None:
        self.window, self.fraction, self.patience = window, fraction, patience
        self.healthy: deque[float] = deque(maxlen=window)
        self.low_run = 0

    def observe(self, value: float) -> dict[str, float] | None:
        """An event (once per slowdown) when ``patience`` batches in a row are slow."""
        if len(self.healthy) < self.window:
            self.healthy.append(value)
            return None
        median = statistics.median(self.healthy)
        if value >= self.fraction * median:
            self.low_run = 0
            self.healthy.append(value)
            return None
        self.low_run += 1
        if self.low_run != self.patience:
            return None
        return {"median": median, "value": value, "ratio": value / median if median else 0.0}


def slowed(
    ctx: Any, event: dict[str, float], tps: float, batch: int, nodes: list[str], action: str, patience: int
) -> None:
    """Rank 0's part of an event: the record's ``watchdog_events``, a warning, and with
    ``action`` requeue the stop (every rank stops at the same batch through the stop flag)."""
    ctx.watchdog_events.append(
        {
            "batch": batch,
            "tokens_per_sec": round(tps, 1),
            "median_tokens_per_sec": round(event["median"], 1),
            "ratio": round(event["ratio"], 3),
            "nodes": nodes,
            "action": action,
            "time": time.time(),
        }
    )
    log.warning(
        "hpc_llm watchdog: %.0f tokens/s at batch %d is %.0f%% of the running median %.0f for %d batches; nodes: %s%s",
        tps,
        batch,
        100 * event["ratio"],
        event["median"],
        patience,
        ", ".join(nodes),
        "; checkpointing and requeueing" if action == "requeue" else "",
    )
    if action == "requeue":
        from hpc_llm.job.rank import preemption

        preemption.request_stop("watchdog")
