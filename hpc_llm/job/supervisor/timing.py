"""When to pass Slurm's stop signal on to the ranks, and why it came: a small object with a clock.

Slurm sends the batch step its ``--signal`` (B:USR2) before the time limit and at a
preemption, and it is the supervisor's to pass on. :class:`StopTiming` holds the signal that
is pending and decides:

* **why** it came: a guess at once from the end time it knows (near the end: the time limit;
  otherwise a preemption), then Slurm's answer (``scontrol show job``: a PreemptTime while a
  preemption's grace time runs; an EndTime near the signal: the time limit; neither: someone
  sent it by hand). A slurmctld that does not answer is asked again every
  :data:`ASK_AGAIN_S`, never taken for "by hand";
* **when** to pass it on: a preemption at once (its grace time runs); the time-limit signal
  once only the lead this run needs is left (Slurm's lead may be longer). Act first, ask after:
  far from the end time the signal goes to the ranks before slurmctld is asked, so a slow one
  cannot hold a preemption past its grace time;
* **the end time**, read again every :data:`END_REFRESH_S` (``scontrol update TimeLimit``
  moves it) and when only the lead is left: if Slurm's time-limit signal never came by then
  (seen with 1-minute limits), the supervisor stops the ranks itself (:meth:`time_is_up`).

No process, no thread: the clock and Slurm's answers are injected, so tests/test_fault_logic.py
drives it through a simulated hour. Stdlib only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from hpc_llm import world
from hpc_llm.rundir.outcome import Cause
from hpc_llm.slurm.allocation import preempting
from hpc_llm.slurm.parse import slurm_time

#: a signal this close to the time limit (beyond the lead) is the time-limit one (Slurm may send
#: it up to a minute early, sbatch(1))
TIME_LIMIT_SLACK_S = 60.0
#: seconds between tries to learn from slurmctld why a stop signal came, while it does not answer
ASK_AGAIN_S = 10.0
#: seconds between re-reads of the job's end time while a generation runs
END_REFRESH_S = 60.0


@dataclass
class Pending:
    """A stop signal the ranks are to get."""

    signal: str
    #: when it came (epoch seconds)
    at: float
    cause: Cause
    #: the cause is Slurm's answer (or the supervisor's own request), not the guess
    asked: bool
    #: when to pass it on
    forward_at: float
    #: when to ask slurmctld why it came (None: answered)
    ask_at: float | None


class StopTiming:
    """The pending stop signal of one generation and the job's end time.

    ``ask()`` is ``scontrol show job`` of this job ({} when slurmctld did not answer); None off
    Slurm. ``clock`` is the wall clock (epoch seconds)."""

    def __init__(
        self,
        *,
        end: float | None,
        lead_s: float,
        signal_lead_s: float,
        ask: Callable[[], dict[str, str]] | None,
        clock: Callable[[], float] = world.time,
    ) -> None:
        self.end = end
        self.lead_s = lead_s
        self.signal_lead_s = signal_lead_s
        self.ask = ask
        self.clock = clock
        self.pending: Pending | None = None
        self._refreshed = clock()

    # -- a signal comes -------------------------------------------------------------------------
    def received(self, signal: str, at: float) -> None:
        """Slurm's stop signal reached the batch step at ``at``: guessed now, asked about once it
        is passed on (or at once, near the end time, to hold it back until the lead)."""
        cause = self.guess(at)
        self.pending = Pending(signal, at, cause, False, self.forward_time(at, cause), ask_at=self.clock())

    def requested(self, signal: str, cause: Cause) -> None:
        """The supervisor's own stop (a drain to swap, the lead reached without Slurm's signal):
        passed on at once; its cause needs no asking."""
        now = self.clock()
        self.pending = Pending(signal, now, cause, True, now, ask_at=None)

    def guess(self, at: float) -> Cause:
        """Why the signal came, from the end time known, without asking Slurm: near it, the
        time limit; otherwise a preemption (or a signal sent by hand: Slurm says which)."""
        if self.end is not None and at >= self.end - self.signal_lead_s - TIME_LIMIT_SLACK_S:
            return Cause.TIME_LIMIT
        return Cause.PREEMPTION

    def forward_time(self, at: float, cause: Cause) -> float:
        """When to pass a signal of ``cause`` that came at ``at`` on: a preemption at once; the
        time limit once the time left is the lead this run needs."""
        if self.end is None or cause != Cause.TIME_LIMIT:
            return at
        return max(at, self.end - self.lead_s)

    # -- every turn of the supervisor's loop ------------------------------------------------
    def tick(self, forwarded: bool) -> None:
        """Ask slurmctld why the pending signal came, when due; read the end time again every
        :data:`END_REFRESH_S`. ``forwarded``: the ranks have the signal already."""
        p = self.pending
        now = self.clock()
        due = p is not None and p.ask_at is not None and now >= p.ask_at
        if p is not None and due and (forwarded or p.cause == Cause.TIME_LIMIT):
            cause = self.cause_of(p.at)
            if cause is None:
                # slurmctld did not answer (a loaded one can take the whole 10 s timeout): keep the
                # guess and ask again, not every turn. Hold it back only once Slurm says it is the
                # time limit: a preemption held past its grace time is killed unsaved, a time limit
                # passed on early only saves a little sooner (seen under load in the 1-minute test)
                p.ask_at = now + ASK_AGAIN_S
                if not forwarded:
                    p.forward_at = p.at
            else:
                p.ask_at, p.cause, p.asked = None, cause, True
                if not forwarded:
                    p.forward_at = self.forward_time(p.at, cause)
        if self.ask is not None and now - self._refreshed >= END_REFRESH_S:
            # `scontrol update TimeLimit=` moves the end: the stop lead counts from the new one
            self._refreshed = now
            self.end = slurm_time(self.ask().get("EndTime")) or self.end
            if p is not None and not forwarded and p.cause == Cause.TIME_LIMIT:
                p.forward_at = self.forward_time(p.at, Cause.TIME_LIMIT)

    def due(self) -> bool:
        """The pending signal is to be passed on now."""
        return self.pending is not None and self.clock() >= self.pending.forward_at

    def cause_of(self, at: float) -> Cause | None:
        """Why Slurm sent the signal that came at ``at``: while a preemption's grace time runs,
        ``scontrol show job`` has a PreemptTime (verified on 22.05, docs/design/verified/slurm.md);
        otherwise a signal near the end time is the time-limit one, and anything else someone
        sent (``scancel --signal``). None when slurmctld did not answer."""
        info = self.ask() if self.ask is not None else {}
        if self.ask is not None and not info:
            return None
        if preempting(info):
            return Cause.PREEMPTION
        self.end = slurm_time(info.get("EndTime")) or self.end
        if self.end is not None and at >= self.end - self.signal_lead_s - TIME_LIMIT_SLACK_S:
            return Cause.TIME_LIMIT
        return Cause.SIGNAL

    def time_is_up(self) -> bool:
        """Only the stop lead is left and Slurm's time-limit signal never came (seen on the dev
        cluster with 1-minute limits: the attempt ran into its limit unsaved; likely sent by
        slurmctld's 30 s check before the batch step existed). The end time is read again
        first: ``scontrol update TimeLimit`` moves it."""
        if self.end is None or self.clock() < self.end - self.lead_s:
            return False
        if self.ask is not None:
            self.end = slurm_time(self.ask().get("EndTime")) or self.end
        return self.clock() >= self.end - self.lead_s
