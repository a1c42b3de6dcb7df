"""The run's attempts as the fault policy counts them: progress, streaks and blame. Pure.

Budgets count failures in a row without checkpoint progress (a new checkpoint resets them),
and resubmitting a failed run continues its history with the counts reset (:func:`since_reset`).
Blame is points per node (:func:`active_blame`): one for a failure there, two for a node
failure or a failed health check; a single point expires after ``forgive_after_s`` clean, two or
more leave the node out (:func:`excluded_by_history`) for ``forgive_after_s`` x 2^(points - 2).
"""

from __future__ import annotations

from collections.abc import Sequence

from hpc_llm.rundir.outcome import FAILURE_CAUSES, Action, Cause, State
from hpc_llm.rundir.record import Attempt

#: causes whose blamed nodes are left out at once (Slurm or a health check said the node is bad)
AT_ONCE = frozenset({Cause.NODE_FAILURE, Cause.PREFLIGHT})


def since_reset(history: Sequence[Attempt]) -> list[Attempt]:
    """Attempts after the last one that ended the run: resubmitting a failed run continues it
    with its history kept and its counts reset on purpose."""
    for i in range(len(history) - 1, -1, -1):
        if history[i].action == Action.FAIL:
            return list(history[i + 1 :])
    return list(history)


def checkpoint_of(a: Attempt) -> int:
    """The newest checkpoint an attempt left (its resume point when it saved nothing)."""
    saved = [b for b in (a.checkpoint_batch, a.stopped_at_batch if a.state == State.STOPPED else None) if b is not None]
    return max([a.resumed_at_batch, *saved])


def progressed(a: Attempt, before: Sequence[Attempt]) -> bool:
    best = max((checkpoint_of(x) for x in before), default=0)
    return checkpoint_of(a) > max(best, a.resumed_at_batch)


def streaks(history: Sequence[Attempt], current: Attempt, current_is_failure: bool) -> tuple[int, int]:
    """(failures in a row without progress, attempts in a row without progress), this one included."""
    items = [*since_reset(history), current]
    failures = attempts = 0
    for i in range(len(items) - 1, -1, -1):
        a = items[i]
        if progressed(a, items[:i]):
            break
        attempts += 1
        is_failure = current_is_failure if a is current else (a.cause in FAILURE_CAUSES)
        failures += int(is_failure)
    return failures, attempts


def count(history: Sequence[Attempt], causes: frozenset[Cause]) -> int:
    return sum(1 for a in history if a.cause in causes)


# -- blame --------------------------------------------------------------------------


def _blame(history: Sequence[Attempt], forgive_after_s: float) -> dict[str, tuple[int, float, float]]:
    """node -> (points, last blamed, excluded until). A blame is a point; a node failure or a
    failed health check two. A single point expires after ``forgive_after_s`` clean; from two
    points on the node is left out for ``forgive_after_s`` x 2^(points - 2) after its last blame,
    then comes back on probation (its points kept: one more failure leaves it out again, for
    twice as long). A flaky node costs a few failures over a run, a wrongly blamed one a day."""
    events: dict[str, list[tuple[float, int]]] = {}
    for a in history:
        for n in a.suspects:
            events.setdefault(n, []).append((a.ended_at or a.started_at, 2 if a.cause in AT_ONCE else 1))
    out = {}
    for n, evs in events.items():
        points, last, until = 0, 0.0, float("-inf")
        for when, weight in sorted(evs):
            if points == 1 and when - last > forgive_after_s:
                points = 0
            points, last = points + weight, when
            if points >= 2:
                until = when + forgive_after_s * 2 ** (points - 2)
        out[n] = (points, last, until)
    return out


def active_blame(history: Sequence[Attempt], now: float, forgive_after_s: float) -> dict[str, int]:
    """node -> its blame points still in force at ``now`` (a suspect, or a node left out)."""
    out = {}
    for n, (points, last, until) in _blame(history, forgive_after_s).items():
        if (points == 1 and now - last <= forgive_after_s) or (points >= 2 and now <= until):
            out[n] = points
    return out


def slow_nodes(history: Sequence[Attempt], now: float, forgive_after_s: float) -> set[str]:
    """Nodes a straggler verdict leaves out of the allocations to come (its action ``exclude``),
    for ``forgive_after_s`` after the verdict."""
    return {
        str(v["node"])
        for a in history
        for v in a.stragglers
        if v.get("action") == "exclude" and now - float(v.get("at") or 0.0) <= forgive_after_s
    }


def excluded_by_history(history: Sequence[Attempt], now: float, forgive_after_s: float) -> set[str]:
    """Nodes left out of the next allocation: two blame points or more, while they last."""
    return {n for n, points in active_blame(history, now, forgive_after_s).items() if points >= 2}
