"""Each rank's straggler figure: how long it is *busy* per batch, waits inside collectives taken out.

In synchronous data parallelism every rank's batch takes as long as the slowest rank's: the
batch time names a slow run, never a slow node. What differs is where the time goes. A fast rank
reaches each collective first and waits there for the slow one; the slow rank arrives last and
hardly waits. So a rank's batch time minus its time blocked inside collectives (its *busy* time)
is its own pace, and the slow node's ranks have the largest. Measured on two gloo ranks, one
made 3x slower: DDP busy 0.011 s vs 0.037 s, FSDP2 0.021 s vs 0.060 s (docs/guides/long-runs.md).

:class:`BusyWindow` turns per-batch figures into one figure per window of ``window`` batches
(the median, so one slow batch is not a slow node). Windows are aligned to the global batch
number, so every rank's window ``w`` covers the same batches: batches ``w * window + 1`` to
``(w + 1) * window``. A batch that spans an eval, a save or the start of training (the first
batch after a start includes its warm-up) is left out; a window with fewer than half its
batches measured publishes nothing. The supervisor compares the nodes' figures
(:mod:`hpc_llm.job.supervisor.stragglers`). Stdlib only; the collectives are timed by
:mod:`hpc_llm.job.rank.collective_wait` and the Composer side is
:mod:`hpc_llm.job.rank.straggler_callback`.
"""

from __future__ import annotations

import statistics


class BusyWindow:
    """Feed it one (batch, seconds, seconds waited) per training batch; it returns each full
    window's (window index, median busy seconds, median batch seconds)."""

    def __init__(self, window: int) -> None:
        if window < 1:
            raise ValueError(f"window={window}: need at least one batch")
        self.window = window
        self.current = -1
        self.busy: list[float] = []
        self.wall: list[float] = []

    def add(self, batch: int, wall_s: float, waited_s: float) -> tuple[int, float, float] | None:
        """Batch ``batch`` (1-based, the global count) took ``wall_s``, of which ``waited_s``
        inside collectives. The window's figures when this batch ends one, else None."""
        index = (batch - 1) // self.window
        if index != self.current:
            self.current, self.busy, self.wall = index, [], []
        self.busy.append(max(0.0, wall_s - waited_s))
        self.wall.append(wall_s)
        if batch % self.window:
            return None
        if 2 * len(self.busy) < self.window:
            return None  # too few batches measured (a start, an eval, a save in this window)
        return index, statistics.median(self.busy), statistics.median(self.wall)
