"""The fault policy: what one stop of a training step means, as a pure function.

:func:`decide` takes the run's attempts so far, the facts of this stop and the
policy settings (``fault.*``) and returns a :class:`Decision`: the cause, the
action (done, restart in the allocation, requeue, let Slurm requeue, fail), the
nodes blamed and the nodes to leave out of the next allocation. It reads no
file, asks no Slurm and looks at no clock: the supervisor
(:mod:`hpc_llm.job.supervisor`) gathers the facts and carries the decision out,
and ``benchmarks/long_run.py`` drives the same function through a simulated
two months. docs/design.md, "The decision table", lists its rows;
tests/test_policy.py has one test row per row.

Rules a run of weeks needs:

* **Budgets count failures in a row without checkpoint progress**, not over the
  run's life: a new checkpoint resets the count. A rate cap (failures in any 24 h
  of wall clock) and a governor (attempts in a row without a new checkpoint,
  whatever their cause) end a run that cannot make progress.
* **A stop in progress when the time limit or a preemption's grace time ends is
  that stop**, never a failure, and blames nobody.
* **Blame lands where the fault is**: the node of the rank that failed first
  (its own report, or srun's first line that is not a bystander's
  ``Terminated``), and expires after ``forgive_after_s`` without a new failure
  there.
* **Where an error repeats decides whose it is**: the same error at the same
  batch on another node is the user's (data, code); on the same node at another
  batch it is the node's, which is then left out. A first ambiguous occurrence
  restarts once. Transient storage errors are retried in place, blaming nobody.
* **A dead node is a node failure, never a hang**: a node whose agent fell silent
  and did not answer a probe is the cause of the stop, whatever its peers
  reported after it went (they lost a peer); it alone is blamed and left out.
* **A storage stall blames nobody**: a checkpoint save or upload that stalls is
  retried in place like a transient storage error.
* **A spare takes a left-out node's place in the same job**: when the nodes this
  stop leaves out (a dead node, a node's second blame point) can all be replaced
  by warm spares of the allocation (``resources.spare_nodes``), the action is
  ``swap``: a restart in this allocation without them, no requeue. Without
  enough spares it is a requeue with them excluded, by hpc_llm (Slurm does not
  requeue a ``--no-kill`` job on a node's death).
* **A drain is a swap, not a stop**: a node an operator drains (planned
  maintenance) while the run trains on it, with a warm spare to take its place,
  is saved from and left out in the same job: no blame, no budget, no requeue.
  A drain stop the ranks could not save from is judged as any other stop.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from hpc_llm.job.failures import INFRA_PATTERNS, RankFailure, TaskError
from hpc_llm.rundir.record import Attempt

#: causes that are a failure of the machine (counted by fault.max_failures and the rate cap)
FAILURE_CAUSES = frozenset({"failure", "transient", "hang", "node_failure", "lost", "watchdog", "preflight", "startup"})
#: the first wait before retrying a transient storage error in place, doubled each time in a row
TRANSIENT_BACKOFF_S = 30.0
TRANSIENT_BACKOFF_MAX_S = 900.0
#: causes of a stop the run asked for or Slurm imposed: not failures
STOP_CAUSES = frozenset({"time_limit", "preemption", "signal"})
#: a stop the supervisor asked for itself: a node of the generation is being drained
DRAIN = "drain"
DAY_S = 86400.0
#: causes whose blamed nodes are left out at once (Slurm or a health check said the node is bad)
AT_ONCE = frozenset({"node_failure", "preflight"})

#: errors of the code or the data although they name CUDA (a device-side assert, an illegal
#: access at a given batch): ambiguous on first sight, decided by where they repeat
AMBIGUOUS = re.compile(r"device-side assert|illegal memory access|CUDA out of memory|OutOfMemoryError")
#: errors only a faulty GPU or node raises: the node's, even at a batch where another node had
#: the same (a restart replays the batches since the last checkpoint; at 2,048 nodes two faulty
#: GPUs at one batch happen: benchmarks/long_run.py failed 15 % of its runs as a user error)
HARDWARE = re.compile(r"uncorrectable ECC|ECC error|\bXid\b|fallen off the bus", re.I)
#: object-store and network hiccups worth retrying in place (botocore's and requests' words)
TRANSIENT = re.compile(
    r"SlowDown|Service ?Unavailable|\b503\b|\b500\b|InternalError|RequestTimeout|ReadTimeoutError|"
    r"EndpointConnectionError|ConnectTimeoutError|Connection was closed before we received a valid response"
)


@dataclass(frozen=True)
class Settings:
    """``fault.*`` as the policy reads them."""

    #: nodes the run needs (an exclusion never leaves fewer; the supervisor checks the partition)
    nodes: int = 1
    recover: bool = True
    restart_in_place: bool = True
    #: failures in a row without a new checkpoint
    max_failures: int = 5
    #: failures in any 24 h of wall clock (None: no cap)
    max_failures_per_day: float | None = 24.0
    #: attempts in a row without a new checkpoint, whatever their cause
    max_attempts_without_progress: int = 10
    #: preemptions over the run's life (None: no limit)
    max_preemptions: int | None = None
    #: time-limit requeues over the run's life (None: no limit)
    max_timeouts: int | None = None
    #: a node's blame expires after this long without a new failure on it
    forgive_after_s: float = DAY_S
    #: a SIGTERM this close to the end time is the time limit
    term_at_end_s: float = 5.0


@dataclass(frozen=True)
class Stop:
    """The facts of one stop of the training step, gathered by the supervisor."""

    returncode: int
    now: float
    #: why the supervisor forwarded a stop signal to the ranks (time_limit | preemption | signal)
    stop_cause: str | None = None
    #: when the batch step got SIGTERM (Slurm ending the allocation), if it did
    sigterm_at: float | None = None
    #: the job's end time, read again when the stop was decided (``scontrol update TimeLimit`` moves it)
    end_time: float | None = None
    #: a preemption's grace time is running (scontrol's PreemptTime)
    preempting: bool = False
    #: Slurm itself is requeueing the job (its JobState, e.g. NODE_FAIL): the allocation ends
    slurm_requeueing: str | None = None
    #: a hang the supervisor named: (reason, nodes of the silent ranks)
    hang: tuple[str, tuple[str, ...]] | None = None
    #: a checkpoint save or upload that stalled (the supervisor's reason): the store's, not a node's
    storage_stall: str | None = None
    #: the supervisor itself stalled (its host frozen) past the agents' patience: they ended
    self_stall: str | None = None
    #: nodes whose agent was confirmed dead (silent, then its probe unanswered), with why
    dead_nodes: tuple[tuple[str, str], ...] = ()
    #: agents that ended of their own error (a bug, not the node), with why
    agent_errors: tuple[tuple[str, str], ...] = ()
    #: the start-up phase (imports, container, rendezvous, data) that outlived fault.startup_timeout_s
    startup: str | None = None
    failures: tuple[RankFailure, ...] = ()
    task_errors: tuple[TaskError, ...] = ()
    failed_nodes: tuple[str, ...] = ()
    on_slurm: bool = True
    #: warm agents of this allocation outside the generation's layout (resources.spare_nodes):
    #: the nodes a swap may put in the place of the nodes it leaves out
    spares: tuple[str, ...] = ()
    #: nodes of the generation Slurm shows draining (stop_cause "drain": the supervisor stopped for them)
    draining: tuple[str, ...] = ()


@dataclass(frozen=True)
class Decision:
    #: done | restart | swap | requeue | fail | slurm_requeues
    action: str
    cause: str
    reason: str
    #: the attempt's state to record (completed | stopped | failed | running)
    state: str
    #: nodes blamed for this stop
    suspects: tuple[str, ...] = ()
    #: nodes hpc_llm leaves out of the next allocation (blame still in force), sorted
    exclude: tuple[str, ...] = ()
    #: other things to record on the run (a budget's reason, a warning)
    notes: tuple[str, ...] = field(default_factory=tuple)
    #: seconds to wait before a restart in place (backoff after transient storage errors)
    delay_s: float = 0.0
    #: on a swap: the nodes of this generation left out, each replaced by a spare (sorted)
    swap_out: tuple[str, ...] = ()


# -- history --------------------------------------------------------------------


def _since_reset(history: Sequence[Attempt]) -> list[Attempt]:
    """Attempts after the last one that ended the run: resubmitting a failed run continues it
    with its history kept and its counts reset on purpose."""
    for i in range(len(history) - 1, -1, -1):
        if history[i].action == "fail":
            return list(history[i + 1 :])
    return list(history)


def checkpoint_of(a: Attempt) -> int:
    """The newest checkpoint an attempt left (its resume point when it saved nothing)."""
    saved = [b for b in (a.checkpoint_batch, a.stopped_at_batch if a.state == "stopped" else None) if b is not None]
    return max([a.resumed_at_batch, *saved])


def progressed(a: Attempt, before: Sequence[Attempt]) -> bool:
    best = max((checkpoint_of(x) for x in before), default=0)
    return checkpoint_of(a) > max(best, a.resumed_at_batch)


def _streaks(history: Sequence[Attempt], current: Attempt, current_is_failure: bool) -> tuple[int, int]:
    """(failures in a row without progress, attempts in a row without progress), this one included."""
    items = [*_since_reset(history), current]
    failures = attempts = 0
    for i in range(len(items) - 1, -1, -1):
        a = items[i]
        if progressed(a, items[:i]):
            break
        attempts += 1
        is_failure = current_is_failure if a is current else (a.cause in FAILURE_CAUSES)
        failures += int(is_failure)
    return failures, attempts


def _count(history: Sequence[Attempt], causes: frozenset[str]) -> int:
    return sum(1 for a in history if a.cause in causes)


# -- blame --------------------------------------------------------------------------


def first_failure(stop: Stop) -> RankFailure | None:
    return min(stop.failures, key=lambda f: (f.time, f.rank)) if stop.failures else None


def blamed_node(stop: Stop) -> str | None:
    """The node where the step failed first: the earliest rank failure report, else srun's first
    task line that is not a bystander ``Terminated`` by --kill-on-bad-exit."""
    first = first_failure(stop)
    if first is not None:
        return first.node
    own = [t for t in stop.task_errors if t.what.strip() != "Terminated"]
    return own[0].node if own else None


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


def excluded_by_history(history: Sequence[Attempt], now: float, s: Settings) -> set[str]:
    """Nodes left out of the next allocation: two blame points or more, while they last."""
    return {n for n, points in active_blame(history, now, s.forgive_after_s).items() if points >= 2}


# -- classification -----------------------------------------------------------------


def _key(f: RankFailure) -> tuple[str, str]:
    return (f.type, re.sub(r"\d+", "N", f.message)[:200])


def classify_failure(stop: Stop, current: Attempt, earlier: Sequence[RankFailure]) -> tuple[str, str, str | None]:
    """(cause, reason, node to blame) of a step that failed without a stop signal or a hang."""
    if stop.failed_nodes:
        nodes = ", ".join(sorted(set(stop.failed_nodes)))
        return "node_failure", f"Slurm reported node failure on {nodes}", sorted(set(stop.failed_nodes))[0]
    killed = [t for t in stop.task_errors if t.killed_by_signal and t.what.strip() != "Terminated"]
    if killed:
        # a rank killed by a signal (the OOM killer, a GPU off the bus) writes no report; the
        # reports of its peers ("Connection closed by peer") are consequences
        t = killed[0]
        return "failure", f"task {t.tasks} on {t.node}: {t.what}", t.node
    first = first_failure(stop)
    if first is None:
        node = blamed_node(stop)
        killed = [t for t in stop.task_errors if t.node == node] or list(stop.task_errors)
        what = f"task {killed[0].tasks} on {killed[0].node}: {killed[0].what}" if killed else None
        return "failure", what or "the training step ended abnormally and no rank said why", node
    text = f"{first.type}: {first.message}"
    what = f"{text} (rank {first.rank} on {first.node}"
    same = [e for e in earlier if _key(e) == _key(first)]
    if TRANSIENT.search(text):
        return "transient", f"{what}, during batch {first.batch + 1}; a transient storage error, retrying)", None
    if not HARDWARE.search(text) and any(e.batch == first.batch and e.node != first.node for e in same):
        return (
            "user_error",
            f"{what}, during batch {first.batch + 1} again, now on another node: the code or data)",
            None,
        )
    infra = bool(INFRA_PATTERNS.search(text)) and not AMBIGUOUS.search(text)
    if any(e.node == first.node and e.batch != first.batch for e in same) or (
        infra and any(e.node == first.node for e in earlier)
    ):
        return "failure", f"{what}, again on this node at another batch: the node)", first.node
    if infra:
        return "failure", f"{what}, during batch {first.batch + 1})", first.node
    if first.batch <= current.resumed_at_batch and not AMBIGUOUS.search(text):
        return "user_error", f"{what}, before the first batch of the attempt)", None
    if any(e.batch == first.batch for e in same):
        return "user_error", f"{what}, during batch {first.batch + 1} again)", None
    return "failure", f"{what}, during batch {first.batch + 1}; retrying once)", first.node


# -- the decision ----------------------------------------------------------------------


def decide(
    history: Sequence[Attempt],
    current: Attempt,
    stop: Stop,
    s: Settings,
    earlier_failures: Sequence[RankFailure] = (),
) -> Decision:
    """What this stop means and what to do. ``history``: the run's attempts before this one;
    ``current``: this attempt as rank 0 left it; ``earlier_failures``: rank failure reports of
    earlier attempts (where an error repeats decides whose it is)."""
    if current.state == "completed":
        # rank 0 records completed after the post-train stage's barrier: every rank's work is
        # done, and a signal or kill while the processes exit (a time limit, a preemption that
        # lands then) changes nothing of it (seen on the dev cluster: a completed run requeued)
        notes = () if stop.returncode == 0 else (f"the step exited with {stop.returncode} after the run completed",)
        return Decision("done", "completed", "training and the post-train stage finished", "completed", notes=notes)
    if not s.recover:
        first = stop.task_errors[0] if stop.task_errors else None
        last_words = f"srun: error: {first.node}: task {first.tasks}: {first.what}" if first else None
        reason = current.error or last_words or f"the training step exited with {stop.returncode}"
        return Decision("fail", current.cause or "failure", reason, _ended(current))

    if stop.stop_cause == DRAIN and current.state == "stopped" and stop.draining:
        drained = tuple(sorted(stop.draining))
        takers = stop.spares[: len(drained)]
        what = f"{', '.join(drained)} {'is' if len(drained) == 1 else 'are'} being drained (planned maintenance)"
        if len(takers) == len(drained):
            reason = f"{what}: the step saved; leaving {', '.join(drained)} out for spare(s) {', '.join(takers)}"
            return Decision("swap", DRAIN, reason, "stopped", swap_out=drained)
        # the spares went between the stop and now: resume here, the drain waits for the job
        return Decision("restart", DRAIN, f"{what}, with no spare left: the step saved; resuming here", "stopped")

    stopped = _imposed_stop(current, stop, s)
    if stopped is not None:
        return _requeue_stop(history, current, stop, s, *stopped)

    if current.state == "failed" and current.cause in ("user_error", "preflight_failed"):
        return Decision("fail", current.cause, current.error or "the run failed", "failed")

    nodes: tuple[str, ...]
    if stop.self_stall is not None:
        # the agents ended because the supervisor went quiet, not because their nodes died: every
        # node would look dead; none is to blame. Restarted with new agents, in this allocation
        cause, reason, nodes = "hang", f"{stop.self_stall}: its agents gave up on it; nobody blamed", ()
    elif stop.dead_nodes:
        # whatever the other ranks reported after it went, they lost a peer: the node is the cause
        dead = ", ".join(f"{n} ({why})" for n, why in stop.dead_nodes)
        cause, reason, nodes = (
            "node_failure",
            f"node(s) stopped answering: {dead}",
            tuple(n for n, _ in stop.dead_nodes),
        )
    elif stop.agent_errors:
        what = "; ".join(f"on {n}: {why}" for n, why in stop.agent_errors)
        cause, reason, nodes = "failure", f"hpc_llm's agent ended with an error ({what}); restarting it", ()
    elif stop.storage_stall is not None:
        cause, reason, nodes = "transient", f"{stop.storage_stall}; retrying", ()
    elif stop.hang is not None:
        cause, reason, nodes = "hang", stop.hang[0], tuple(stop.hang[1])
    elif stop.startup is not None:
        cause, reason, nodes = "startup", f"no heartbeat from every rank in time: stuck in {stop.startup}", ()
    elif current.state == "failed" and current.cause == "preflight":
        cause, reason, nodes = "preflight", current.error or "a preflight check failed", tuple(current.suspects)
    else:
        cause, reason, node = classify_failure(stop, current, earlier_failures)
        nodes = (node,) if node else ()
    if cause == "user_error":
        return Decision("fail", "user_error", reason, "failed")
    if cause == "transient":
        d = _budgeted(history, current, stop, s, "transient", reason, suspects=(), exclude=None, restart=True)
        in_a_row = 0
        for a in reversed(_since_reset(history)):
            if a.cause != "transient":
                break
            in_a_row += 1
        return replace(d, delay_s=min(TRANSIENT_BACKOFF_MAX_S, TRANSIENT_BACKOFF_S * 2**in_a_row))
    suspects = tuple(sorted(set(nodes)))
    exclude = excluded_by_history([*history, _with(current, cause, suspects, stop.now)], stop.now, s)
    out = tuple(sorted(set(suspects) & exclude))
    restart = s.restart_in_place and not out and cause != "startup"
    usable = [n for n in stop.spares if n not in exclude]
    if s.restart_in_place and out and len(usable) >= len(out):
        # every node this stop leaves out has a warm spare to take its place: same job, no queue
        reason = f"{reason}; leaving out {', '.join(out)} for spare(s) {', '.join(usable[: len(out)])}"
        d = _budgeted(history, current, stop, s, cause, reason, suspects=suspects, exclude=exclude, restart=True)
        return replace(d, action="swap", swap_out=out) if d.action == "restart" else d
    return _budgeted(history, current, stop, s, cause, reason, suspects=suspects, exclude=exclude, restart=restart)


def _imposed_stop(current: Attempt, stop: Stop, s: Settings) -> tuple[str, str] | None:
    """(cause, reason) when this stop is a time limit, a preemption or a requested stop, whatever
    state the step was in (a save in progress, the post-train stage, start-up); else None."""
    if stop.slurm_requeueing:
        return "slurm", f"Slurm is requeueing the job ({stop.slurm_requeueing})"
    at_end = (
        stop.sigterm_at is not None and stop.end_time is not None and stop.sigterm_at >= stop.end_time - s.term_at_end_s
    )
    if stop.stop_cause in STOP_CAUSES:
        what = {"time_limit": "the time limit", "preemption": "a preemption", "signal": "a requested stop"}
        how = "saved" if current.state == "stopped" else "stopped before its save finished"
        return stop.stop_cause, f"{what[stop.stop_cause]}: the step {how}; resuming from the last checkpoint"
    if current.state == "stopped" and stop.returncode == 0:
        # rank 0 stopped and saved on a request of its own (the throughput watchdog) or a signal
        # that reached the ranks without the supervisor (scancel --signal without --batch)
        cause = current.cause or "preemption"
        return cause, current.error or f"{cause}: the step saved; resuming from the last checkpoint"
    if stop.preempting and stop.returncode != 0:
        return "preemption", (
            "preempted after Slurm's warning signal was spent (or past the grace time): the steps got SIGTERM "
            "before the ranks saved; resuming from the last checkpoint"
        )
    if at_end:
        return "time_limit", "the time limit ended the step before the ranks saved; resuming from the last checkpoint"
    if stop.sigterm_at is not None and not at_end:
        return "cancelled", "the job was cancelled or killed by Slurm (SIGTERM)"
    return None


def _requeue_stop(
    history: Sequence[Attempt], current: Attempt, stop: Stop, s: Settings, cause: str, reason: str
) -> Decision:
    state = "stopped" if current.state == "stopped" else _ended(current)
    if cause == "slurm":
        # Slurm ends this allocation and requeues the job itself: the next start closes the attempt
        return Decision("slurm_requeues", "lost", reason, "running")
    if cause == "cancelled":
        return Decision("fail", "cancelled", reason, state)
    exclude = excluded_by_history(history, stop.now, s)
    return _budgeted(history, current, stop, s, cause, reason, suspects=(), exclude=exclude, restart=False, state=state)


def _budgeted(
    history: Sequence[Attempt],
    current: Attempt,
    stop: Stop,
    s: Settings,
    cause: str,
    reason: str,
    *,
    suspects: tuple[str, ...],
    exclude: set[str] | None,
    restart: bool,
    state: str | None = None,
) -> Decision:
    state = state or _ended(current)
    excl = tuple(sorted(exclude or ()))
    over = _over_budget(history, current, stop, s, cause)
    if over:
        return Decision("fail", cause, f"{over}; last stop: {reason}", state, suspects, excl, (over,))
    if restart:
        return Decision("restart", cause, reason, state, suspects, excl)
    if not stop.on_slurm:
        return Decision("fail", cause, f"{reason}; not running under Slurm, so not requeued", state, suspects, excl)
    return Decision("requeue", cause, reason, state, suspects, excl)


def _over_budget(history: Sequence[Attempt], current: Attempt, stop: Stop, s: Settings, cause: str) -> str | None:
    failure = cause in FAILURE_CAUSES
    in_a_row, without_progress = _streaks(history, current, failure)
    if failure and in_a_row > s.max_failures:
        return f"fault.max_failures={s.max_failures} reached: {in_a_row} failures in a row without a new checkpoint"
    if without_progress >= s.max_attempts_without_progress:
        return (
            f"fault.max_attempts_without_progress={s.max_attempts_without_progress} reached: "
            f"no new checkpoint in {without_progress} attempts"
        )
    if failure and s.max_failures_per_day is not None:
        day = 1 + sum(
            1
            for a in _since_reset(history)
            if a.cause in FAILURE_CAUSES and stop.now - (a.ended_at or a.started_at) < DAY_S
        )
        if day > s.max_failures_per_day:
            return f"fault.max_failures_per_day={s.max_failures_per_day:g} reached: {day} failures in 24 h"
    if cause in ("preemption", "signal") and s.max_preemptions is not None:
        n = _count(_since_reset(history), frozenset({"preemption", "signal"})) + 1
        if n > s.max_preemptions:
            return f"fault.max_preemptions={s.max_preemptions} reached"
    if cause == "time_limit" and s.max_timeouts is not None:
        n = _count(_since_reset(history), frozenset({"time_limit"})) + 1
        if n > s.max_timeouts:
            return f"fault.max_timeouts={s.max_timeouts} reached"
    return None


def _ended(a: Attempt) -> str:
    return "failed" if a.state == "running" else a.state


def _with(a: Attempt, cause: str, suspects: tuple[str, ...], now: float) -> Attempt:
    """``a`` as it will be recorded (for counting blame with this stop included)."""
    return replace(a, cause=cause, suspects=list(suspects), ended_at=a.ended_at or now)


def lost_cause(slurm_state: str | None) -> str:
    """The cause of an attempt whose allocation ended without a record, from sacct's state:
    a preempted attempt stays a preemption, whatever stage it died in."""
    if slurm_state == "NODE_FAIL":
        return "node_failure"
    if slurm_state in ("PREEMPTED",):
        return "preemption"
    if slurm_state == "TIMEOUT":
        return "time_limit"
    return "lost"
