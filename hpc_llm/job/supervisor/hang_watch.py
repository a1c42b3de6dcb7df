"""Telling a hung step from a slow one, from the ranks' heartbeats.

In-job side, on the batch host: the supervisor hands every heartbeat read
(:func:`hpc_llm.job.heartbeat.read_all`) to a :class:`HangWatch`, which names
a rank that stopped beating (frozen), a step that stopped finishing batches
while training (a stuck collective), and the start-up phase a step never got
past. It is judged by the supervisor's own clock (when it last saw a rank's
sequence number or the top batch change), so clocks on different nodes never
need to agree. No I/O: it only looks at what it is given.
"""

from __future__ import annotations

import time

from hpc_llm.job import heartbeat


class HangWatch:
    """Silence and stalls, judged by the supervisor's own clock."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.seen: dict[int, tuple[int, float]] = {}  # rank -> (seq, when it last changed)
        self.progress: tuple[int, float] | None = None  # (max batch, when it last changed)
        self.first_progress: float | None = None

    def startup_stuck(
        self, beats: dict[int, heartbeat.Beat], elapsed: float, ntasks: int, timeout_s: float | None
    ) -> str | None:
        """The phase a step is stuck in when not every rank trains ``timeout_s`` after its start:
        no heartbeat from some rank (srun or the container), or the least advanced rank's phase
        (imports, set-up, data, build: model and rendezvous)."""
        if timeout_s is None or elapsed <= timeout_s or self.progress is not None:
            return None
        if len(beats) < ntasks:
            return f"the container or srun ({ntasks - len(beats)} of {ntasks} ranks never started)"
        waiting = [b for b in beats.values() if b.phase in heartbeat.STARTUP_PHASES]
        if not waiting:
            return None
        slowest = min(waiting, key=lambda b: list(heartbeat.STARTUP_PHASES).index(b.phase))
        return f"{heartbeat.STARTUP_PHASES[slowest.phase]} (rank {slowest.rank} on {slowest.node})"

    @property
    def top_batch(self) -> int:
        return self.progress[0] if self.progress else -1

    @property
    def train_s(self) -> float:
        if self.progress is None or self.first_progress is None:
            return 0.0
        return self.progress[1] - self.first_progress

    def check(self, beats: dict[int, heartbeat.Beat], elapsed: float) -> tuple[str, tuple[str, ...]] | None:
        now = time.monotonic()
        for rank, beat in beats.items():
            old = self.seen.get(rank)
            if old is None or old[0] != beat.seq:
                self.seen[rank] = (beat.seq, now)
        silent = sorted(r for r, (_seq, t) in self.seen.items() if now - t > self.timeout_s)
        if silent:
            nodes = tuple(sorted({beats[r].node for r in silent if r in beats}))
            return (
                f"rank(s) {','.join(map(str, silent))} on {','.join(nodes)} silent for more than "
                f"{self.timeout_s:g}s (frozen?)",
                nodes,
            )
        top = max((b.batch for b in beats.values()), default=-1)
        training = bool(beats) and all(b.phase == heartbeat.TRAINING for b in beats.values())
        if top >= 0:
            if self.progress is None or self.progress[0] != top:
                if self.progress is not None and self.first_progress is None:
                    self.first_progress = self.progress[1]
                self.progress = (top, now)
            elif not training:
                self.progress = (top, now)  # evaluating or past training: no batch is due
            elif now - self.progress[1] > self.timeout_s:
                return (
                    f"no batch trained for more than {self.timeout_s:g}s after batch {top} (a stuck collective?)",
                    (),
                )
        return None
