"""When the supervisor passes Slurm's stop signal on, and what it books it as: StopTiming with a
simulated clock and a scripted slurmctld, no process (the end-to-end paths are in
tests/test_fault_logic.py and tests/test_faults.py)."""

from __future__ import annotations

import pytest

from hpc_llm.job.supervisor import timing
from hpc_llm.job.supervisor.timing import StopTiming
from hpc_llm.rundir.outcome import Cause

T0 = 1_800_000_000.0


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


class Slurmctld:
    """``scontrol show job`` as the supervisor asks it: each call answers the next of ``answers``
    (the last one again once they run out); {} is no answer."""

    def __init__(self, *answers: dict[str, str]) -> None:
        self.answers = list(answers)
        self.asked: list[float] = []

    def __call__(self, clock: Clock) -> dict[str, str]:
        self.asked.append(clock.now)
        return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]


def stop_timing(clock: Clock, slurm: Slurmctld | None, end_in_s: float | None, lead_s=30.0, signal_lead_s=120.0):
    ask = (lambda: slurm(clock)) if slurm is not None else None
    end = T0 + end_in_s if end_in_s is not None else None
    return StopTiming(end=end, lead_s=lead_s, signal_lead_s=signal_lead_s, ask=ask, clock=clock)


def test_a_preemption_is_passed_on_at_once_and_asked_about_only_after():
    clock, slurm = Clock(), Slurmctld({"PreemptTime": str(int(T0)), "EndTime": str(int(T0 + 3600))})
    t = stop_timing(clock, slurm, end_in_s=3600)
    t.received("SIGUSR2", clock.now)
    t.tick(forwarded=False)
    assert t.due() and t.pending.cause == Cause.PREEMPTION and not t.pending.asked
    assert slurm.asked == []  # far from the end: nothing held it back, nobody asked
    t.tick(forwarded=True)  # the ranks have it: now ask why it came
    assert t.pending.cause == Cause.PREEMPTION and t.pending.asked and slurm.asked == [T0]


def test_the_time_limit_signal_is_held_back_until_only_the_runs_own_lead_is_left():
    """Slurm's --signal lead is 120 s, this run needs 30 s: pass it on 30 s before the end."""
    clock, slurm = Clock(), Slurmctld({"EndTime": str(int(T0 + 120))})
    t = stop_timing(clock, slurm, end_in_s=120)
    t.received("SIGUSR2", clock.now)
    t.tick(forwarded=False)
    assert t.pending.cause == Cause.TIME_LIMIT and t.pending.asked  # asked at once, to hold it back
    assert not t.due()
    clock.now = T0 + 89
    assert not t.due()
    clock.now = T0 + 90
    assert t.due()


def test_a_slurmctld_that_does_not_answer_is_asked_again_later_and_the_signal_is_not_held():
    """A time-limit guess that Slurm cannot confirm is passed on at once (a preemption held past
    its grace time is killed unsaved), and slurmctld is asked every ASK_AGAIN_S, not every turn."""
    clock, slurm = Clock(), Slurmctld({}, {}, {"EndTime": str(int(T0 + 100))})
    t = stop_timing(clock, slurm, end_in_s=100)
    t.received("SIGUSR2", clock.now)
    t.tick(forwarded=False)
    assert t.due() and t.pending.cause == Cause.TIME_LIMIT and not t.pending.asked
    for _ in range(20):
        clock.now += 0.2
        t.tick(forwarded=True)
    assert slurm.asked == [T0]  # not again within ASK_AGAIN_S
    clock.now = T0 + timing.ASK_AGAIN_S + 0.1
    t.tick(forwarded=True)
    clock.now += timing.ASK_AGAIN_S + 0.1
    t.tick(forwarded=True)
    assert len(slurm.asked) == 3 and t.pending.asked and t.pending.cause == Cause.TIME_LIMIT


def test_a_signal_far_from_the_end_without_a_preemption_was_sent_by_hand():
    clock, slurm = Clock(), Slurmctld({"EndTime": str(int(T0 + 3600))})
    t = stop_timing(clock, slurm, end_in_s=3600)
    t.received("SIGUSR2", clock.now)
    t.tick(forwarded=True)
    assert t.pending.cause == Cause.SIGNAL


def test_a_shortened_time_limit_is_read_again_and_moves_when_to_pass_the_signal_on():
    """`scontrol update TimeLimit=` mid-run: the end is read again every END_REFRESH_S."""
    clock = Clock()
    slurm = Slurmctld({"EndTime": str(int(T0 + 3600))})
    t = stop_timing(clock, slurm, end_in_s=3600)
    assert not t.time_is_up()
    slurm.answers = [{"EndTime": str(int(T0 + 200))}]
    clock.now = T0 + timing.END_REFRESH_S
    t.tick(forwarded=False)
    assert t.end == T0 + 200
    clock.now = T0 + 171
    assert t.time_is_up()  # 29 s left, the lead is 30 s: Slurm's signal never came, stop anyway


def test_the_lead_is_reached_only_by_the_end_slurm_shows_now():
    clock, slurm = Clock(), Slurmctld({"EndTime": str(int(T0 + 7200))})  # the limit was raised
    t = stop_timing(clock, slurm, end_in_s=100)
    clock.now = T0 + 80
    assert not t.time_is_up() and t.end == T0 + 7200


def test_the_supervisors_own_stop_is_passed_on_at_once_and_needs_no_asking():
    clock, slurm = Clock(), Slurmctld({})
    t = stop_timing(clock, slurm, end_in_s=3600)
    t.requested("SIGUSR2", Cause.DRAIN)
    t.tick(forwarded=True)
    assert t.due() and t.pending.cause == Cause.DRAIN and t.pending.asked and slurm.asked == []


@pytest.mark.parametrize(
    ("at_s", "guess", "booked"),
    [(3600 - 150, Cause.TIME_LIMIT, Cause.TIME_LIMIT), (100, Cause.PREEMPTION, Cause.SIGNAL)],
)
def test_off_slurm_the_cause_comes_from_the_end_time_known(at_s, guess, booked):
    """No slurmctld to ask (a local run): near the end it is the time limit; far from it nobody
    preempts, so once passed on it is booked as sent by hand."""
    clock = Clock()
    t = stop_timing(clock, None, end_in_s=3600)
    clock.now = T0 + at_s
    t.received("SIGUSR2", clock.now)
    assert t.pending.cause == guess and t.due() == (guess == Cause.PREEMPTION or t.end - clock.now <= t.lead_s)
    t.tick(forwarded=True)
    assert t.pending.cause == booked and t.pending.asked
