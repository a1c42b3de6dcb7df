"""Small wrappers over Slurm's client commands (sinfo, squeue, scontrol, sacct).

Login node only. Every call has a timeout and a one-line error, so a missing
or unreachable cluster is reported before anything is submitted.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass

from hpc_llm.errors import ConfigError

HOW_TO_START = (
    "start the dev cluster with `hpc-llm dev-cluster up` and run the `export SLURM_CONF=...` "
    "line it prints, or run from a Slurm login node"
)


class SlurmUnreachable(ConfigError):
    """No Slurm answered (no client commands, no config, a controller that does not
    respond): not the same as Slurm answering no."""


@dataclass(frozen=True)
class Partition:
    name: str
    nodes: int
    cpus_per_node: int
    default: bool
    state: str


def _run(args: list[str], timeout: float = 20) -> subprocess.CompletedProcess[str]:
    if shutil.which(args[0]) is None:
        raise SlurmUnreachable(f"no Slurm reachable: `{args[0]}` is not on PATH; {HOW_TO_START}")
    try:
        return subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise SlurmUnreachable(f"no Slurm reachable: `{' '.join(args)}` timed out; {HOW_TO_START}") from None


def partitions() -> dict[str, Partition]:
    gone = _no_config()
    if gone is not None:
        raise gone
    out = _run(["sinfo", "-h", "-o", "%P|%D|%c|%a"])
    if out.returncode != 0:
        err = (out.stderr.strip().splitlines() or ["no output"])[-1]
        raise SlurmUnreachable(f"no Slurm reachable (sinfo: {err}); {HOW_TO_START}")
    parts: dict[str, Partition] = {}
    for line in out.stdout.splitlines():
        if not line.strip():
            continue
        name, nodes, cpus, avail = line.split("|")
        default = name.endswith("*")
        name = name.rstrip("*")
        cpus_n = int(cpus.rstrip("+")) if cpus.rstrip("+").isdigit() else 0
        prev = parts.get(name)
        nodes_n = int(nodes) + (prev.nodes if prev else 0)
        parts[name] = Partition(name, nodes_n, max(cpus_n, prev.cpus_per_node if prev else 0), default, avail)
    return parts


def default_partition(parts: dict[str, Partition]) -> Partition | None:
    return next((p for p in parts.values() if p.default), None)


def job_states(job_ids: list[str]) -> dict[str, str] | None:
    """Current state of each job squeue still knows (PENDING, RUNNING, REQUEUED...); a job
    missing from the answer has left the queue. None when squeue itself failed (slurmctld
    busy or unreachable, RPC limits): nothing is known, and nothing may be called finished."""
    try:
        return queue(job_ids)
    except SlurmUnreachable:
        return None


def unreachable_why(exc: SlurmUnreachable) -> str:
    """What could not be asked, without the how-to-start advice (for a status line)."""
    return str(exc).removeprefix("no Slurm reachable: ").removesuffix(f"; {' '.join(HOW_TO_START.split())}")


def _no_config() -> SlurmUnreachable | None:
    conf = os.environ.get("SLURM_CONF")
    if conf and not os.path.isfile(conf):
        # the client would first spend ~20 s on DNS SRV look-ups for a config server
        return SlurmUnreachable(f"no Slurm reachable: SLURM_CONF={conf} does not exist; {HOW_TO_START}")
    return None


def _asked(args: list[str], unknown_job: str = "Invalid job id") -> str | None:
    """stdout of a Slurm query; None when Slurm answered that it does not know the job(s).
    Raises SlurmUnreachable (its last error line) when Slurm could not be asked at all."""
    gone = _no_config()
    if gone is not None:
        raise gone
    out = _run(args)
    if out.returncode == 0:
        return out.stdout
    if unknown_job in out.stderr:
        return None
    err = (out.stderr.strip().splitlines() or [f"exit status {out.returncode}"])[-1].strip()
    raise SlurmUnreachable(f"no Slurm reachable: {args[0]}: {err}; {HOW_TO_START}")


def queue(job_ids: list[str]) -> dict[str, str]:
    """:func:`job_states`, but a failed squeue raises SlurmUnreachable saying why (the caller
    names it) instead of answering None."""
    if not job_ids:
        return {}
    # -r: one line per array task (pending tasks are otherwise shown collapsed, 12_[3-9%4])
    out = _asked(["squeue", "-h", "-r", "-j", ",".join(job_ids), "-o", "%i|%T"])
    # None: every id unknown to slurmctld (gone past MinJobAge): they have all left the queue
    states: dict[str, str] = {}
    for line in (out or "").splitlines():
        if "|" in line:
            jid, state = line.split("|", 1)
            states[jid.strip()] = state.strip()
    return states


#: ``scontrol show job`` fields that fill their line (a path may hold spaces)
_WHOLE_LINE = ("Command", "WorkDir", "StdErr", "StdIn", "StdOut")


def parse_show_job(out: str) -> dict[str, str]:
    """``scontrol show job`` (one job) as its fields: JobState, WorkDir, StdOut, ArrayJobId..."""
    fields: dict[str, str] = {}
    for line in out.splitlines():
        text = line.strip()
        key, _, value = text.partition("=")
        if key in _WHOLE_LINE:
            fields[key] = value
            continue
        for token in text.split():
            k, sep, v = token.partition("=")
            if sep:
                fields.setdefault(k, v)
    return fields


def show_job(job_id: str) -> dict[str, str] | None:
    """A job's fields from slurmctld (``scontrol show job``); None when it does not know the
    job (never submitted, or gone past MinJobAge). Raises SlurmUnreachable."""
    out = _asked(["scontrol", "show", "job", job_id])
    return parse_show_job(out) if out else None


#: flags that say nothing about whether the scheduler could run the job
_NOT_ASKED = ("output", "open_mode", "signal", "export", "job_name", "requeue")


def test_only(flags: dict[str, object]) -> str | None:
    """``sbatch --test-only`` for a job of these #SBATCH flags: None if the scheduler could run
    it, else its reason ("Requested node configuration is not available", ...). Nothing is
    queued; each call uses up one job id."""
    args = ["sbatch", "--test-only", "--wrap=true"]
    for key, value in sorted(flags.items()):
        if key in _NOT_ASKED or value is None or value is False:
            continue
        args.append(f"--{key.replace('_', '-')}" + ("" if value is True else f"={value}"))
    out = _run(args, timeout=60)
    if out.returncode == 0:
        return None
    errors = [ln.strip() for ln in out.stderr.splitlines() if "error" in ln.lower()]
    reason = (errors or [out.stderr.strip() or f"sbatch --test-only exited with {out.returncode}"])[-1]
    return reason.removeprefix("sbatch: error: ").removeprefix("Batch job submission failed: ")
