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
    info: dict[str, str] = {}
    for token in out.stdout.split():
        if "=" in token:
            key, value = token.split("=", 1)
            info.setdefault(key, value)
    return info


#: scontrol JobStates of a job Slurm is putting back in the queue (verified on 22.05: a
#: NODE_FAIL with --requeue reads NODE_FAIL, then PENDING with Restarts one higher)
REQUEUE_STATES = ("NODE_FAIL", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "PENDING", "PREEMPTED")


def requeued_by_slurm(job_id: str, restart: int, tries: int = 5, pause_s: float = 1.0) -> str | None:
    """The JobState when the SIGTERM we got is Slurm ending this allocation to requeue the job
    (a node failure), None when it is anything else (scancel: CANCELLED). A job still RUNNING
    or COMPLETING is asked again: slurmctld may not have moved it yet."""
    for i in range(tries):
        info = scontrol_show_job(job_id)
        state = info.get("JobState", "")
        if state.startswith("CANCELLED"):
            return None
        if state in REQUEUE_STATES or int(info.get("Restarts", "0") or 0) > restart:
            return state
        if i + 1 < tries:
            time.sleep(pause_s)
    return None


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
    up = set()
    for line in out.stdout.splitlines():
        parts = line.split()
        if len(parts) == 2 and not parts[1].rstrip("*~#!%$@^-").startswith(_NOT_UP):
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


def exclude(ref: str, nodes: list[str]) -> str | None:
    try:
        out = _run(["scontrol", "update", f"JobId={ref}", f"ExcNodeList={','.join(nodes)}"])
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
