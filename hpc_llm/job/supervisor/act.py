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
from typing import TYPE_CHECKING

from hpc_llm import world
from hpc_llm.job.supervisor.stop import Decision
from hpc_llm.rundir.outcome import Action, Cause, State
from hpc_llm.rundir.record import Attempt, Attempts, update_results
from hpc_llm.slurm import allocation, requeue

if TYPE_CHECKING:
    from hpc_llm.job.supervisor.state import SupervisorState

log = logging.getLogger("hpc_llm.supervisor")


def act(sup: SupervisorState, attempts: Attempts, a: Attempt, d: Decision) -> int | None:
    """Record the decision, then carry it out: the job's exit code, or None to run the next
    generation in this allocation. A supervisor that stands down, or whose job Slurm has
    requeued meanwhile, writes nothing: its record would contradict Slurm's."""
    if d.action == Action.STAND_DOWN:
        return stand_down(sup, d)
    if d.action != Action.SLURM_REQUEUES and sup.superseded():
        log.warning("hpc_llm supervisor: the job runs a newer allocation than this one: writing nothing, ending")
        sup.agents.end()
        stand_aside(sup, wait_for_claim=False)
        return 0
    if d.action == Action.DONE:
        if a.alloc_nodes > len(a.nodes) or a.stragglers:
            # rank 0 wrote the completed record; the spares' node-seconds and the straggler
            # verdicts go in beside it
            attempts.save()
            update_results(sup.run_dir, attempts, sup.status() or "completed", {})
        end_for_good(sup)
        return 0
    if d.action == Action.SLURM_REQUEUES:
        # the attempt stays "running"; the next start closes it from accounting (lost.close)
        a.state, a.ended_at = State.RUNNING, None
        attempts.save()
        log.warning("hpc_llm supervisor: %s; not recording a failure", d.reason)
        return 0
    a.state = d.state
    a.ended_at = a.ended_at or world.time()
    a.decided_at = a.decided_at or world.time()
    a.cause = d.cause
    if a.state != State.STOPPED or d.action == Action.FAIL:
        a.error = d.reason  # a stop that saved keeps what rank 0 said (usually nothing)
    a.suspects = sorted(set(d.suspects))
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


def stand_down(sup: SupervisorState, d: Decision) -> int:
    """This host is cut off (the policy's reason says why): no record, no requeue (slurmctld does
    not answer anyway); the agent on this node ends its ranks, and this process ends. Slurm finds
    the host not responding, requeues the job, and the next start books this attempt from its
    record; a host that heals later carries no process of the job."""
    log.error("hpc_llm supervisor: %s", d.reason)
    sup.agents.abandon()
    stand_aside(sup)
    return 1


#: how often a supervisor standing aside looks for an agent's takeover claim, and how long beyond
#: the agents' patience and Slurm's verdict it looks for one before it ends
ASIDE_POLL_S = 2.0
ASIDE_SLACK_S = 90.0


def stand_aside(sup: SupervisorState, wait_for_claim: bool = True) -> None:
    """With spares, an agent may take this supervisor's place in the same job
    (hpc_llm.job.agent.takeover) while this host is cut off or frozen. If this host is back before
    Slurm took it out of the job, this process is still the batch script, and its end would end
    the job under the supervisor that took over: so once the claim is there it keeps the batch
    script alive, writing nothing, until Slurm ends the job (its SIGTERM). Without a claim it
    waits as long as one may still come (the agents' patience and Slurm's verdict), then ends;
    not at all unless ``wait_for_claim`` (a supervisor whose job runs a newer allocation)."""
    if not sup.job.job_id or not sup.agents.takeover_offered():
        return
    deadline = world.monotonic() + sup.silent_s + sup.slurmd_timeout_s + ASIDE_SLACK_S
    said = False
    while not sup.terminated_at:
        if sup.taken_over():
            if not said:
                log.warning("hpc_llm supervisor: an agent took this supervisor's place: keeping the batch script")
                said = True
        elif not wait_for_claim or world.monotonic() > deadline:
            return
        world.sleep(ASIDE_POLL_S)


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
    err = requeue.ending_for_good(str(sup.job.ref)) if sup.job.ref else None
    if err:
        log.warning("hpc_llm supervisor: could not set Requeue=0 (%s): Slurm may start the job once more", err)


def requeue_job(sup: SupervisorState, attempts: Attempts, a: Attempt, d: Decision) -> int:
    """Put the job back in the queue without the nodes whose blame is in force, sized to what its
    partition holds."""
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
        sup.agents.asked or full, full, sup.policy.least_nodes, job.partition, tuple(exclude), sup.policy.nodes
    )
    done = requeue.requeue(
        str(job.ref),
        exclude=exclude if change else None,
        resize=None if by_ending else requeue.fit_partition(size),
        per_node=sup.policy.tasks_per_node,
        # a dead node still holds the job COMPLETING: not again before Slurm has let it go and
        # cleaned up (requeue.REQUEUE_DELAY_SINCE)
        after_dead_node=d.cause == Cause.NODE_FAILURE,
        by_ending=by_ending,
    )
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


def exclusions(sup: SupervisorState, attempts: Attempts, d: Decision) -> tuple[list[str], str | None]:
    """The next allocation's ExcNodeList: the user's own exclusions plus the nodes whose blame
    is in force (d.exclude; forgiven nodes come back), never so many that the nodes up in the
    partition cannot hold the run. Returns it and, when it had to stop excluding, why."""
    job, needed = sup.job, sup.policy.least_nodes
    ours = {n for x in attempts.items for n in x.suspects}
    users = {n for n in job.excluded if n not in ours}
    wanted = sorted(users | set(d.exclude))
    up = allocation.nodes_up(job.partition)
    if up and len([n for n in up if n not in wanted]) < needed:
        dropped = sorted(set(wanted) - users)
        warning = (
            f"not excluding {','.join(dropped)}: only {len([n for n in up if n not in users])} node(s) of "
            f"partition {job.partition} are up and the run needs {needed}"
        )
        log.warning("hpc_llm supervisor: %s", warning)
        return sorted(users), warning
    return wanted, None
