"""The Composer callback around :class:`hpc_llm.job.rank.watchdog.ThroughputWatch` (in-job only)."""

from __future__ import annotations

import time
from typing import Any

from composer.core import Callback

from hpc_llm.job.rank.watchdog import ThroughputWatch, slowed


class Watchdog(Callback):
    """Registered in LLM Foundry's callbacks as ``hpc_llm_watchdog``."""

    def __init__(self, window: int = 20, fraction: float = 0.5, patience: int = 3, action: str = "warn") -> None:
        from hpc_llm.job.rank import context

        if context.CURRENT is None:
            raise RuntimeError("hpc_llm_watchdog callback used outside an hpc_llm job")
        self.ctx = context.CURRENT
        self.watch = ThroughputWatch(window, fraction, patience)
        self.action = action
        self._last: tuple[float, int] | None = None
        self.nodes: list[str] = []

    def fit_start(self, state: Any, logger: Any) -> None:
        from composer.utils import dist

        from hpc_llm.job.rank.preflight import node_name

        self.nodes = sorted(set(dist.all_gather_object(node_name())))

    def batch_end(self, state: Any, logger: Any) -> None:
        now, tokens = time.perf_counter(), int(state.timestamp.token)
        last, self._last = self._last, (now, tokens)
        if last is None or now <= last[0]:
            return  # the first batch includes start-up costs
        tps = (tokens - last[1]) / (now - last[0])
        event = self.watch.observe(tps)
        if event is None or self.ctx.dist.rank != 0:
            return
        slowed(self.ctx, event, tps, int(state.timestamp.batch), self.nodes, self.action, self.watch.patience)
