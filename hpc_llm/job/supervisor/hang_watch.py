"""Telling a hung generation from a slow one, from the ranks' heartbeats and the run's own pace.

In-job side, on the batch host: the supervisor hands the beats its agents
send (:meth:`hpc_llm.job.supervisor.fleet.Fleet.beats`) to a
:class:`HangWatch` once a poll. It judges them by the supervisor's own clock
(when it last saw a rank's sequence number, batch or phase change), so clocks
on different nodes never need to agree, and it names:

* **a frozen rank**: its heartbeat stopped (the process is stopped or stuck in
  the kernel) for ``silence_s`` while its agent is alive (a silent agent is
  the fleet's to judge: a dead node is never a hang);
* **a stuck collective**: every rank is training and no batch has finished for
  ``factor`` x the run's median step time (measured here, from how fast the
  top batch moves), never less than ``floor_s``; until a few steps are measured
  (the first batches after a start) the limit is ``timeout_s``;
* **a stalled evaluation**: a rank evaluating for ``factor`` x the longest
  evaluation seen (``timeout_s`` before the first one ends);
* **a storage stall**: a rank in a checkpoint save or upload for ``factor`` x
  the longest one seen (``timeout_s`` before one ends). Nobody is blamed: the
  store, not a node, is slow or down;
* **a start-up that never trains** (:meth:`HangWatch.startup_stuck`).

The post-train stage (HF export, held-out eval of a 70B) has no pace to judge
by: only a frozen rank counts there. No I/O: it only looks at what it is given.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass

from hpc_llm import world
from hpc_llm.job import heartbeat

#: step-time samples before the median decides (until then: timeout_s); the first one after a
#: start (its first batch: allocations, warm-up) is not taken
MIN_SAMPLES = 3


@dataclass(frozen=True)
class Hang:
    #: hang (a rank or a collective: the named nodes, if any, are blamed) | storage (nobody)
    cause: str
    reason: str
    nodes: tuple[str, ...] = ()


class HangWatch:
    """Silence and stalls, judged by the supervisor's own clock."""

    def __init__(self, *, floor_s: float, factor: float, timeout_s: float, silence_s: float) -> None:
        self.floor_s = floor_s
        self.factor = factor
        self.timeout_s = timeout_s
        self.silence_s = silence_s
        self.seen: dict[int, tuple[int, float]] = {}  # rank -> (seq, when it last changed)
        self.phase_since: dict[int, tuple[str, float]] = {}  # rank -> (phase, since when)
        self.longest: dict[str, float] = {}  # phase -> the longest stay in it seen
        self.progress: tuple[int, float] | None = None  # (top batch, when it last changed)
        self.first_progress: float | None = None
        self.steps: deque[float] = deque(maxlen=200)  # seconds per batch, recent samples

    # -- what the watch has learnt -------------------------------------------------------
    @property
    def top_batch(self) -> int:
        return self.progress[0] if self.progress else -1

    @property
    def train_s(self) -> float:
        if self.progress is None or self.first_progress is None:
            return 0.0
        return self.progress[1] - self.first_progress

    @property
    def median_step_s(self) -> float | None:
        return statistics.median(self.steps) if len(self.steps) >= MIN_SAMPLES else None

    def train_limit_s(self) -> float:
        """How long a batch may take before the generation is called hung."""
        median = self.median_step_s
        return self.timeout_s if median is None else max(self.floor_s, self.factor * median)

    def phase_limit_s(self, phase: str) -> float:
        longest = self.longest.get(phase)
        return self.timeout_s if longest is None else max(self.floor_s, self.factor * longest)

    # -- judging ------------------------------------------------------------------------
    def startup_stuck(
        self, beats: dict[int, heartbeat.Beat], elapsed: float, ntasks: int, timeout_s: float | None
    ) -> str | None:
        """The phase a generation is stuck in when not every rank trains ``timeout_s`` after its
        start: no heartbeat from some rank (the fork or the container), or the least advanced
        rank's phase (imports, set-up, data, build: model and rendezvous)."""
        if timeout_s is None or elapsed <= timeout_s or self.progress is not None:
            return None
        if len(beats) < ntasks:
            return f"the ranks' start ({ntasks - len(beats)} of {ntasks} ranks never beat)"
        waiting = [b for b in beats.values() if b.phase in heartbeat.STARTUP_PHASES]
        if not waiting:
            return None
        slowest = min(waiting, key=lambda b: list(heartbeat.STARTUP_PHASES).index(b.phase))
        return f"{heartbeat.STARTUP_PHASES[slowest.phase]} (rank {slowest.rank} on {slowest.node})"

    def check(self, beats: dict[int, heartbeat.Beat], now: float | None = None) -> Hang | None:
        now = world.monotonic() if now is None else now
        self._observe(beats, now)
        silent = sorted(r for r, (_seq, t) in self.seen.items() if r in beats and now - t > self.silence_s)
        if silent:
            nodes = tuple(sorted({beats[r].node for r in silent}))
            return Hang(
                "hang",
                f"rank(s) {','.join(map(str, silent))} on {','.join(nodes)} silent for more than "
                f"{self.silence_s:g}s (frozen?)",
                nodes,
            )
        for rank, (phase, since) in sorted(self.phase_since.items()):
            if rank not in beats:
                continue
            stay = now - since
            if phase in heartbeat.STORAGE_PHASES and stay > self.phase_limit_s(phase):
                return Hang(
                    "storage",
                    f"rank {rank} has been in its checkpoint {phase} for {stay:.0f}s, more than "
                    f"{self.phase_limit_s(phase):.0f}s (a storage stall: no node is blamed)",
                )
            if phase == "eval" and stay > self.phase_limit_s(phase):
                return Hang("hang", f"the evaluation has not ended in {stay:.0f}s (rank {rank} on {beats[rank].node})")
        training = bool(beats) and all(b.phase == heartbeat.TRAINING for b in beats.values())
        if training and self.progress is not None and now - self.progress[1] > self.train_limit_s():
            median = self.median_step_s
            pace = f" ({self.factor:g} x the median step of {median:.2f}s)" if median is not None else ""
            return Hang(
                "hang",
                f"no batch trained for more than {self.train_limit_s():.0f}s{pace} after batch "
                f"{self.progress[0]} (a stuck collective?)",
            )
        return None

    def _observe(self, beats: dict[int, heartbeat.Beat], now: float) -> None:
        for rank, beat in beats.items():
            old = self.seen.get(rank)
            if old is None or old[0] != beat.seq:
                self.seen[rank] = (beat.seq, now)
            was = self.phase_since.get(rank)
            if was is None or was[0] != beat.phase:
                if was is not None:
                    self.longest[was[0]] = max(self.longest.get(was[0], 0.0), now - was[1])
                self.phase_since[rank] = (beat.phase, now)
        top = max((b.batch for b in beats.values()), default=-1)
        if top < 0:
            return
        training = all(b.phase == heartbeat.TRAINING for b in beats.values())
        if self.progress is None or self.progress[0] != top:
            if self.progress is not None:
                if self.first_progress is None:
                    self.first_progress = self.progress[1]
                done = top - self.progress[0]
                if done > 0 and training and self.first_progress != self.progress[1]:
                    self.steps.append((now - self.progress[1]) / done)
            self.progress = (top, now)
        elif not training:
            self.progress = (top, now)  # evaluating, saving or past training: no batch is due
