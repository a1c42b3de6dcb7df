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


@dataclass(frozen=True)
class Partition:
    name: str
    nodes: int
    cpus_per_node: int
    default: bool
    state: str


def _run(args: list[str], timeout: float = 20) -> subprocess.CompletedProcess[str]:
    if shutil.which(args[0]) is None:
        raise ConfigError(f"no Slurm reachable: `{args[0]}` is not on PATH; {HOW_TO_START}")
    try:
        return subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise ConfigError(f"no Slurm reachable: `{' '.join(args)}` timed out; {HOW_TO_START}") from None


def partitions() -> dict[str, Partition]:
    conf = os.environ.get("SLURM_CONF")
    if conf and not os.path.isfile(conf):
        # sinfo would first spend ~20 s on DNS SRV look-ups for a config server
        raise ConfigError(f"no Slurm reachable: SLURM_CONF={conf} does not exist; {HOW_TO_START}")
    out = _run(["sinfo", "-h", "-o", "%P|%D|%c|%a"])
    if out.returncode != 0:
        err = (out.stderr.strip().splitlines() or ["no output"])[-1]
        raise ConfigError(f"no Slurm reachable (sinfo: {err}); {HOW_TO_START}")
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
    if not job_ids:
        return {}
    try:
        # -r: one line per array task (pending tasks are otherwise shown collapsed, 12_[3-9%4])
        out = _run(["squeue", "-h", "-r", "-j", ",".join(job_ids), "-o", "%i|%T"])
    except ConfigError:
        return None
    if out.returncode != 0:
        # every id unknown to slurmctld (gone past MinJobAge): they have all left the queue
        return {} if "Invalid job id" in out.stderr else None
    states: dict[str, str] = {}
    for line in out.stdout.splitlines():
        if "|" in line:
            jid, state = line.split("|", 1)
            states[jid.strip()] = state.strip()
    return states


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
