"""The Composer callback around :class:`hpc_llm.job.rank.watchdog.ThroughputWatch` (in-job only)."""

from __future__ import annotations

import logging
import time
from typing import Any

from composer.core import Callback

from hpc_llm.job.rank.watchdog import ThroughputWatch

log = logging.getLogger(__name__)


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
        batch = int(state.timestamp.batch)
        record = {
            "batch": batch,
            "tokens_per_sec": round(tps, 1),
            "median_tokens_per_sec": round(event["median"], 1),
            "ratio": round(event["ratio"], 3),
            "nodes": self.nodes,
            "action": self.action,
            "time": time.time(),
        }
        self.ctx.watchdog_events.append(record)
        log.warning(
            "hpc_llm watchdog: %.0f tokens/s at batch %d is %.0f%% of the running median %.0f for %d batches; "
            "nodes: %s%s",
            tps,
            batch,
            100 * event["ratio"],
            event["median"],
            self.watch.patience,
            ", ".join(self.nodes),
            "; checkpointing and requeueing" if self.action == "requeue" else "",
        )
        if self.action == "requeue":
            from hpc_llm.job.rank import preemption

            preemption.request_stop("watchdog")
