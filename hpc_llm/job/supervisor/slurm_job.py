"""What the supervisor asks Slurm about its own allocation, and the changes it asks for.

In-job side, on the batch host: ``scontrol show job`` of this job (end time,
nodes, exclusions, a preemption's grace time, whether Slurm is requeueing it),
``sinfo`` for the nodes up in its partition, ``sacct`` for how its previous
run ended (through :mod:`hpc_llm.slurm.accounting`, shared with the login
side), and ``scontrol requeue`` / ``scontrol update ExcNodeList=`` on it.
They are apart from the login side's Slurm calls (:mod:`hpc_llm.slurm`)
because they are about this allocation only, asked from inside it, with short
timeouts so that a slow slurmctld never holds the supervisor's signal path.
Stdlib only.
"""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass, field

from hpc_llm.job.env import JobEnv


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
    def current(cls) -> SlurmJob:
        env = JobEnv.current()
        job_id = env.job_id
        job = cls(job_id, env.ref, env.restart)
        if job_id:
            info = scontrol_show_job(job_id)
            job.start, job.end = slurm_time(info.get("StartTime")), slurm_time(info.get("EndTime"))
            job.nodes = hostnames(info.get("NodeList") or env.nodelist)
            job.excluded = hostnames(info.get("ExcNodeList"))
            job.partition = info.get("Partition")
        return job


def _run(args: list[str], timeout: float = 60, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, **env} if env else None
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, check=False, env=full)


def preempting(info: dict[str, str]) -> bool:
    """``scontrol show job`` has a PreemptTime while a preemption's grace time runs (22.05)."""
    return slurm_time(info.get("PreemptTime")) is not None


def scontrol_show_job(job_id: str) -> dict[str, str]:
    try:
        # epoch seconds, not local time (an hour off in the DST fall-back hour); a short timeout:
        # a slow slurmctld must not hold the signal path (verified: 22.05's scontrol honours it)
        out = _run(["scontrol", "show", "job", "-o", job_id], timeout=10, env={"SLURM_TIME_FORMAT": "%s"})
    except (OSError, subprocess.SubprocessError):
        return {}
    return parse_show_job_o(out.stdout)


def parse_show_job_o(out: str) -> dict[str, str]:
    """``scontrol show job -o`` (one job, one line) as its fields; a key's first value wins
    (22.05 prints TRES=, 24.11 ReqTRES= and AllocTRES=; neither is read here)."""
    info: dict[str, str] = {}
    for token in out.split():
        if "=" in token:
            key, value = token.split("=", 1)
            info.setdefault(key, value)
    return info


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
        info = scontrol_show_job(job_id)
        seen = requeueing(info, restart)
        if seen is not None:
            return info.get("JobState", "") if seen else None
        if i + 1 < tries:
            time.sleep(pause_s)
    return None


#: Slurm >= 24.05 books a batch job that ends after its preemption's grace-time signal as
#: PREEMPTED and requeues it (proc_req.c, the job's GRACE_PREEMPT flag: SchedMD commit a689104d,
#: "Treat jobs completing after being signalled for GraceTime as preempted"). The flag is cleared
#: on that path only: neither `scontrol requeue` nor slurmctld's own requeue at the end of the
#: grace time clears it. Seen on 24.11.5 (22.05 has no such flag): after the supervisor's own
#: `scontrol requeue` of a preempted run, the next attempt trained to the end and was booked
#: PREEMPTED and requeued once more (a third attempt, "nothing to do"); with Requeue=0 set before
#: that end it was not requeued but still booked PREEMPTED. So on >= 24.05 the supervisor ends the
#: batch script in the grace time instead of `scontrol requeue` (:func:`requeued_by_ending`: one
#: PREEMPTED row, then COMPLETED), and sets Requeue=0 before any end for good
#: (:func:`ending_for_good`), for a flag left by slurmctld's own requeue (a save longer than the
#: grace time): such a run is not started again, only booked PREEMPTED.
GRACE_PREEMPT_REQUEUES_SINCE = (24, 5)
_version: tuple[int, int] | None = None


def parse_version(text: str) -> tuple[int, int] | None:
    """``scontrol --version`` ("slurm-wlm 24.11.5", "slurm 22.05.8") -> (24, 11)."""
    for word in text.split():
        parts = word.split(".")
        if len(parts) >= 2 and parts[0].isdigit() and parts[1].isdigit():
            return int(parts[0]), int(parts[1])
    return None


def slurm_version() -> tuple[int, int] | None:
    """This Slurm's release, from ``scontrol --version`` (asked once; None when it cannot be)."""
    global _version
    if _version is None:
        try:
            _version = parse_version(_run(["scontrol", "--version"], timeout=10).stdout)
        except (OSError, subprocess.SubprocessError):
            return None
    return _version


def requeued_by_ending(job_id: str | None, partition: str | None = None) -> bool:
    """Whether the end of this batch script is itself the job's requeue: on Slurm >= 24.05, in a
    preemption's grace time (PreemptTime set), for a --requeue job on a partition that preempts by
    REQUEUE. Slurm then books the attempt PREEMPTED, requeues the job and clears its grace-time
    flag; `scontrol requeue` instead would leave the flag set (GRACE_PREEMPT_REQUEUES_SINCE).
    False when any of it is not so, or cannot be asked: `scontrol requeue` as on 22.05. (A new
    ExcNodeList needs that too: Slurm takes it only once the job is pending again, "Job is no
    longer pending execution" on a running one, seen on 24.11; 22.05's job_mgr.c has the same
    ESLURM_JOB_NOT_PENDING check.)"""
    version = slurm_version()
    if not job_id or version is None or version < GRACE_PREEMPT_REQUEUES_SINCE:
        return False
    info = scontrol_show_job(job_id)
    if not preempting(info) or info.get("Requeue") != "1":
        return False
    part = info.get("Partition") or partition
    try:
        out = _run(["scontrol", "show", "partition", "-o", part], timeout=10) if part else None
    except (OSError, subprocess.SubprocessError):
        return False
    return out is not None and "REQUEUE" in parse_show_job_o(out.stdout).get("PreemptMode", "")


def ending_for_good(ref: str) -> str | None:
    """The batch script is about to end and the job must not come back (the run is done, or
    failed): on Slurm >= 24.05 set the job's Requeue=0, so that an earlier preemption's grace-time
    flag cannot requeue it (GRACE_PREEMPT_REQUEUES_SINCE). None when done or not needed, else
    Slurm's complaint (the run's outcome stands either way)."""
    version = slurm_version()
    if version is None or version < GRACE_PREEMPT_REQUEUES_SINCE:
        return None
    try:
        out = _run(["scontrol", "update", f"JobId={ref}", "Requeue=0"], timeout=10)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return None if out.returncode == 0 else (" ".join(out.stderr.split()) or f"exit {out.returncode}")


def slurm_time(text: str | None) -> float | None:
    if not text or text in ("Unknown", "None", "(null)"):
        return None
    if text.isdigit():  # SLURM_TIME_FORMAT=%s
        return float(text) or None
    try:
        return time.mktime(time.strptime(text, "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None


def hostnames(nodelist: str | None) -> list[str]:
    if not nodelist or nodelist in ("(null)", "None"):
        return []
    try:
        out = _run(["scontrol", "show", "hostnames", nodelist])
        if out.returncode == 0:
            return [n for n in out.stdout.split() if n]
    except (OSError, subprocess.SubprocessError):
        pass
    return [n for n in nodelist.split(",") if n]


#: sinfo's short states of a node that cannot take a job (down, drained or draining, failing)
_NOT_UP = ("down", "drain", "drng", "fail", "maint", "unk", "boot", "npc", "inval", "futr", "pow")


def nodes_up(partition: str | None) -> list[str]:
    """Nodes of ``partition`` that can run a job now ([] when sinfo cannot be asked)."""
    if not partition:
        return []
    try:
        out = _run(["sinfo", "-h", "-p", partition, "-N", "-o", "%N %t"], timeout=10)
    except (OSError, subprocess.SubprocessError):
        return []
    return parse_nodes_up(out.stdout)


def _short_state(state: str) -> str:
    """sinfo's ``%t`` without its trailing flags (``*`` not responding, ``~`` powered off, ...)."""
    return state.rstrip("*~#!%$@^-")


def parse_nodes_up(out: str) -> list[str]:
    """``sinfo -h -N -o '%N %t'`` -> the nodes that can take a job. After a node death 24.11 showed
    the survivors of its job ``comp`` (completing) for a while, 22.05 ``idle``: both are up."""
    up = set()
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 2 and not _short_state(parts[1]).startswith(_NOT_UP):
            up.add(parts[0])
    return sorted(up)


def requeue_job(ref: str) -> str | None:
    """None when Slurm accepted the requeue, else its one-line complaint."""
    try:
        out = _run(["scontrol", "requeue", ref])
    except (OSError, subprocess.SubprocessError) as exc:
        return f"{type(exc).__name__}: {exc}"
    said = " ".join(out.stderr.split())
    if out.returncode == 0 or "Job is pending execution" in said:
        # ESLURM_JOB_PENDING (job_mgr.c, _job_requeue_op): slurmctld requeued the job itself first
        # (a preemption whose grace time ended, a node failure) while this stop was decided; what
        # we asked for has happened (seen on the dev cluster: a preemption in the post-train
        # stage was failed for it)
        return None
    return said or f"exit {out.returncode}"


def node_gone(name: str) -> bool | None:
    """Whether Slurm has found node ``name`` dead: DOWN, or NOT_RESPONDING (a ping missed;
    DOWN follows after SlurmdTimeout). None when scontrol cannot tell."""
    try:
        out = _run(["scontrol", "show", "node", "-o", name], timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    return state_gone(parse_show_job_o(out.stdout).get("State", ""))


def state_gone(state: str) -> bool:
    """``scontrol show node``'s State (``IDLE+NOT_RESPONDING``, ``DOWN+DRAIN+NOT_RESPONDING``;
    sinfo's ``down*`` too) says the node is dead or missed slurmctld's pings."""
    flags = set(state.upper().replace("*", "+NOT_RESPONDING").split("+"))
    return bool({"DOWN", "NOT_RESPONDING"} & flags)


#: sinfo's short states of a node being drained: allocated (draining) or already idle (drained)
_DRAINING = ("drng", "drain")


def draining(nodes: list[str]) -> list[str] | None:
    """The nodes of ``nodes`` an operator is draining (planned maintenance), or None when sinfo
    cannot tell. One call for the whole list (slurmctld answers from its node table)."""
    try:
        # a short timeout: the supervisor's loop waits on it (a preemption's signal too)
        out = _run(["sinfo", "-h", "-N", "-n", ",".join(nodes), "-o", "%N %t"], timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return parse_draining(out.stdout) if out.returncode == 0 else None


def parse_draining(out: str) -> list[str]:
    """``sinfo -h -N -o "%N %t"`` lines: the nodes whose state is draining or drained (a trailing
    ``*``, ``~``, ``#``... flag kept off: a drained node not responding is still drained)."""
    found = set()
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 2 and _short_state(parts[1]) in _DRAINING:
            found.add(parts[0])
    return sorted(found)


#: tries of ``scontrol update`` a second apart while the requeued job is not pending yet
SHRINK_TRIES = 5


def fit_partition(
    asked: int, full: int, needed: int, excluded: list[str], partition: str | None
) -> tuple[int, str] | None:
    """How many nodes a requeued job should ask for, and why; None when it fits as it is (or
    sinfo cannot tell). ``asked``: the nodes it asks for now; ``full``: the run's ``needed``
    and its spares, as submitted. With fewer up in ``partition`` outside ``excluded`` than it
    asks for, it asks for what is up, never fewer than ``needed``: the run starts with fewer
    spares rather than pending for nodes that may never come back (a dead node stays DOWN until
    an operator returns it). With more up again, a job shrunk before asks for its spares back.
    Decided before the requeue (the requeue ends the agents' step), applied after it by
    :func:`update_pending` (only a pending job's size can change)."""
    up = nodes_up(partition)
    if not up or full <= needed:
        return None
    free = len([n for n in up if n not in excluded])
    want = min(full, max(free, needed))
    if want == asked:
        return None
    if want < asked:
        why = (
            f"only {free} node(s) of partition {partition} are up outside the excluded: the job now asks for "
            f"{want} ({want - needed} spare(s) instead of {asked - needed})"
        )
    else:
        why = (
            f"{free} node(s) of partition {partition} are up again: the job asks for {want} ({want - needed} spare(s))"
        )
    return want, why


def update_pending(
    ref: str, exclude: list[str] | None = None, nodes: int | None = None, per_node: int = 1
) -> str | None:
    """One ``scontrol update`` of the job just requeued: its ``ExcNodeList`` and/or its size
    (``NumNodes`` and ``NumTasks``: see :func:`fit_partition`). None when Slurm took it, else
    its one-line complaint. Asked again for a few seconds while slurmctld does not see the job
    pending yet. One call, not one per field: after an agent's requeue, Slurm is ending the
    agent's own step.

    Verified on the dev cluster (22.05), as a user who is not an operator, on a pending 3-node
    job with ``--ntasks-per-node=1``: ``NumNodes=2 NumTasks=2`` is accepted and the job starts
    on 2 nodes; ``NumNodes`` alone only lowers ``min_nodes`` (slurmctld: "setting min_nodes from
    3 to 2") and the job, still ``NumTasks=3``, waits for a third; ``NumNodes=3 NumTasks=3``
    afterwards is accepted too (a pending job's size is the user's to change both ways)."""
    fields = [f"ExcNodeList={','.join(exclude)}"] if exclude is not None else []
    if nodes is not None:
        fields += [f"NumNodes={nodes}", f"NumTasks={nodes * per_node}"]
    if not fields:
        return None
    said = ""
    for attempt in range(SHRINK_TRIES):
        try:
            out = _run(["scontrol", "update", f"JobId={ref}", *fields])
        except (OSError, subprocess.SubprocessError) as exc:
            return f"{type(exc).__name__}: {exc}"
        said = " ".join(out.stderr.split())
        # a job just requeued may not be pending yet in slurmctld's view: ask again, briefly
        if out.returncode == 0 or "pending" not in said.lower() or attempt == SHRINK_TRIES - 1:
            break
        time.sleep(1.0)
    return None if out.returncode == 0 else (said or f"exit {out.returncode}")


def exclude(ref: str, nodes: list[str]) -> str | None:
    return update_pending(ref, exclude=nodes)


#: Slurm < 24.05, seen on 22.05.8: a job requeued (`scontrol requeue`) while a dead node still
#: holds it COMPLETING is started again the moment Slurm calls that node DOWN (its begin time was
#: set at the requeue, long past by then), racing the survivors' clean-up of the old allocation:
#: the new batch step failed in job_container/tmpfs ("container_p_join: open failed for
#: .../<job>/.ns") and the job ended FAILED, the run lost. 24.11 requeues at the DOWN and waits
#: cred_expire before the next start (slurmctld: "Requeuing JobId=2" then "Allocate" 11 s later).
REQUEUE_DELAY_SINCE = (24, 5)


def slurm_config() -> dict[str, str]:
    """``scontrol show config`` as key -> value ({} when it cannot be asked)."""
    try:
        out = _run(["scontrol", "show", "config"], timeout=10)
    except (OSError, subprocess.SubprocessError):
        return {}
    return parse_config(out.stdout)


def parse_config(text: str) -> dict[str, str]:
    conf: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() and " " not in key.strip():
            conf.setdefault(key.strip(), value.strip())
    return conf


def slurmd_timeout_s(conf: dict[str, str]) -> int:
    """``SlurmdTimeout`` of ``scontrol show config`` ("300 sec"), Slurm's default when unreadable."""
    words = (conf.get("SlurmdTimeout") or "").split()
    return int(words[0]) if words and words[0].isdigit() else 300


def hold_after_dead_node(conf: dict[str, str]) -> int:
    """Seconds a job requeued around a dead node must not start again (Slurm < 24.05,
    REQUEUE_DELAY_SINCE): until Slurm can have called the node DOWN (SlurmdTimeout and up to a
    third more), plus the cred_expire Slurm's own requeue would wait after that."""
    slurmd = slurmd_timeout_s(conf)
    cred = 120
    for part in (conf.get("AuthInfo") or "").split(","):
        if part.strip().startswith("cred_expire="):
            cred = int(part.split("=", 1)[1])
    return int(slurmd * 4 / 3) + cred


def hold_if_dead_node_lingers(ref: str) -> str | None:
    """On Slurm < 24.05 (REQUEUE_DELAY_SINCE), hold a job just requeued around a dead node until
    Slurm has let that node go (:func:`hold_after_dead_node`); None when held or not needed,
    else why it could not be."""
    version = slurm_version()
    if version is None or version >= REQUEUE_DELAY_SINCE:
        return None
    return hold_start(ref, hold_after_dead_node(slurm_config()))


def hold_start(ref: str, seconds: int) -> str | None:
    """The requeued job may not start before ``seconds`` from now (its StartTime)."""
    try:
        out = _run(["scontrol", "update", f"JobId={ref}", f"StartTime=now+{seconds}"], timeout=10)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return None if out.returncode == 0 else (" ".join(out.stderr.split()) or f"exit {out.returncode}")


def previous_state(job_id: str) -> tuple[str | None, float | None]:
    """The state and end Slurm's accounting gives the previous run of this job (NODE_FAIL,
    REQUEUED...); (None, None) without accounting or when sacct cannot be asked now."""
    from hpc_llm.slurm import accounting

    rows = (accounting.attempts([job_id], tries=2) or {}).get(job_id, [])
    # the last row is the running allocation; the one before it is the previous run
    if len(rows) < 2:
        return None, None
    return rows[-2].state, rows[-2].end
