"""A job's whole history from Slurm accounting (``sacct``), with squeue as the fallback.

``sacct -X -D`` gives one row per attempt of an allocation (``-D``: the
duplicates a requeue leaves; without it only the latest attempt shows):
state (REQUEUED, PREEMPTED, NODE_FAIL, TIMEOUT, OUT_OF_MEMORY, CANCELLED,
FAILED, COMPLETED), reason, submit/start/end, elapsed, nodes, exit code and
AllocTRES (``cpu=16,gres/gpu=16,node=2``: the GPU-hours budget). Slurm 22.05
has no ``Restarts`` field (24.11 has, and ``FailedNode``; 22.05 refuses a field it does not
know): attempts are counted from these rows, on both.

A failed query is *unknown*, retried with backoff, never "finished". A job
that left squeue may not be in sacct yet (slurmdbd lags under load): callers
poll with :func:`settled`. Without accounting (``accounting_storage/none``)
:func:`available` is False; callers fall back to squeue and the run's own
files, and say so once.
"""

from __future__ import annotations

import datetime as dt
import os
from dataclasses import dataclass, field

from hpc_llm import errors, world
from hpc_llm.slurm.commands import SlurmUnreachable, run

FIELDS = (
    "JobID",
    "JobIDRaw",
    "State",
    "Reason",
    "Submit",
    "Start",
    "End",
    "ElapsedRaw",
    "NodeList",
    "ExitCode",
    "AllocTRES",
)
#: states a job attempt ends in (a REQUEUED/PREEMPTED/NODE_FAIL attempt may be followed by another)
ENDED = frozenset(
    {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY", "REQUEUED", "BOOT_FAIL"}
)


@dataclass(frozen=True)
class AttemptRow:
    job_id: str
    state: str  # first word: "CANCELLED by 0" -> CANCELLED
    reason: str
    submit: float | None
    start: float | None
    end: float | None
    elapsed_s: int
    nodelist: str
    exit_code: str
    tres: dict[str, str] = field(default_factory=dict)

    @property
    def gpus(self) -> int:
        return int(self.tres.get("gres/gpu", 0) or 0)

    @property
    def cpus(self) -> int:
        return int(self.tres.get("cpu", 0) or 0)

    @property
    def verdict(self) -> str:
        """How Slurm says this attempt ended: 'Slurm: FAILED (reason), exit code 3:0'."""
        reason = f" ({self.reason})" if self.reason and self.reason != "None" else ""
        return f"Slurm: {self.state}{reason}, exit code {self.exit_code}"

    @property
    def queue_wait_s(self) -> float | None:
        return self.start - self.submit if self.start and self.submit and self.start >= self.submit else None


def _time(text: str) -> float | None:
    if not text or text in ("Unknown", "None"):
        return None
    try:
        return dt.datetime.fromisoformat(text).timestamp()
    except ValueError:
        return None


def parse(out: str) -> dict[str, list[AttemptRow]]:
    """sacct -P rows (FIELDS) -> attempts by job id, oldest first."""
    rows: dict[str, list[AttemptRow]] = {}
    for line in out.splitlines():
        parts = line.split("|")
        if len(parts) != len(FIELDS):
            continue
        jid, raw, state, reason, submit, start, end, elapsed, nodes, code, tres = parts
        row = AttemptRow(
            job_id=jid,
            state=(state.split() or ["UNKNOWN"])[0],
            reason=reason,
            submit=_time(submit),
            start=_time(start),
            end=_time(end),
            elapsed_s=int(elapsed) if elapsed.isdigit() else 0,
            nodelist=nodes,
            exit_code=code,
            tres=dict(kv.split("=", 1) for kv in tres.split(",") if "=" in kv),
        )
        rows.setdefault(jid, []).append(row)
        if raw != jid:  # an array task: also under its own numeric id (its SLURM_JOB_ID)
            rows.setdefault(raw, []).append(row)
    for attempts in rows.values():
        attempts.sort(key=lambda r: (r.submit or 0, r.start or 0))
    return rows


def available() -> bool:
    """Whether this cluster keeps accounting (asked once per process)."""
    known = world.local()
    if known.get("sacct") is None:
        conf = world.environ().get("SLURM_CONF") or "/etc/slurm/slurm.conf"
        if world.which("sacct") is None or not os.path.isfile(conf):
            # no cluster configured here: sacct would first spend ~20 s looking for one in DNS
            known["sacct"] = False
        else:
            out = _sacct(["-n", "-X", "-j", "1", "-o", "JobID"])
            known["sacct"] = out is not None
    return bool(known["sacct"])


def _sacct(args: list[str], timeout: float = 20) -> str | None:
    try:
        out = run(["sacct", *args], timeout=timeout)
    except SlurmUnreachable:
        return None
    if out.returncode != 0:
        return None  # slurmdbd down, accounting disabled ("Slurm accounting storage is disabled")
    return out.stdout


def attempts(job_ids: list[str], *, tries: int = 3, backoff_s: float = 1.0) -> dict[str, list[AttemptRow]] | None:
    """Every attempt of these jobs (array tasks as ``A_i``); None when sacct could not be asked
    (after ``tries`` with growing waits): unknown, not finished."""
    if not job_ids:
        return {}
    if not available():
        return None
    args = ["-n", "-X", "-D", "-P", "-j", ",".join(job_ids), "-o", ",".join(FIELDS)]
    for i in range(tries):
        out = _sacct(args)
        if out is not None:
            return parse(out)
        world.sleep(backoff_s * (2**i))
    return None


def settled(job_ids: list[str], timeout_s: float = 30.0, poll_s: float = 1.0) -> dict[str, list[AttemptRow]] | None:
    """The attempts once every job's latest attempt has ended (jobs that just left squeue may
    reach slurmdbd a little later); whatever is known after ``timeout_s``."""
    deadline = world.monotonic() + timeout_s
    while True:
        rows = attempts(job_ids)
        done = rows is not None and all(j in rows and rows[j][-1].state in ENDED for j in job_ids)
        if done or world.monotonic() > deadline:
            return rows
        world.sleep(poll_s)


def final_states(job_ids: list[str]) -> dict[str, str]:
    """The latest attempt's state per job (empty without accounting or when sacct failed)."""
    rows = attempts(job_ids) or {}
    return {j: r[-1].state for j, r in rows.items() if r}


def say_without_accounting() -> None:
    errors.warn_once(
        "this cluster keeps no Slurm accounting (sacct): states come from squeue and the runs' own "
        "files; jobs that died before writing anything show as ENDED"
    )


def resource_hours(rows: list[AttemptRow]) -> tuple[float, str]:
    """GPU-hours over every attempt (CPU-hours when no GPU was allocated) and which."""
    gpu_s = sum(r.gpus * r.elapsed_s for r in rows)
    if gpu_s:
        return gpu_s / 3600, "GPU-hours"
    return sum(r.cpus * r.elapsed_s for r in rows) / 3600, "CPU-hours"


def work_dir(job_id: str) -> str | None:
    """The directory a job was submitted from (``WorkDir``; slurmdbd still has it after
    slurmctld has forgotten the job); None when sacct does not know it or could not be asked."""
    if not available():
        return None
    out = _sacct(["-n", "-X", "-P", "-j", job_id, "-o", "WorkDir"])
    found = [ln.strip() for ln in (out or "").splitlines() if ln.strip()]
    return found[-1] if found else None
