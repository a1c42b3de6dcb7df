"""The facts of one stop, gathered for the fault policy: what the supervisor saw, and Slurm's word.

:func:`gather` turns a :class:`~hpc_llm.job.supervisor.generation.GenerationEnd` into the
policy's :class:`~hpc_llm.job.supervisor.stop.Stop`: why the stop signal came (asked again
now that the ranks have saved), whether a preemption's grace time runs, whether Slurm itself is
requeueing the job (a node failure: its SIGTERM reached the batch host), the ranks' failure
reports, the nodes srun found failed, and whether the supervisor itself stalled past its agents'
patience. Stdlib only.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from hpc_llm import world
from hpc_llm.job import failures
from hpc_llm.job.supervisor import state
from hpc_llm.job.supervisor.generation import GenerationEnd
from hpc_llm.job.supervisor.stop import Stop
from hpc_llm.rundir.outcome import Cause
from hpc_llm.slurm import allocation

if TYPE_CHECKING:
    from hpc_llm.job.supervisor.state import SupervisorState

log = logging.getLogger("hpc_llm.supervisor")


def gather(sup: SupervisorState, end: GenerationEnd) -> Stop:
    """The facts of this stop the policy decides on: Slurm is asked again (the end time moves
    with ``scontrol update TimeLimit``; a PreemptTime says a preemption's grace time runs)."""
    ask_why_again(sup, end)
    info = sup.job_info() if (end.returncode != 0 or end.terminated) else {}
    # the end time as last read while the generation ran (every minute: a shortened limit is in
    # it); not the one Slurm shows now, which a cancellation sets to the moment of the cancel
    end_time = sup.timing.end
    if info.get("JobState") == "TIMEOUT" and sup.terminated_at:
        end_time = sup.terminated_at
    sigterm_at = sup.terminated_at if end.terminated else None
    requeueing = None
    at_end = sigterm_at is not None and end_time is not None and sigterm_at >= end_time - state.TERM_AT_END_S
    if sigterm_at is not None and end.stop is None and not at_end and sup.job.job_id:
        # a node of the job died (NODE_FAIL), or a preemption's grace time ended before our own
        # requeue (PREEMPTED), and Slurm requeues the job itself: its SIGTERM reaches the batch
        # host. Not a cancellation, and not ours to requeue again.
        requeueing = allocation.requeued_by_slurm(sup.job.job_id, sup.job.restart)
    remote, heard = heard_remote(sup)
    launch_failed = sorted(set(failures.launch_failed(end.srun_errors)) - sup.agents.left_out)
    # silent: their agent fell silent and their host did not answer, or srun reached no slurmd there
    silent = sorted({n for n in end.dead_nodes if n not in sup.agents.left_out} | set(launch_failed))
    # a frozen node's kernel accepted the probe: the link to it is fine, the fault is the node's
    vouched = vouched_for(sup, set(silent)) or bool(silent and set(silent) <= end.frozen)
    answers: bool | None = None
    gone: tuple[str, ...] | None = None
    waited = 0.0
    if sup.job.job_id and ((remote and not heard) or (silent and not vouched)):
        # every other node's agent lost, or nodes silent with no other agent heard: dead nodes,
        # or this host cut off? slurmctld tells (asked twice: one slow answer is no cut)
        info = info or ask_job(sup)
        answers = bool(info)
        if answers and silent and not vouched:
            # nothing vouches for this host's own link: wait for Slurm's verdict on them
            gone, waited = await_verdict(sup, silent)
            answers = gone is not None
    tag = f"{sup.job.job_id or 'local'}.{sup.job.restart}.{sup.gen}"
    # srun's error lines pile up over the agent step's life: a node swapped out earlier is no
    # cause of this stop (it would have blamed a node already gone, and requeued for it)
    failed_nodes = [n for n in failures.failed_nodes(end.srun_errors) if n not in sup.agents.left_out]
    return Stop(
        returncode=end.returncode,
        now=world.time(),
        stop_cause=end.stop_cause if end.stop else None,
        sigterm_at=sigterm_at,
        end_time=end_time,
        preempting=allocation.preempting(info),
        slurm_requeueing=requeueing,
        hang=end.hang,
        storage_stall=end.storage_stall,
        self_stall=self_stall(sup),
        startup=end.startup,
        too_few=end.too_few,
        ctld_lost=end.ctld_lost,
        ctld_answered=end.ctld_answered,
        failures=tuple(failures.read(sup.run_dir, tag)),
        rank_exits=tuple(end.rank_exits),
        failed_nodes=tuple(failed_nodes),
        launch_failed=tuple(launch_failed),
        vouched=vouched,
        dead_nodes=tuple(sorted(end.dead_nodes.items())),
        agents_died=tuple(sorted(end.agents_died.items())),
        agent_errors=tuple(sorted(end.agent_errors.items())),
        batch_host=sup.node,
        remote_nodes=len(remote),
        remote_heard=len(heard),
        slurmctld_answers=answers,
        slurm_gone=gone,
        verdict_waited_s=round(waited, 3),
        on_slurm=sup.job.ref is not None,
        spares=sup.agents.spares(),
        draining=end.draining if end.stop_cause == Cause.DRAIN else (),
        stragglers=end.slow if end.stop_cause == Cause.STRAGGLER else (),
        trained_nodes=len(sup.agents.layout) or sup.agents.size,
        trainers=tuple(sup.agents.layout),
        usable_nodes=tuple(n for n in sup.job.nodes if n not in sup.agents.left_out),
        shrinkable=sup.agents.no_kill,
        joined=sup.agents.joined,
    )


def ask_why_again(sup: SupervisorState, end: GenerationEnd, tries: int = 3) -> None:
    """The ranks have saved: there is time now to learn what the stop signal was. A "signal"
    (sent by hand) is asked again too: the time-limit warning for a shortened limit can arrive
    before a query shows the new EndTime (seen on the dev cluster right after `scontrol update`)."""
    if end.stop is None or end.stop_time is None or (end.stop_cause_asked and end.stop_cause != Cause.SIGNAL):
        return
    for i in range(tries):
        cause = sup.timing.cause_of(end.stop_time)
        if cause is not None:
            end.stop_cause, end.stop_cause_asked = cause, True
            return
        if i + 1 < tries:
            world.sleep(2)


def self_stall(sup: SupervisorState) -> str | None:
    """This process went without a ping for longer than its agents wait for one (its host
    frozen, or starved): they have ended their ranks, and every node would look dead."""
    gap = sup.agents.fleet.take_stall()
    if gap <= sup.silent_s:
        return None
    why = f"the supervisor's own loop stalled for {gap:.1f} s (its host frozen?), longer than its agents wait"
    log.error("hpc_llm supervisor: %s", why)
    return why


def ask_job(sup: SupervisorState, tries: int = 2) -> dict[str, str]:
    """``scontrol show job``, asked ``tries`` times ({} when slurmctld never answered)."""
    for i in range(tries):
        info = sup.job_info()
        if info:
            return info
        if i + 1 < tries:
            world.sleep(2.0)
    return {}


def vouched_for(sup: SupervisorState, silent: set[str]) -> bool:
    """Some other node's agent (one of the generation's, or a spare's) is heard now: this host's
    link to the fabric works, and the silent nodes' silence is theirs."""
    view = sup.agents.fleet.view()
    now = world.monotonic()
    recent = sup.policy.node_timeout_s
    return any(
        n != sup.node
        and n not in silent
        and n not in sup.agents.left_out
        and a.state == "warm"
        and now - a.last_heard <= recent
        for n, a in view.items()
    )


#: seconds between questions to slurmctld while the supervisor waits for its verdict
VERDICT_POLL_S = 2.0


def await_verdict(sup: SupervisorState, silent: list[str]) -> tuple[tuple[str, ...] | None, float]:
    """Slurm's verdict on nodes that went silent when nothing vouched for this host's link: those
    of them slurmctld finds DOWN or NOT_RESPONDING, asked until it finds one or SlurmdTimeout, a
    ping interval (a third of it) and MessageTimeout have passed since their silence began
    (slurmctld marks a node it cannot ping NOT_RESPONDING within a ping interval and
    MessageTimeout, and DOWN at SlurmdTimeout). Returns them (empty: every one still responds to
    slurmctld) and the seconds waited; None when slurmctld never answered."""
    view = sup.agents.fleet.view()
    heard = [view[n].last_heard for n in silent if n in view]
    since = min(heard) if heard else world.monotonic()
    t = sup.slurmd_timeout_s
    deadline = since + t + t / 3 + sup.message_timeout_s
    start = world.monotonic()
    found: list[str] | None = None
    while True:
        found = allocation.nodes_gone(silent)
        if found:
            break
        if world.monotonic() >= deadline or sup.terminated_at:
            break
        world.sleep(VERDICT_POLL_S)
    waited = world.monotonic() - start
    if found:
        log.warning("hpc_llm supervisor: slurmctld finds %s not responding too (%.0f s)", ",".join(found), waited)
    return (None if found is None else tuple(found)), waited


def heard_remote(sup: SupervisorState) -> tuple[list[str], list[str]]:
    """The generation's nodes other than the batch host, and those whose agent is still heard."""
    view = sup.agents.fleet.view()
    remote = [n for n in sup.agents.layout if n != sup.node]
    heard = [n for n in remote if n in view and view[n].alive and view[n].state != "suspect"]
    return remote, heard
