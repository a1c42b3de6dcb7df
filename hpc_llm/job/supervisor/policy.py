"""The fault policy: what one stop of a generation of ranks means, as a pure function.

:func:`decide` takes the run's attempts so far, the facts of this stop and the
policy settings (``fault.*``) and returns a :class:`Decision`: the cause, the
action (done, restart in the allocation, requeue, let Slurm requeue, fail), the
nodes blamed and the nodes to leave out of the next allocation. It reads no
file, asks no Slurm and looks at no clock: the supervisor
(:mod:`hpc_llm.job.supervisor`) gathers the facts and carries the decision out,
and ``benchmarks/long_run.py`` drives the same function through a simulated
two months. docs/design/decision-table.md lists its rows; tests/test_policy.py has one test row
per row. Its causes, actions and attempt states are :mod:`hpc_llm.rundir.outcome`'s.

Rules a run of weeks needs:

* **Budgets count failures in a row without checkpoint progress**, not over the
  run's life: a new checkpoint resets the count. A rate cap (failures in any 24 h
  of wall clock) and a governor (attempts in a row without a new checkpoint,
  whatever their cause) end a run that cannot make progress.
* **A stop in progress when the time limit or a preemption's grace time ends is
  that stop**, never a failure, and blames nobody.
* **Blame lands where the fault is**: the node of the rank that failed first
  (its own report, or the first rank to end that the supervisor did not
  kill: not a bystander), and expires after ``forgive_after_s`` without a new failure
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
* **A spare's first collectives are its all-reduce check**: a generation a spare took a place in
  that fails before its first batch blames the spare, not the nodes that trained the generation
  before it (the only thing that changed); again, and the next spare takes its place.
* **Fewer nodes rather than a requeue, where allowed**: without spares for every node this stop
  leaves out, a run with ``resources.min_nodes`` goes on in the same (``--no-kill``) job on the
  nodes left, if they are at least ``min_nodes`` (action ``shrink``); its next requeue asks for
  ``nodes`` again.
* **A slow node is swapped or left out, never blamed for a failure**: a straggler verdict
  (``straggler.action=swap``) stops the ranks to save, and spares take the slow nodes' places in
  the same job; with ``exclude`` (or no spare left) the verdict leaves them out of the
  allocations to come for ``forgive_after_s``.
* **A drain is a swap, not a stop**: a node an operator drains (planned
  maintenance) while the run trains on it, with a warm spare to take its place,
  is saved from and left out in the same job: no blame, no budget, no requeue.
  A drain stop the ranks could not save from is judged as any other stop.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from hpc_llm.job.failures import RankFailure
from hpc_llm.job.supervisor.classify import blamed_node, classify_failure
from hpc_llm.job.supervisor.history import count, excluded_by_history, since_reset, slow_nodes, streaks
from hpc_llm.job.supervisor.stop import DAY_S, Decision, Settings, Stop
from hpc_llm.rundir.outcome import FAILURE_CAUSES, STOP_CAUSES, Action, Cause, State
from hpc_llm.rundir.record import Attempt

#: the first wait before retrying a transient storage error in place, doubled each time in a row
TRANSIENT_BACKOFF_S = 30.0
TRANSIENT_BACKOFF_MAX_S = 900.0
#: the same for a link between the batch host and a node (Slurm finds the node responding)
NETWORK_BACKOFF_S = 10.0
NETWORK_BACKOFF_MAX_S = 300.0
#: the causes retried in place after a backoff: (first wait, longest wait), seconds
BACKOFF_S = {
    Cause.TRANSIENT: (TRANSIENT_BACKOFF_S, TRANSIENT_BACKOFF_MAX_S),
    Cause.NETWORK: (NETWORK_BACKOFF_S, NETWORK_BACKOFF_MAX_S),
}


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
    if current.state == State.COMPLETED:
        # rank 0 records completed after the post-train stage's barrier: every rank's work is
        # done, and a signal or kill while the processes exit (a time limit, a preemption that
        # lands then) changes nothing of it (seen on the dev cluster: a completed run requeued)
        notes = () if stop.returncode == 0 else (f"the ranks exited with {stop.returncode} after the run completed",)
        return Decision(
            Action.DONE, Cause.COMPLETED, "training and the post-train stage finished", State.COMPLETED, notes=notes
        )
    if stop.ctld_lost is not None and current.state != State.STOPPED and not stop.ctld_answered:
        host = stop.batch_host or "the batch host"
        reason = (
            f"{stop.ctld_lost}: {host} may be cut off from it, and Slurm about to call it DOWN and requeue the "
            "job elsewhere; the ranks here stopped, and the supervisor stands down until Slurm decides"
        )
        return Decision(
            Action.STAND_DOWN, Cause.LOST, reason, State.RUNNING, suspects=(host,) if stop.batch_host else ()
        )
    if stop.remote_nodes and not stop.remote_heard and stop.slurmctld_answers is False:
        return _cut_off(stop)
    if not s.recover:
        last_words = str(stop.rank_exits[0]) if stop.rank_exits else None
        reason = current.error or last_words or f"the ranks exited with {stop.returncode}"
        return Decision(Action.FAIL, Cause(current.cause or Cause.FAILURE), reason, _ended(current))

    if stop.stop_cause == Cause.DRAIN and current.state == State.STOPPED and stop.draining:
        return _drained(stop)
    if stop.stop_cause == Cause.STRAGGLER and current.state == State.STOPPED and stop.stragglers:
        return _slow(stop)
    stopped = _imposed_stop(current, stop, s)
    if stopped is not None:
        return _requeue_stop(history, current, stop, s, *stopped)
    if stop.too_few is not None:
        # the nodes were blamed when they were lost; this allocation cannot run the job any more
        reason = f"{stop.too_few}: requeueing for a new allocation"
        exclude = excluded_by_history([*history, current], stop.now, s.forgive_after_s)
        return Decision(Action.REQUEUE, Cause.LOST, reason, _ended(current), exclude=tuple(sorted(exclude)))
    if current.state == State.FAILED and current.cause in (Cause.USER_ERROR, Cause.PREFLIGHT_FAILED):
        return Decision(Action.FAIL, Cause(current.cause), current.error or "the run failed", State.FAILED)
    cause, reason, nodes = what_failed(stop, current, earlier_failures)
    if cause in (Cause.NODE_FAILURE, Cause.NETWORK) and partitioned(stop):
        return _partitioned(history, current, stop, s)
    if cause == Cause.NETWORK:
        if _batch_host_common(history, stop):
            return _partitioned(history, current, stop, s)
        nodes = _unreachable_again(history, current, stop)
        if nodes:
            reason = f"{reason}; the batch host could not reach {', '.join(nodes)} at the stop before either: blamed"
        d = _failed(history, current, stop, s, cause, reason, nodes)
        return replace(d, unreachable=unreachable(stop))
    return _failed(history, current, stop, s, cause, reason, nodes)


def partitioned(stop: Stop) -> bool:
    """The batch host reaches none of two or more other nodes at once (their agents silent, or srun
    could start no agent there), nothing else vouches for its link, and slurmctld answers it and,
    after SlurmdTimeout and a ping of their silence, finds none of them gone: what they share is
    the batch host's own link to them, not a fault each. With one other node nothing points at
    either side: nobody is blamed (:func:`what_failed`, ``network``)."""
    lost = unreachable(stop)
    every = stop.remote_nodes >= 2 and not stop.remote_heard
    return bool(
        stop.batch_host
        and (every or (len(lost) >= 2 and stop.vouched is False))
        and stop.slurmctld_answers
        and stop.slurm_gone == ()
    )


def _partitioned(history: Sequence[Attempt], current: Attempt, stop: Stop, s: Settings) -> Decision:
    """A partition between the batch host and the rest of the job: the batch host is blamed (it
    is one node; blaming the others would leave out all of them, a 2,048-node job's 2,047) and
    the job requeued without it. Not a swap or a shrink: the supervisor reaches no agent to start
    them, and Slurm, which still finds every node responding, would requeue nothing itself."""
    host = str(stop.batch_host)
    others = len(unreachable(stop)) or stop.remote_nodes
    reason = (
        f"the supervisor on {host} reaches none of {others} other nodes at once while slurmctld answers it and "
        f"finds every one of them responding: {host} is cut off from them (a partition); it blames its own host "
        "and requeues without it"
    )
    suspects = (host,)
    exclude = excluded_by_history(
        [*history, _with(current, Cause.NODE_FAILURE, suspects, stop.now)], stop.now, s.forgive_after_s
    )
    return _budgeted(
        history, current, stop, s, Cause.NODE_FAILURE, reason, suspects=suspects, exclude=exclude, restart=False
    )


def _cut_off(stop: Stop) -> Decision:
    """The supervisor lost every other node's agent and slurmctld does not answer it: it cannot
    tell "they are dead" from "I am cut off", and the one it can vouch for is itself. It blames
    its own host, writes no verdict (the attempt stays running: Slurm decides the job, and the
    next start books it from Slurm's record) and ends what it runs on its node."""
    host = stop.batch_host or "the batch host"
    reason = (
        f"the supervisor on {host} lost the agents of every other node ({stop.remote_nodes}) and slurmctld does "
        f"not answer: its own host is cut off; it blames itself, writes no verdict and stands down"
    )
    suspects = (stop.batch_host,) if stop.batch_host else ()
    return Decision(Action.STAND_DOWN, Cause.LOST, reason, State.RUNNING, suspects=suspects)


def _drained(stop: Stop) -> Decision:
    """The ranks saved for the nodes an operator drains: spares take their places, or (the spares
    went between the stop and now) they resume here and the drain waits for the job."""
    drained = tuple(sorted(stop.draining))
    takers = stop.spares[: len(drained)]
    what = f"{', '.join(drained)} {'is' if len(drained) == 1 else 'are'} being drained (planned maintenance)"
    if len(takers) == len(drained):
        reason = f"{what}: the ranks saved; leaving {', '.join(drained)} out for spare(s) {', '.join(takers)}"
        return Decision(Action.SWAP, Cause.DRAIN, reason, State.STOPPED, swap_out=drained)
    reason = f"{what}, with no spare left: the ranks saved; resuming here"
    return Decision(Action.RESTART, Cause.DRAIN, reason, State.STOPPED)


def _slow(stop: Stop) -> Decision:
    """The ranks saved for slow nodes a straggler verdict named (straggler.action=swap): spares take
    their places and the slow nodes are suspects (one point: left out of this job, not of the
    next unless it happens again); or (the spares went between the verdict and now) the ranks
    resume here, and the verdict leaves the nodes out at the next requeue."""
    slow = tuple(sorted(stop.stragglers))
    takers = stop.spares[: len(slow)]
    what = f"{', '.join(slow)} {'is' if len(slow) == 1 else 'are'} slow (a straggler verdict)"
    if len(takers) == len(slow):
        reason = f"{what}: the ranks saved; leaving {', '.join(slow)} out for spare(s) {', '.join(takers)}"
        return Decision(Action.SWAP, Cause.STRAGGLER, reason, State.STOPPED, suspects=slow, swap_out=slow)
    reason = f"{what}, with no spare left: the ranks saved; resuming here"
    return Decision(Action.RESTART, Cause.STRAGGLER, reason, State.STOPPED, suspects=slow)


def what_failed(
    stop: Stop, current: Attempt, earlier_failures: Sequence[RankFailure]
) -> tuple[Cause, str, tuple[str, ...]]:
    """(cause, reason, nodes to blame) of a generation that ended without an imposed stop."""
    if stop.self_stall is not None:
        # the agents ended because the supervisor went quiet, not because their nodes died: every
        # node would look dead; none is to blame. Restarted with new agents, in this allocation
        return Cause.HANG, f"{stop.self_stall}: its agents gave up on it; nobody blamed", ()
    if stop.dead_nodes:
        # whatever the other ranks reported after it went, they lost a peer: the node is the cause
        dead = ", ".join(f"{n} ({why})" for n, why in stop.dead_nodes)
        silent = tuple(n for n, _ in stop.dead_nodes)
        if stop.slurm_gone is None:
            # another agent answers the batch host all along: its own link is sound
            return Cause.NODE_FAILURE, f"node(s) stopped answering: {dead}", silent
        # nothing vouched for the batch host's link: Slurm's verdict decides who is blamed
        gone = tuple(n for n in silent if n in stop.slurm_gone)
        waited = f"after {stop.verdict_waited_s:.0f} s"
        if gone:
            found = f"slurmctld finds {', '.join(gone)} not responding too ({waited})"
            return Cause.NODE_FAILURE, f"node(s) stopped answering: {dead}; {found}", gone
        why = (
            f"node(s) stopped answering: {dead}; slurmctld finds them responding {waited} (SlurmdTimeout and "
            "a ping): a link between them and the batch host failed, not a node; nobody blamed, new agents"
        )
        return Cause.NETWORK, why, ()
    if stop.agents_died:
        # the host answered the probe: the agent is gone, the node lives. A new agent there; the
        # node a suspect (one point), left out only if it happens again (where it repeats decides)
        died = ", ".join(f"{n} ({why})" for n, why in stop.agents_died)
        return (
            Cause.FAILURE,
            f"agent(s) gone on live node(s): {died}; new agents",
            tuple(n for n, _ in stop.agents_died),
        )
    if stop.ctld_lost is not None:
        why = f"{stop.ctld_lost}, and it answers again with this allocation running: nobody blamed, new ranks here"
        return Cause.NETWORK, why, ()
    if stop.agent_errors:
        what = "; ".join(f"on {n}: {why}" for n, why in stop.agent_errors)
        if stop.launch_failed:
            # srun reached no slurmd there: a link from the batch host, not the agent's bug; or the
            # node is dead, if Slurm finds it so
            nodes = ", ".join(stop.launch_failed)
            why = f"{what}; srun could not start the agent on {nodes} (its slurmd did not answer the batch host)"
            gone = tuple(n for n in stop.launch_failed if n in (stop.slurm_gone or ()))
            if gone:
                return Cause.NODE_FAILURE, f"{why}; slurmctld finds {', '.join(gone)} not responding too", gone
            return Cause.NETWORK, f"{why}: nobody blamed", ()
        return Cause.FAILURE, f"hpc_llm's agent ended with an error ({what}); restarting it", ()
    if stop.storage_stall is not None:
        return Cause.TRANSIENT, f"{stop.storage_stall}; retrying", ()
    if stop.hang is not None:
        if joined_and_failed(stop, current, Cause.HANG, None):
            return _spare_failed(stop, Cause.HANG, stop.hang[0])
        return Cause.HANG, stop.hang[0], tuple(stop.hang[1])
    if stop.startup is not None:
        why = f"no heartbeat from every rank in time: stuck in {stop.startup}"
        if joined_and_failed(stop, current, Cause.STARTUP, None):
            return _spare_failed(stop, Cause.STARTUP, why)
        return Cause.STARTUP, why, ()
    if current.state == State.FAILED and current.cause == Cause.PREFLIGHT:
        return Cause.PREFLIGHT, current.error or "a preflight check failed", tuple(current.suspects)
    cause, reason, node = classify_failure(stop, current, earlier_failures)
    if joined_and_failed(stop, current, cause, blamed_node(stop)):
        return _spare_failed(stop, cause, reason)
    return cause, reason, (node,) if node else ()


def unreachable(stop: Stop) -> tuple[str, ...]:
    """The nodes a ``network`` stop could not reach from the batch host: silent ones Slurm finds
    responding, or ones srun could not start an agent on."""
    return tuple(sorted({n for n, _ in stop.dead_nodes} | set(stop.launch_failed)))


def _unreachable_again(history: Sequence[Attempt], current: Attempt, stop: Stop) -> tuple[str, ...]:
    """A link from the batch host to a node that fails once blames nobody: from one end, nothing
    tells which end it is (and it may heal: a backoff, a restart). The same node unreachable at
    the stop before this one too, with no progress between, is blamed (a point each time, so it
    is left out at its second, and the run goes on without it)."""
    now, last = set(unreachable(stop)), _last_network_stop(history)
    if not now or last is None:
        return ()
    return tuple(sorted(now & set(last.unreachable)))


def _last_network_stop(history: Sequence[Attempt]) -> Attempt | None:
    """The stop before this one, with no progress between, when it was a ``network`` one."""
    before = since_reset(history)
    return before[-1] if before and before[-1].cause == Cause.NETWORK else None


def _batch_host_common(history: Sequence[Attempt], stop: Stop) -> bool:
    """The batch host could not reach one node at the stop before and another one now, with no
    progress between (the job requeued without the first, or a spare in its place): what the two
    stops share is the batch host's own link, so it is the one cut off (seed 304 of the simulator:
    a batch host partitioned from the rest for good, a job of two nodes, each other node in turn
    blamed and excluded until the run failed)."""
    now, last = set(unreachable(stop)), _last_network_stop(history)
    if not now or last is None or not last.unreachable or not stop.batch_host:
        return False
    return stop.batch_host in last.nodes and not (now & set(last.unreachable)) and stop.batch_host not in now


def joined_and_failed(stop: Stop, current: Attempt, cause: Cause, node: str | None) -> bool:
    """A generation a spare took a place in ended before its first batch: the same code and data
    trained on the other nodes in the last generation, so its first collectives (the rendezvous,
    the first all-reduce) were the spare's all-reduce check, and it failed them. Not a transient
    storage error; a user error only where it was raised on the spare (``node``: where the
    generation failed first)."""
    if not stop.joined or current.first_batch_at is not None or cause == Cause.TRANSIENT:
        return False
    if any(e.by_signal and not e.killed and e.node not in stop.joined for e in stop.rank_exits):
        # a rank killed by a signal on a node that trained before (the OOM killer, a crash): that
        # node's own fault, not the spare's all-reduce (the simulator's seeds 1643, 1841, 3396...)
        return False
    return cause != Cause.USER_ERROR or node in stop.joined


def _spare_failed(stop: Stop, cause: Cause, reason: str) -> tuple[Cause, str, tuple[str, ...]]:
    spares = ", ".join(stop.joined)
    why = f"{reason}; before the first batch of the first generation of spare(s) {spares}: their all-reduce check"
    # a start-up stuck on the spare is its failure: restarted in place, and left out (for another
    # spare) when it fails again, rather than requeued as a start-up hang would be
    return (Cause.FAILURE if cause in (Cause.USER_ERROR, Cause.STARTUP) else cause), why, tuple(stop.joined)


def _failed(
    history: Sequence[Attempt],
    current: Attempt,
    stop: Stop,
    s: Settings,
    cause: Cause,
    reason: str,
    nodes: tuple[str, ...],
) -> Decision:
    """A failure: the user's ends the run; a transient one is retried in place after a backoff;
    the machine's restarts in place, swaps in spares for the nodes it leaves out, or requeues
    without them, within the budgets."""
    if cause == Cause.USER_ERROR:
        return Decision(Action.FAIL, Cause.USER_ERROR, reason, State.FAILED)
    if cause in BACKOFF_S and not nodes:
        # retried in place, blaming nobody, after a wait that doubles each time in a row: a store's
        # hiccup or a link that heals in minutes must not spend the failure budget in seconds
        d = _budgeted(history, current, stop, s, cause, reason, suspects=(), exclude=None, restart=True)
        in_a_row = 0
        for a in reversed(since_reset(history)):
            if a.cause != cause:
                break
            in_a_row += 1
        first, most = BACKOFF_S[cause]
        return replace(d, delay_s=min(most, first * 2**in_a_row))
    suspects = tuple(sorted(set(nodes)))
    exclude = excluded_by_history([*history, _with(current, cause, suspects, stop.now)], stop.now, s.forgive_after_s)
    out = tuple(sorted(set(suspects) & exclude))
    restart = s.restart_in_place and not out and cause != Cause.STARTUP
    usable = [n for n in stop.spares if n not in exclude]
    if s.restart_in_place and out and len(usable) >= len(out):
        # every node this stop leaves out has a warm spare to take its place: same job, no queue
        reason = f"{reason}; leaving out {', '.join(out)} for spare(s) {', '.join(usable[: len(out)])}"
        d = _budgeted(history, current, stop, s, cause, reason, suspects=suspects, exclude=exclude, restart=True)
        return replace(d, action=Action.SWAP, swap_out=out) if d.action == Action.RESTART else d
    if s.restart_in_place and out and stop.shrinkable and trained_none(stop, out, s.nodes):
        # the nodes left out trained nothing (spares, or any node before the first generation) and
        # the allocation holds the run without them: here, now (the simulator's seed 1481: a
        # spare dead as the supervisor that took over started its agents, and the job was
        # requeued for it, sized for the dead nodes)
        reason = f"{reason}; going on without {', '.join(out)}, which trained nothing"
        d = _budgeted(history, current, stop, s, cause, reason, suspects=suspects, exclude=exclude, restart=True)
        return replace(d, action=Action.SWAP, swap_out=out) if d.action == Action.RESTART else d
    least = min(s.min_nodes or s.nodes, s.nodes)
    left = stop.trained_nodes - len(out) + len(usable[: len(out)])
    if s.restart_in_place and out and stop.shrinkable and least <= left < stop.trained_nodes:
        # too few spares (or none) for the nodes this stop leaves out, and the run may go on with
        # fewer (resources.min_nodes): here, now, on the nodes left; a requeue grows it back
        takers = usable[: len(out)]
        by = f" and spare(s) {', '.join(takers)}" if takers else ""
        reason = (
            f"{reason}; going on with {left} of {s.nodes} node(s) without {', '.join(out)}{by} "
            f"(resources.min_nodes={least})"
        )
        d = _budgeted(history, current, stop, s, cause, reason, suspects=suspects, exclude=exclude, restart=True)
        return replace(d, action=Action.SHRINK, swap_out=out) if d.action == Action.RESTART else d
    return _budgeted(history, current, stop, s, cause, reason, suspects=suspects, exclude=exclude, restart=restart)


def trained_none(stop: Stop, out: tuple[str, ...], nodes: int) -> bool:
    """The nodes ``out`` are none of the generation's trainers (before the first generation, no
    node is) and the allocation's other usable nodes are ``nodes`` or more."""
    if set(out) & set(stop.trainers):
        return False
    return len([n for n in stop.usable_nodes if n not in out]) >= nodes


#: a preemption's reason when the ranks never got (or could not act on) its signal
SPENT_WARNING = (
    "preempted after Slurm's warning signal was spent (or past the grace time): the ranks got SIGTERM "
    "before they saved; resuming from the last checkpoint"
)


def _imposed_stop(current: Attempt, stop: Stop, s: Settings) -> tuple[Cause, str] | None:
    """(cause, reason) when this stop is a time limit, a preemption or a requested stop, whatever
    state the ranks were in (a save in progress, the post-train stage, start-up); else None. Slurm
    requeueing the job itself is a stop of its own kind: cause ``lost`` (its next start closes it)."""
    if stop.slurm_requeueing:
        return Cause.LOST, f"Slurm is requeueing the job ({stop.slurm_requeueing})"
    at_end = (
        stop.sigterm_at is not None and stop.end_time is not None and stop.sigterm_at >= stop.end_time - s.term_at_end_s
    )
    if (
        stop.preempting
        and stop.returncode != 0
        and current.state != State.STOPPED
        and stop.stop_cause != Cause.PREEMPTION
    ):
        # Slurm's grace time runs and the ranks were killed unsaved: a preemption, even where the
        # time-limit warning was passed on just before (Slurm signals a job once; the preemption
        # then SIGTERMs the steps; seen on the dev cluster, an attempt whose start-up ate its minute)
        return Cause.PREEMPTION, SPENT_WARNING
    if stop.stop_cause in STOP_CAUSES:
        what = {Cause.TIME_LIMIT: "the time limit", Cause.PREEMPTION: "a preemption", Cause.SIGNAL: "a requested stop"}
        how = "saved" if current.state == State.STOPPED else "stopped before their save finished"
        return stop.stop_cause, f"{what[stop.stop_cause]}: the ranks {how}; resuming from the last checkpoint"
    if current.state == State.STOPPED and stop.returncode == 0:
        # rank 0 stopped and saved on a request of its own (the throughput watchdog) or a signal
        # that reached the ranks without the supervisor (scancel --signal without --batch)
        cause = Cause(current.cause or Cause.PREEMPTION)
        return cause, current.error or f"{cause}: the ranks saved; resuming from the last checkpoint"
    if at_end:
        return Cause.TIME_LIMIT, "the time limit ended the ranks before they saved; resuming from the last checkpoint"
    if stop.sigterm_at is not None and not at_end:
        return Cause.CANCELLED, "the job was cancelled or killed by Slurm (SIGTERM)"
    return None


def _requeue_stop(
    history: Sequence[Attempt], current: Attempt, stop: Stop, s: Settings, cause: Cause, reason: str
) -> Decision:
    state = State.STOPPED if current.state == State.STOPPED else _ended(current)
    if cause == Cause.LOST:
        # Slurm ends this allocation and requeues the job itself: the next start closes the attempt
        return Decision(Action.SLURM_REQUEUES, Cause.LOST, reason, State.RUNNING)
    if cause == Cause.CANCELLED:
        return Decision(Action.FAIL, Cause.CANCELLED, reason, state)
    exclude = excluded_by_history(history, stop.now, s.forgive_after_s)
    return _budgeted(history, current, stop, s, cause, reason, suspects=(), exclude=exclude, restart=False, state=state)


def _budgeted(
    history: Sequence[Attempt],
    current: Attempt,
    stop: Stop,
    s: Settings,
    cause: Cause,
    reason: str,
    *,
    suspects: tuple[str, ...],
    exclude: set[str] | None,
    restart: bool,
    state: State | None = None,
) -> Decision:
    state = state or _ended(current)
    # a straggler verdict's node (straggler.action=exclude) stays out of the allocations to come
    excl = tuple(sorted(set(exclude or ()) | slow_nodes([*history, current], stop.now, s.forgive_after_s)))
    over = _over_budget(history, current, stop, s, cause)
    if over:
        return Decision(Action.FAIL, cause, f"{over}; last stop: {reason}", state, suspects, excl, (over,))
    if restart:
        return Decision(Action.RESTART, cause, reason, state, suspects, excl)
    if not stop.on_slurm:
        return Decision(
            Action.FAIL, cause, f"{reason}; not running under Slurm, so not requeued", state, suspects, excl
        )
    return Decision(Action.REQUEUE, cause, reason, state, suspects, excl)


def _over_budget(history: Sequence[Attempt], current: Attempt, stop: Stop, s: Settings, cause: Cause) -> str | None:
    failure = cause in FAILURE_CAUSES
    in_a_row, without_progress = streaks(history, current, failure)
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
            for a in since_reset(history)
            if a.cause in FAILURE_CAUSES and stop.now - (a.ended_at or a.started_at) < DAY_S
        )
        if day > s.max_failures_per_day:
            return f"fault.max_failures_per_day={s.max_failures_per_day:g} reached: {day} failures in 24 h"
    if cause in (Cause.PREEMPTION, Cause.SIGNAL) and s.max_preemptions is not None:
        n = count(since_reset(history), frozenset({Cause.PREEMPTION, Cause.SIGNAL})) + 1
        if n > s.max_preemptions:
            return f"fault.max_preemptions={s.max_preemptions} reached"
    if cause == Cause.TIME_LIMIT and s.max_timeouts is not None:
        n = count(since_reset(history), frozenset({Cause.TIME_LIMIT})) + 1
        if n > s.max_timeouts:
            return f"fault.max_timeouts={s.max_timeouts} reached"
    return None


def _ended(a: Attempt) -> State:
    return State.FAILED if a.state == State.RUNNING else State(a.state)


def _with(a: Attempt, cause: Cause, suspects: tuple[str, ...], now: float) -> Attempt:
    """``a`` as it will be recorded (for counting blame with this stop included)."""
    return replace(a, cause=cause, suspects=list(suspects), ended_at=a.ended_at or now)
