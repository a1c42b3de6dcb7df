"""The Composer callback that measures each rank's busy time per batch (in-job only).

Registered in LLM Foundry's callbacks as ``hpc_llm_straggler`` (hpc_llm.job.rank.foundry) while
``straggler.enabled``. A batch's time runs from the previous batch's end to its own, so that
whatever a rank does between two batches (a callback that holds it, its dataloader) is its own;
an interval that spans an eval or a save (the rank's heartbeat phase left training) or a start
is left out. Each full window's figures ride on the heartbeat
(:func:`hpc_llm.job.heartbeat.pace`) to the agent and the supervisor, which compares the nodes.
"""

from __future__ import annotations

import time
from typing import Any

from composer.core import Callback

from hpc_llm.job import heartbeat
from hpc_llm.job.rank import collective_wait
from hpc_llm.job.rank.straggler import BusyWindow


class StragglerMeasure(Callback):
    def __init__(self, window: int = 10) -> None:
        self.windows = BusyWindow(window)
        self.ddp: collective_wait.DdpWait | None = None
        #: (perf_counter, collective seconds, heartbeat asides) at the last batch's end
        self._last: tuple[float, float, int] | None = None

    def fit_start(self, state: Any, logger: Any) -> None:
        collective_wait.install()
        self.ddp = collective_wait.time_ddp(state.model)
        self._last = None  # the first batch includes the start's warm-up

    def batch_end(self, state: Any, logger: Any) -> None:
        now, waited, asides = time.perf_counter(), collective_wait.waited(), heartbeat.asides()
        ddp_wait = self.ddp.take() if self.ddp is not None else 0.0
        last, self._last = self._last, (now, waited, asides)
        if last is None or asides != last[2]:
            return
        got = self.windows.add(int(state.timestamp.batch), now - last[0], waited - last[1] + ddp_wait)
        if got is not None:
            heartbeat.pace(*got)
