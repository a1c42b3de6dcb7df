"""A Composer LoggerDestination that keeps what results.json needs.

Registered in LLM Foundry's ``loggers`` registry as ``hpc_llm_results``
(hpc_llm.job.rank.foundry) and listed in the train config, so Composer feeds it every metric it logs (loss,
SpeedMonitor throughput and MFU, eval metrics) on every rank. In-job only.
"""

from __future__ import annotations

import time
from typing import Any

from composer.core import State
from composer.loggers import Logger, LoggerDestination

from hpc_llm.job.rank import context
from hpc_llm.rundir.record import write_progress

#: seconds between rewrites of the progress file (hpc_llm.rundir.record.PROGRESS_FILE)
PROGRESS_EVERY_S = 1.0


class ResultsLogger(LoggerDestination):
    def __init__(self) -> None:
        if context.CURRENT is None:
            raise RuntimeError("hpc_llm_results logger used outside an hpc_llm job")
        self.ctx = context.CURRENT
        self._batch = 0
        self._written = 0.0
        self._total: int | None = None

    def fit_start(self, state: State, logger: Logger) -> None:
        self._total = _total_batches(state)
        self._progress("train", force=True)

    def batch_end(self, state: State, logger: Logger) -> None:
        self._batch = int(state.timestamp.batch)
        self._progress("train")

    def eval_start(self, state: State, logger: Logger) -> None:
        self._progress("eval", force=True)

    def fit_end(self, state: State, logger: Logger) -> None:
        self._progress("post-train", force=True)

    def _progress(self, phase: str, force: bool = False) -> None:
        """Rank 0 rewrites the run's progress file (the launchers' live line reads it)."""
        now = time.time()
        if self.ctx.dist.rank != 0 or (not force and now - self._written < PROGRESS_EVERY_S):
            return
        self._written = now
        loss = self.ctx.loss_history[-1][1] if self.ctx.loss_history else None
        write_progress(
            self.ctx.run_dir,
            {
                "phase": phase,
                "batch": self._batch,
                "total_batches": self._total,
                "loss": loss,
                "tokens_per_sec": self.ctx.metrics.get("throughput/tokens_per_sec"),
                "time": now,
            },
        )

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        for key, raw in metrics.items():
            value = _scalar(raw)
            if value is None:
                continue
            self.ctx.metrics[key] = value
            if key == "loss/train/total":
                # Composer logs the train loss with step = batches completed before
                # this one; record the (1-based) batch that produced it.
                batch = int(step) + 1 if step is not None else self._batch
                self.ctx.loss_history.append((batch, value))


def _total_batches(state: State) -> int | None:
    """Batches the run trains in all, when max_duration says (ba, or ep with a sized loader)."""
    from composer.core import TimeUnit

    duration = state.max_duration
    if duration is None:
        return None
    if duration.unit == TimeUnit.BATCH:
        return int(duration.value)
    if duration.unit == TimeUnit.EPOCH and state.dataloader_len is not None:
        return int(duration.value) * int(state.dataloader_len)
    return None


def _scalar(value: Any) -> float | None:
    try:
        return float(value.item() if hasattr(value, "item") else value)
    except (TypeError, ValueError, RuntimeError):
        return None
