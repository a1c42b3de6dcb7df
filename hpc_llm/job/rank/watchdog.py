"""Throughput watchdog: warn (or checkpoint and requeue) when training slows down.

Each batch's tokens/s is compared with the running median of recent healthy
batches; ``patience`` batches in a row below ``fraction`` of it is an event.
On GPUs MFU is tokens/s times a constant (FLOPs per token / peak), so the
ratio is the same whether one watches MFU or tokens/s; tokens/s also works
on CPU. Slow batches are kept out of the median so that a long slowdown does
not become the new normal. The Composer side is
:mod:`hpc_llm.job.rank.watchdog_callback`.
"""

from __future__ import annotations

import statistics
from collections import deque


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
