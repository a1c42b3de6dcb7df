"""A Composer LoggerDestination that keeps what results.json needs.

Registered in LLM Foundry's ``loggers`` registry as ``hpc_llm_results``
(hpc_llm.job.foundry) and listed in the train config, so Composer feeds it every metric it logs (loss,
SpeedMonitor throughput and MFU, eval metrics) on every rank. In-job only.
"""

from __future__ import annotations

from typing import Any

from composer.core import State
from composer.loggers import Logger, LoggerDestination

from hpc_llm.job import context


class ResultsLogger(LoggerDestination):
    def __init__(self) -> None:
        if context.CURRENT is None:
            raise RuntimeError("hpc_llm_results logger used outside an hpc_llm job")
        self.ctx = context.CURRENT
        self._batch = 0

    def batch_end(self, state: State, logger: Logger) -> None:
        self._batch = int(state.timestamp.batch)

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


def _scalar(value: Any) -> float | None:
    try:
        return float(value.item() if hasattr(value, "item") else value)
    except (TypeError, ValueError, RuntimeError):
        return None
