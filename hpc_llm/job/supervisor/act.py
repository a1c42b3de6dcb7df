"""Carrying out the fault policy's decision: record it first, then do it.

One function per action of :class:`~hpc_llm.rundir.outcome.Action`: done (the run completed;
the job must not come back), a restart in this allocation (after a backoff), a swap (spares take
the left-out nodes' places), a requeue (the next allocation without the blamed nodes, sized to
what the partition holds: :func:`hpc_llm.slurm.requeue.requeue`), Slurm requeues the job itself
(nothing to do), and fail. The records (attempts.json, results.json) are written before the
action: a requeue sends this very process SIGTERM. Stdlib only.
"""

from __future__ import annotations

import logging
import signal
from dataclasses import replace
from typing import TYPE_CHECKING

from hpc_llm import world
from hpc_llm.job.supervisor import facts
from hpc_llm.job.supervisor.stop import Decision
from hpc_llm.rundir import epoch
from hpc_llm.rundir.outcome import Action, Cause, State
from hpc_llm.rundir.record import Attempt, Attempts, update_results
from hpc_llm.slurm import allocation, requeue

if TYPE_CHECKING:
    from hpc_llm.job.supervisor.state import SupervisorState

log = logging.getLogger("hpc_llm.supervisor")


def act(sup: SupervisorState, attempts: Attempts, a: Attempt, d: Decision) -> int | str | None:
    """Record the decision, then carry it out: the job's exit code, None to run the next
    generation in this allocation, or :data:`RESUME` (decide again: a supervisor that stood down
    has command back). A supervisor that stands down writes nothing; one that no longer holds the
    job's epoch is refused its first write (:class:`~hpc_llm.rundir.epoch.Stale`, which the
    supervisor's loop turns into standing aside)."""
    if d.action == Action.STAND_DOWN:
        return stand_down(sup, d)
    if d.action == Action.DONE:
        if a.alloc_nodes > len(a.nodes) or a.stragglers:
            # rank 0 wrote the completed record; the spares' node-seconds and the straggler
            # verdicts go in beside it, while this allocation is still the job's
            try:
                attempts.save()
                update_results(sup.run_dir, attempts, sup.status() or "completed", {})
            except epoch.Unanswered as exc:
                log.warning("hpc_llm supervisor: not adding the spares' account to the record: %s", exc.why)
        end_for_good(sup)
        return 0
    if d.action == Action.SLURM_REQUEUES:
        # Slurm's restart count has moved on: the record is the next allocation's to write. This
        # attempt stays "running" there, and the next start closes it from accounting (lost.close)
        log.warning("hpc_llm supervisor: %s; writing nothing", d.reason)
        return 0
    a.state = d.state
    a.ended_at = a.ended_at or world.time()
    a.decided_at = a.decided_at or world.time()
    a.cause = d.cause
    if a.state != State.STOPPED or d.action == Action.FAIL:
        a.error = d.reason  # a stop that saved keeps what rank 0 said (usually nothing)
    a.suspects = sorted(set(d.suspects))
    a.unreachable = list(d.unreachable)
    if d.action == Action.FAIL:
        fail(sup, attempts, a, d.cause, d.reason)
        return 1
    if d.action == Action.RESTART:
        restart(sup, attempts, a, d)
        return None
    if d.action in (Action.SWAP, Action.SHRINK):
        swap(sup, attempts, a, d)
        return None
    return requeue_job(sup, attempts, a, d)


#: what :func:`act` returns when a supervisor that stood down has command again: decide the same
#: stop anew, with what Slurm says now
RESUME = "resume"
#: how often a supervisor standing down or aside asks Slurm and the run's epoch how things stand
VERDICT_POLL_S = 3.0


def stand_down(sup: SupervisorState, d: Decision) -> int | str:
    """This host is cut off (the policy's reason says why). Standing down never ends the job: this
    process's exit is the batch script's, and so the job's end (FAILED, not requeued) while
    Slurm may still be about to requeue it or an agent to take over. So: write nothing, change
    nothing in Slurm, end this node's ranks and let go of the agent step (:meth:`Agents.abandon`),
    and wait for the verdict:

    * an agent claims the job's epoch (it takes this supervisor's place): stand aside;
    * Slurm moves the job on (it calls this host DOWN: a requeue, or the host taken out of a
      ``--no-kill`` job) or ends the allocation (SIGTERM): end, writing nothing; the next holder
      books this attempt;
    * slurmctld answers again with this allocation still running on this host: claim the next
      command of it and decide the stop anew (:data:`RESUME`), with what Slurm says now."""
    log.error("hpc_llm supervisor: %s", d.reason)
    return await_verdict(sup)


def unanswered(sup: SupervisorState, why: str) -> int | str:
    """A write of the record refused because slurmctld stopped answering this supervisor
    (:meth:`SupervisorState.ctld_lease`): cut off from it, like a stand-down; the same wait."""
    log.error("hpc_llm supervisor: %s: standing down until Slurm says whose the job is", why)
    return await_verdict(sup)


def await_verdict(sup: SupervisorState) -> int | str:
    """:func:`stand_down`'s wait (its docstring)."""
    sup.agents.abandon(others=False)
    holder = sup.holder
    if holder is None or not sup.job.job_id:
        return 1  # off Slurm there is nobody else to decide
    since = world.monotonic()
    while not sup.terminated_at:
        why = sup.stale()
        if why is not None:
            return stand_aside(sup, why)
        info = sup.job_info()
        if info:
            nodes = allocation.hostnames(info.get("NodeList"))
            if not allocation.still_this_allocation(info, sup.job.restart) or sup.node not in nodes:
                log.warning(
                    "hpc_llm supervisor: Slurm moved the job on (%s, restart %s, nodes %s): ending, writing nothing",
                    info.get("JobState"),
                    info.get("Restarts"),
                    info.get("NodeList"),
                )
                return 0
            mine = holder.epoch
            took = epoch.claim(
                sup.run_dir,
                str(sup.job.job_id),
                mine.restart,
                mine.takeover + 1,
                by=sup.node,
                generation=mine.generation,
            )
            if took is None:
                return stand_aside(sup, f"{epoch.current(sup.run_dir, str(sup.job.job_id))} holds the job")
            sup.hold(took)
            waited = world.monotonic() - since
            log.warning(
                "hpc_llm supervisor: slurmctld answers again after %.0f s with this allocation running here: "
                "resuming command (epoch %s)",
                waited,
                took.epoch,
            )
            sup.agents.abandon()  # the agents kept for a takeover: the next generation starts its own
            return RESUME
        world.sleep(VERDICT_POLL_S)
    return 0


def stand_aside(sup: SupervisorState, why: str) -> int:
    """Another process holds the job (an agent took this supervisor's place, or Slurm moved the job
    on): write nothing, change nothing in Slurm, let go of the agent step without ending it, and
    keep this batch script alive as long as it may still be the job's (this host in the job, the
    same allocation running): its end would end the job under the one that holds it. Ends (0) when
    Slurm ends this allocation (SIGTERM), requeues the job or takes this host out of it."""
    log.warning("hpc_llm supervisor: no longer holds the job (%s): writing nothing, standing aside", why)
    sup.agents.abandon()
    if not sup.job.job_id:
        return 0
    while not sup.terminated_at:
        info = sup.job_info()
        if info:
            nodes = allocation.hostnames(info.get("NodeList"))
            if not allocation.still_this_allocation(info, sup.job.restart) or sup.node not in nodes:
                return 0
        world.sleep(VERDICT_POLL_S)
    return 0


def restart(sup: SupervisorState, attempts: Attempts, a: Attempt, d: Decision) -> None:
    a.action = Action.RESTART
    attempts.save()
    update_results(sup.run_dir, attempts, "restarting", {"error": d.reason})
    log.warning("hpc_llm supervisor: %s; restarting the ranks in this allocation", d.reason)
    if d.delay_s:
        world.sleep(d.delay_s)  # a stop signal meanwhile is queued and handled by the next generation


def swap(sup: SupervisorState, attempts: Attempts, a: Attempt, d: Decision) -> None:
    """The next generation runs without ``d.swap_out``: spares take their node ranks
    (:func:`~hpc_llm.job.supervisor.agents.next_layout`), in this allocation, with no requeue; on
    a shrink, those no spare replaces leave the run on fewer nodes (:attr:`Agents.size`). A
    left-out node's agent, if it still answers, is told to end; the node goes back to Slurm (the
    job shrinks; draining it needs operator rights) and is recorded with the evidence (suspects,
    error)."""
    a.action, a.left_out = d.action, list(d.swap_out)
    attempts.save()
    sup.agents.swap_out(d.swap_out)
    # a node left out is paid for until the job ends: give it back (the job shrinks)
    a.given_back = sup.agents.give_back()
    attempts.save()
    sup.agents.note_spares()
    update_results(sup.run_dir, attempts, "restarting", {"error": d.reason})
    what = "going on with fewer nodes" if d.action == Action.SHRINK else "swapping in a spare"
    log.warning("hpc_llm supervisor: %s; %s for %s", d.reason, what, ",".join(d.swap_out))


def fail(sup: SupervisorState, attempts: Attempts, a: Attempt | None, cause: str, reason: str) -> None:
    if a is not None:
        a.cause, a.action, a.error = cause, Action.FAIL, reason
        a.decided_at = a.decided_at or world.time()
        a.ended_at = a.ended_at or world.time()
        if a.state == State.RUNNING:
            a.state = State.FAILED
    attempts.save()
    update_results(sup.run_dir, attempts, "failed", {"error": reason})
    log.error("hpc_llm supervisor: the run failed: %s", reason)
    end_for_good(sup)


def end_for_good(sup: SupervisorState) -> None:
    """The job ends now and must stay ended: after a preemption Slurm >= 24.05 would requeue
    it once more (hpc_llm.slurm.requeue.ending_for_good)."""
    if not sup.job.ref:
        return
    try:
        with epoch.acting("setting Requeue=0 on the job"):
            err = requeue.ending_for_good(str(sup.job.ref))
    except epoch.Refused as exc:
        err = exc.why
    if err:
        log.warning("hpc_llm supervisor: could not set Requeue=0 (%s): Slurm may start the job once more", err)


def requeue_job(sup: SupervisorState, attempts: Attempts, a: Attempt, d: Decision) -> int | str:
    """Put the job back in the queue without the nodes whose blame is in force, sized to what its
    partition holds. Off Slurm nothing can: the run fails."""
    if not sup.job.ref:
        fail(sup, attempts, a, d.cause, f"{d.reason}; no Slurm job to requeue (a run off Slurm)")
        return 1
    exclude, warning = exclusions(sup, attempts, d)
    a.action, a.requeued = Action.REQUEUE, True
    a.decided_at = a.decided_at or world.time()
    if warning:
        a.error = f"{a.error or d.cause}; {warning}"
    attempts.save()
    update_results(sup.run_dir, attempts, "requeued", {"error": a.error, "excluded_nodes": exclude or None})
    # records first; the requeue sends this very job SIGTERM, which we must outlive
    world.on_signal(signal.SIGTERM, signal.SIG_IGN)
    job = sup.job
    change = sorted(exclude) != sorted(job.excluded)
    # Slurm >= 24.05 in a preemption's grace time: ending the batch script is the requeue
    # (requeue.requeued_by_ending); a new ExcNodeList needs the job pending, so not then
    by_ending = not change and requeue.requeued_by_ending(job.job_id, job.partition)
    full = sup.agents.full_size()
    size = requeue.Size(
        sup.agents.asked or full,
        full,
        sup.policy.least_nodes,
        job.partition,
        tuple(exclude),
        sup.policy.nodes,
        doubtful=tuple(sorted(found_dead(sup, attempts, d))),
        known_up=(sup.node,),
    )
    resize = None if by_ending else requeue.fit_partition(size)
    try:
        with epoch.acting("requeueing the job"):
            done = requeue.requeue(
                str(job.ref),
                exclude=exclude if change else None,
                resize=resize,
                per_node=sup.policy.tasks_per_node,
                # a dead node still holds the job COMPLETING: not again before Slurm has let it go
                # and cleaned up (requeue.REQUEUE_DELAY_SINCE)
                after_dead_node=d.cause == Cause.NODE_FAILURE,
                by_ending=by_ending,
            )
    except epoch.Unanswered as exc:
        # slurmctld cannot be reached from here: as cut off, wait for it (or for Slurm's verdict)
        return stand_down(sup, replace(d, reason=f"{d.reason}; but the requeue could not be asked ({exc.why})"))
    if not done.ok:
        a.requeued = False
        fail(
            sup,
            attempts,
            a,
            d.cause,
            f"scontrol requeue {job.ref} failed: {done.refused}; last stop: {a.error or d.cause}",
        )
        return 1
    if a.signal_time:
        a.signal_to_requeue_s = round(world.time() - a.signal_time, 3)
    if done.update_error:
        a.error = f"{a.error or d.cause}; could not update the requeued job ({done.update_error})"
    elif done.resized:
        a.error = f"{a.error or d.cause}; {done.resized}"
    if done.hold_error:
        log.warning("hpc_llm supervisor: could not hold the requeued job: %s", done.hold_error)
    attempts.save()
    update_results(sup.run_dir, attempts, "requeued", {"error": a.error, "excluded_nodes": exclude or None})
    excluding = f", excluding {','.join(exclude)}" if exclude else ""
    log.warning("hpc_llm supervisor: %s; requeued%s", a.error or d.cause, excluding)
    return 0


def found_dead(sup: SupervisorState, attempts: Attempts, d: Decision) -> set[str]:
    """Nodes this allocation found dead or cut off (its stops' suspects, its lost spares): sinfo
    may still call them up for a SlurmdTimeout, and a requeued job sized on them pends for nodes
    that may never come back (the simulator's seed 4828: a spare lost for good, still "up" when
    the job was requeued for 4 nodes of which 3 lived)."""
    job = sup.job
    mine = [a for a in attempts.items if (a.job_id, a.restart) == (job.job_id, job.restart)]
    return set(d.suspects) | set(sup.agents.lost_spares) | {n for a in mine for n in a.suspects}


def exclusions(sup: SupervisorState, attempts: Attempts, d: Decision) -> tuple[list[str], str | None]:
    """The next allocation's ExcNodeList: the user's own exclusions plus the nodes whose blame
    is in force (d.exclude; forgiven nodes come back), never so many that the nodes up in the
    partition cannot hold the run. Returns it and, when it had to stop excluding, why."""
    job, needed = sup.job, sup.policy.least_nodes
    ours = {n for x in attempts.items for n in x.suspects}
    users = {n for n in job.excluded if n not in ours}
    # blamed earlier first, this stop's own suspects last: the nodes to let back in one by one
    # until the partition can hold the run (seed 304 of the simulator: a batch host cut off,
    # blamed at last, was let back in with the node blamed before it, and the run failed there)
    blamed = sorted(set(d.exclude) - users, key=lambda n: (n in d.suspects, n))
    # a supervisor that started while slurmctld was silent never learnt its partition: ask now
    job.partition = job.partition or sup.job_info().get("Partition")
    up = allocation.partition_up(job.partition, known_up=(sup.node,)) or []
    if up and blamed and len([n for n in up if n not in users and n not in blamed]) < needed:
        # Too few nodes outside the blamed ones: which of these are really gone decides which to
        # let back, and Slurm has not said yet (the simulator's seed 1308: a dead node and a
        # spare cut off for 15 s, both "up" to sinfo still; the dead one was let back, the
        # cut-off one excluded, and the job pended for good on 3 nodes of which 2 lived). Wait
        # for its verdict, as for any silent node (bounded by SlurmdTimeout): a node it calls
        # DOWN it keeps out itself, and is given back to service by Slurm's word, not ours.
        gone, _ = facts.await_verdict(sup, blamed)
        if gone:
            blamed = [n for n in blamed if n not in gone]
            up = [n for n in allocation.partition_up(job.partition, known_up=(sup.node,)) or up if n not in gone]
    if up:
        dropped: list[str] = []
        while blamed and len([n for n in up if n not in users and n not in blamed]) < needed:
            dropped.append(blamed.pop(0))
        why = f"only {len([n for n in up if n not in users])} node(s) of partition {job.partition} are up"
        why += f" and the run needs {needed}"
    else:
        # nothing tells how many nodes the partition has up: this stop's own suspects only, never
        # every node blamed so far (the simulator's seed 873 excluded all 3 of a 3-node cluster)
        dropped = [n for n in blamed if n not in d.suspects]
        blamed = [n for n in blamed if n in d.suspects]
        why = "sinfo did not say which nodes are up"
    warning = f"not excluding {','.join(sorted(dropped))}: {why}" if dropped else None
    if warning:
        log.warning("hpc_llm supervisor: %s", warning)
    return sorted(users | set(blamed)), warning
