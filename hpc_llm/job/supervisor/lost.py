"""A previous allocation that ended without a record: what the next supervisor books for it.

In-job side, on the batch host, at the start of every allocation. The last
attempt in attempts.json still says ``running`` when its allocation ended with
nobody there to record it: a node failure Slurm requeued, a requeue from
outside, or the batch host's death (its agents requeued the job and left what
they saw in ``.hpc_llm/supervisor_lost.json``: hpc_llm.job.agent.loop).
Stdlib only.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from hpc_llm import world
from hpc_llm.rundir.layout import RunDir
from hpc_llm.rundir.outcome import Action, Cause, State
from hpc_llm.rundir.record import Attempt, Attempts
from hpc_llm.slurm.allocation import SlurmJob, node_gone, previous_state

log = logging.getLogger("hpc_llm.supervisor")


def close(run_dir: Path, job: SlurmJob, attempts: Attempts) -> None:
    """The last attempt still says running and is not this allocation's: say what we know of
    how it ended (Slurm's state, the nodes gone since, what the agents saw) and save it."""
    if not attempts.items or attempts.current.state != State.RUNNING:
        return
    a = attempts.current
    if (a.job_id, a.restart) == (job.job_id, job.restart):
        return
    state, ended = previous_state(a.job_id) if a.job_id else (None, None)
    a.state, a.ended_at = State.LOST, ended or (a.started_at + a.train_s)
    a.decided_at = world.time()
    a.cause = lost_cause(state)
    a.error = (
        f"the allocation ended while training (Slurm state {state})"
        if state
        else "the allocation ended while training, without a record (node failure or a requeue from outside)"
    )
    a.action = Action.REQUEUE
    gone = [n for n in a.nodes if n not in job.nodes]
    if a.cause == Cause.NODE_FAILURE and gone:
        # the nodes of that attempt not in this one, but not those Slurm finds responding: a
        # healthy node the new allocation merely did not get is nobody's suspect
        a.suspects = [n for n in gone if node_gone(n) is not False]
    seen = seen_by_agents(run_dir, a)
    if seen:
        # an agent found this attempt's supervisor gone and requeued the job (--no-kill: Slurm
        # does not): the batch host, and no one else, is to blame
        a.cause, a.suspects = Cause.NODE_FAILURE, [str(seen["node"])]
        a.detected_at, a.decided_at = (
            seen.get("detected_at") or a.decided_at,
            seen.get("requeued_at") or seen.get("taken_over_at"),
        )
        a.error = (
            f"the batch host {seen['node']} died ({seen['how']}); the agent on {seen['by']} "
            f"requeued the job{'' if not seen.get('exclude_error') else ' but could not exclude the host'}"
            + (f"; {seen['shrunk']}" if seen.get("shrunk") else "")
            + (
                f"; no agent could take the supervisor's place: {seen['takeover_refused']}"
                if seen.get("takeover_refused")
                else ""
            )
        )
    attempts.save()
    log.warning("hpc_llm supervisor: previous attempt %s", a.error)


def taken_over(run_dir: Path, job: SlurmJob, attempts: Attempts, host: str) -> int:
    """This supervisor took the place of the one lost with ``host``, in the same allocation
    (hpc_llm.job.agent.takeover): book that supervisor's last attempt (lost, ``node_failure`` on
    ``host`` alone, a swap: the next generation runs here without it) and return the generation
    to run next."""
    mine = [a for a in attempts.items if (a.job_id, a.restart) == (job.job_id, job.restart)]
    if not mine:
        return 0
    a = mine[-1]
    seen = seen_by_agents(run_dir, a) or {}
    if a.state == State.RUNNING:
        now = world.time()
        a.state, a.cause, a.action = State.LOST, Cause.NODE_FAILURE, Action.SWAP
        a.suspects, a.left_out = [host], [host]
        a.detected_at = seen.get("detected_at") or a.detected_at or now
        a.ended_at = a.ended_at or a.detected_at
        a.decided_at = seen.get("taken_over_at") or now
        a.error = (
            f"the supervisor's host {host} was lost ({seen.get('how') or 'gone'}); the agent on "
            f"{seen.get('by') or '?'} took its place in the same job"
        )
        attempts.save()
        log.warning("hpc_llm supervisor: previous generation: %s", a.error)
    return a.generation + 1


def supervisor_died(job: SlurmJob, attempts: Attempts, status: str | None) -> int:
    """This supervisor was started again by the batch script (sbatch_templates/default.sh.j2)
    after the one before it died of a signal (exit ``status``): book that one's last attempt of
    this allocation (lost, the supervisor's failure: nobody blamed, a restart here) and return the
    generation to run next."""
    mine = [a for a in attempts.items if (a.job_id, a.restart) == (job.job_id, job.restart)]
    if not mine:
        return 0
    a = mine[-1]
    if a.state == State.RUNNING:
        now = world.time()
        a.state, a.cause, a.action = State.LOST, Cause.FAILURE, Action.RESTART
        a.detected_at = a.detected_at or now
        a.ended_at = a.ended_at or now
        a.decided_at = now
        a.error = (
            f"the supervisor died (exit status {status or '?'}); the batch script started it again in this allocation"
        )
        attempts.save()
        log.warning("hpc_llm supervisor: previous generation: %s", a.error)
    return a.generation + 1


def seen_by_agents(run_dir: Path, a: Attempt) -> dict[str, Any] | None:
    """What an agent recorded when it requeued attempt ``a``'s job (agent.loop), then removed."""
    path = RunDir(run_dir).supervisor_lost
    try:
        seen = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    path.unlink(missing_ok=True)
    ok = isinstance(seen, dict) and (seen.get("job_id"), seen.get("restart")) == (a.job_id, a.restart)
    return seen if ok and seen.get("node") and (seen.get("requeued_at") or seen.get("taken_over_at")) else None


def lost_cause(slurm_state: str | None) -> Cause:
    """The cause of an attempt whose allocation ended without a record, from sacct's state:
    a preempted attempt stays a preemption, whatever stage it died in."""
    if slurm_state == "NODE_FAIL":
        return Cause.NODE_FAILURE
    if slurm_state in ("PREEMPTED",):
        return Cause.PREEMPTION
    if slurm_state == "TIMEOUT":
        return Cause.TIME_LIMIT
    return Cause.LOST
