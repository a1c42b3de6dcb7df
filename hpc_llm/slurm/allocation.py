"""What the job asks Slurm about its own allocation, from inside it.

The supervisor on the batch host and the agents on the compute nodes ask ``scontrol show job``
of their job (end time, nodes, exclusions, a preemption's grace time, whether Slurm is
requeueing it), ``sinfo`` for the nodes up or draining in its partition, ``scontrol show node``
for a node Slurm may have found dead, and ``sacct`` for how its previous run ended. Short
timeouts: a slow slurmctld must never hold the supervisor's signal path. Slurm not answering is
never an error here: each question says what not knowing means (``{}``, ``None``, ``[]``).
The changes the job asks for (requeue, exclusions, size) are :mod:`hpc_llm.slurm.requeue`.
Stdlib only.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hpc_llm import world
from hpc_llm.slurm import parse
from hpc_llm.slurm.commands import SlurmUnreachable, run


@dataclass
class SlurmJob:
    """What ``scontrol show job`` says about this allocation (all optional off Slurm)."""

    job_id: str | None
    #: what scontrol requeue/update take: <array job>_<task> for an array task
    ref: str | None
    restart: int
    start: float | None = None
    end: float | None = None
    nodes: list[str] = field(default_factory=list)
    excluded: list[str] = field(default_factory=list)
    partition: str | None = None

    @classmethod
    def ask(cls, job_id: str | None, ref: str | None, restart: int, nodelist: str | None) -> SlurmJob:
        """This allocation as slurmctld has it now (``nodelist``: SLURM_JOB_NODELIST, for when
        it does not answer)."""
        job = cls(job_id, ref, restart)
        if job_id:
            info = show_job(job_id)
            job.start, job.end = parse.slurm_time(info.get("StartTime")), parse.slurm_time(info.get("EndTime"))
            job.nodes = hostnames(info.get("NodeList") or nodelist)
            job.excluded = hostnames(info.get("ExcNodeList"))
            job.partition = info.get("Partition")
        return job


def show_job(job_id: str, timeout: float = 10) -> dict[str, str]:
    """``scontrol show job`` of this job now; {} when slurmctld did not answer."""
    try:
        # epoch seconds, not local time (an hour off in the DST fall-back hour); a short timeout:
        # a slow slurmctld must not hold the signal path (verified: 22.05's scontrol honours it)
        out = run(["scontrol", "show", "job", "-o", job_id], timeout=timeout, env={"SLURM_TIME_FORMAT": "%s"})
    except SlurmUnreachable:
        return {}
    return parse.show_job(out.stdout)


def preempting(info: dict[str, str]) -> bool:
    """``scontrol show job`` has a PreemptTime while a preemption's grace time runs (22.05)."""
    return parse.slurm_time(info.get("PreemptTime")) is not None


def preempted_here(info: dict[str, str]) -> bool:
    """Slurm requeued a preempted job at the end of its grace time and waits for this allocation's
    processes to end (PREEMPTED, or COMPLETING with a PreemptTime): the next allocation cannot
    start before they have, so its supervisor still books its attempt (test_post_train_stop)."""
    state = info.get("JobState")
    return state == "PREEMPTED" or (state == "COMPLETING" and preempting(info))


#: scontrol JobStates of a job Slurm is putting back in the queue. A node failure with --requeue,
#: polled every 0.2 s: 22.05 went RUNNING -> PENDING (Reason=BeginTime) with Restarts one higher;
#: 24.11 RUNNING -> COMPLETING (FailedNode=<the dead node>, Restarts already one higher, the
#: survivors still in NodeList) -> PENDING. The Restarts count is what tells both apart from a cancel.
REQUEUE_STATES = ("NODE_FAIL", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "PENDING", "PREEMPTED")


def requeueing(info: dict[str, str], restart: int) -> bool | None:
    """Whether ``scontrol show job`` says Slurm is putting this allocation (restart count
    ``restart``) back in the queue: False for a cancel, None while it cannot tell yet (RUNNING or
    COMPLETING with the same restart count: slurmctld may not have moved the job yet)."""
    state = info.get("JobState", "")
    if state.startswith("CANCELLED"):
        return False
    if state in REQUEUE_STATES or int(info.get("Restarts", "0") or 0) > restart:
        return True
    return None


def requeued_by_slurm(job_id: str, restart: int, tries: int = 5, pause_s: float = 1.0) -> str | None:
    """The JobState when the SIGTERM we got is Slurm ending this allocation to requeue the job
    (a node failure), None when it is anything else (scancel: CANCELLED). A job still RUNNING
    or COMPLETING is asked again: slurmctld may not have moved it yet."""
    for i in range(tries):
        info = show_job(job_id)
        seen = requeueing(info, restart)
        if seen is not None:
            return info.get("JobState", "") if seen else None
        if i + 1 < tries:
            world.sleep(pause_s)
    return None


def still_this_allocation(info: dict[str, str], restart: int) -> bool:
    """The job still runs the allocation of restart count ``restart`` (not requeued, not ended)."""
    return info.get("JobState") == "RUNNING" and info.get("Restarts", "0") == str(restart)


def slurm_version() -> tuple[int, int] | None:
    """This Slurm's release, from ``scontrol --version`` (asked once per process; None when it
    cannot be)."""
    known = world.local()
    if known.get("slurm_version") is None:
        try:
            known["slurm_version"] = parse.version(run(["scontrol", "--version"], timeout=10).stdout)
        except SlurmUnreachable:
            return None
    found: tuple[int, int] | None = known["slurm_version"]
    return found


def slurm_config() -> dict[str, str]:
    """``scontrol show config`` as key -> value ({} when it cannot be asked)."""
    try:
        return parse.show_config(run(["scontrol", "show", "config"], timeout=10).stdout)
    except SlurmUnreachable:
        return {}


def slurmd_timeout_s(conf: dict[str, str]) -> int:
    """``SlurmdTimeout`` of ``scontrol show config`` ("300 sec"), Slurm's default when unreadable."""
    return parse.seconds_setting(conf, "SlurmdTimeout", 300)


def hostnames(nodelist: str | None) -> list[str]:
    """A node list (``n[1-3]``) expanded by ``scontrol show hostnames``; split on commas when
    scontrol cannot be asked."""
    if not nodelist or nodelist in ("(null)", "None"):
        return []
    try:
        out = run(["scontrol", "show", "hostnames", nodelist], timeout=20)
        if out.returncode == 0:
            return [n for n in out.stdout.split() if n]
    except SlurmUnreachable:
        pass
    return [n for n in nodelist.split(",") if n]


def node_states(*, partition: str | None = None, nodes: list[str] | None = None, timeout: float = 10) -> dict[str, str]:
    """``sinfo``'s short state of each node of ``partition`` (or of ``nodes``); {} when sinfo
    cannot be asked."""
    where = ["-p", partition] if partition else ["-n", ",".join(nodes or [])]
    try:
        out = run(["sinfo", "-h", "-N", *where, "-o", parse.STATE_FORMAT], timeout=timeout)
    except SlurmUnreachable:
        return {}
    return parse.node_states(out.stdout) if out.returncode == 0 else {}


def partition_up(partition: str | None, known_up: tuple[str, ...] = ()) -> list[str] | None:
    """Nodes of ``partition`` that can run a job now, with ``known_up`` (the caller's own node: up
    whatever sinfo says, which may call it not responding a while after a healed cut); None when
    sinfo cannot be asked (or there is no partition): not knowing is not "none up"."""
    states = node_states(partition=partition) if partition else {}
    if not states:
        return None
    return sorted({*parse.up(states), *(n for n in known_up if n in states)})


def draining(nodes: list[str]) -> list[str] | None:
    """The nodes of ``nodes`` an operator is draining (planned maintenance), or None when sinfo
    cannot tell. One call for the whole list (slurmctld answers from its node table); a short
    timeout: the supervisor's loop waits on it (a preemption's signal too)."""
    states = node_states(nodes=nodes, timeout=5)
    return parse.draining(states) if states else None


def slurmd_addresses(nodes: list[str]) -> dict[str, tuple[str, int]]:
    """Where each node's slurmd listens (NodeAddr, Port), asked once ({} when it cannot be)."""
    if not nodes:
        return {}
    try:
        out = run(["scontrol", "show", "node", "-o", ",".join(nodes)], timeout=10)
    except SlurmUnreachable:
        return {}
    return parse.slurmd_addresses(out.stdout) if out.returncode == 0 else {}


def slurmd_answers(address: tuple[str, int], timeout_s: float = 1.0) -> bool:
    """A node's slurmd accepts a TCP connection: its host is up and reachable (whatever became
    of the processes the job runs there)."""
    try:
        world.connect(address[0], address[1], timeout_s).close()
    except OSError:
        return False
    return True


def node_gone(name: str) -> bool | None:
    """Whether Slurm has found node ``name`` dead: DOWN, or NOT_RESPONDING (a ping missed;
    DOWN follows after SlurmdTimeout). None when scontrol cannot tell."""
    gone = nodes_gone([name])
    return None if gone is None else name in gone


def nodes_gone(names: list[str]) -> list[str] | None:
    """Which of ``names`` slurmctld has found dead: DOWN, or NOT_RESPONDING (one question for all
    of them). None when scontrol cannot tell."""
    try:
        out = run(["scontrol", "show", "node", "-o", ",".join(names)], timeout=20)
    except SlurmUnreachable:
        return None
    return parse.gone_nodes(out.stdout) if out.returncode == 0 else None


def previous_state(job_id: str) -> tuple[str | None, float | None]:
    """The state and end Slurm's accounting gives the previous run of this job (NODE_FAIL,
    REQUEUED...); (None, None) without accounting or when sacct cannot be asked now."""
    from hpc_llm.slurm import accounting

    rows = (accounting.attempts([job_id], tries=2) or {}).get(job_id, [])
    # the last row is the running allocation; the one before it is the previous run
    if len(rows) < 2:
        return None, None
    return rows[-2].state, rows[-2].end
