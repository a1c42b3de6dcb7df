"""Small wrappers over Slurm's client commands (sinfo, squeue, scontrol, sacct).

Login node only. Every call has a timeout and a one-line error, so a missing
or unreachable cluster is reported before anything is submitted.
"""

from __future__ import annotations

import os
import re
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
    return parse_partitions(out.stdout)


def parse_partitions(out: str) -> dict[str, Partition]:
    """``sinfo -h -o '%P|%D|%c|%a'`` (a partition may take several lines, one per node shape)."""
    parts: dict[str, Partition] = {}
    for line in out.splitlines():
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
    return parse_queue(out or "")


def parse_queue(out: str) -> dict[str, str]:
    """``squeue -h -r -o '%i|%T'`` -> job id (``A_i`` for an array task) -> state."""
    states: dict[str, str] = {}
    for line in out.splitlines():
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
    return test_only_reason(out.returncode, out.stderr)


def test_only_reason(returncode: int, stderr: str) -> str | None:
    """What ``sbatch --test-only`` said: None when accepted ("sbatch: Job 5 to start at ... on
    nodes n[1-2]"), else its reason. 22.05 and 24.11 both refuse with one stderr line,
    "allocation failure: <reason>", and exit 1."""
    if returncode == 0:
        return None
    errors = [ln.strip() for ln in stderr.splitlines() if "error" in ln.lower()]
    reason = (errors or [stderr.strip() or f"sbatch --test-only exited with {returncode}"])[-1]
    return reason.removeprefix("sbatch: error: ").removeprefix("Batch job submission failed: ")


# -- what `hpc-llm doctor` asks: the cluster's settings, partitions, nodes, associations ------


def parse_show_config(out: str) -> dict[str, str]:
    """``scontrol show config`` as its ``Key = value`` lines (values as Slurm prints them:
    ``10 sec``, ``(null)``, ``preempt_send_user_signal``); the header and the controllers'
    status lines are left out."""
    fields: dict[str, str] = {}
    for line in out.splitlines():
        key, sep, value = line.partition("=")
        key = key.strip()
        if not sep or not key or " " in key:
            continue
        fields.setdefault(key, value.strip())
    return fields


#: the version's key in ``scontrol show config`` (a setting there, not an environment variable)
VERSION_KEY = "SLURM_VERSION"


def show_config() -> dict[str, str]:
    """slurmctld's running configuration (``scontrol show config``). Raises SlurmUnreachable."""
    return parse_show_config(_asked(["scontrol", "show", "config"]) or "")


def parse_show_partitions(out: str) -> dict[str, dict[str, str]]:
    """``scontrol show partition`` (every partition) -> name -> its fields (GraceTime,
    PreemptMode, MaxTime, PriorityTier, ...), each record read as :func:`parse_show_job` reads a job."""
    parts: dict[str, dict[str, str]] = {}
    for record in out.split("\n\n"):
        fields = parse_show_job(record)
        if fields.get("PartitionName"):
            parts[fields["PartitionName"]] = fields
    return parts


def show_partitions() -> dict[str, dict[str, str]]:
    """Every partition's settings from slurmctld. Raises SlurmUnreachable."""
    return parse_show_partitions(_asked(["scontrol", "show", "partition"]) or "")


@dataclass(frozen=True)
class Node:
    """One node of one partition, as ``sinfo -N`` shows it."""

    name: str
    partition: str
    #: generic resources as configured: ``gpu:8``, ``gpu:h100:8(S:0-1)``, ``(null)``
    gres: str
    cpus: int
    mem_mb: int
    state: str

    @property
    def gpus(self) -> list[tuple[str | None, int]]:
        """The GPUs of its GRES: ``gpu:h100:8(S:0-1)`` -> [("h100", 8)], ``gpu:8`` -> [(None, 8)]."""
        found: list[tuple[str | None, int]] = []
        for item in re.sub(r"\([^)]*\)", "", self.gres or "").split(","):
            parts = item.strip().split(":")
            if parts[0] == "gpu" and len(parts) >= 2 and parts[-1].isdigit():
                found.append((parts[1] if len(parts) > 2 else None, int(parts[-1])))
        return found

    @property
    def gpu_count(self) -> int:
        return sum(n for _kind, n in self.gpus)


def time_limit_s(text: str | None) -> int | None:
    """A partition's MaxTime as Slurm prints it (``UNLIMITED``, ``1-00:00:00``, ``30:00``) in
    seconds; None: no limit (or one that does not parse)."""
    if not text or text.upper() in ("UNLIMITED", "INFINITE", "NONE"):
        return None
    from hpc_llm.config.plan import parse_time_limit

    try:
        return parse_time_limit(text)
    except ConfigError:
        return None


#: sinfo -N fields of :class:`Node`, in order
_NODE_FORMAT = "%N|%P|%G|%c|%m|%T"


def parse_nodes(out: str) -> list[Node]:
    """``sinfo -N -h -o '%N|%P|%G|%c|%m|%T'`` -> one Node per node and partition."""
    found: list[Node] = []
    for line in out.splitlines():
        parts = line.strip().split("|")
        if len(parts) != 6:
            continue
        name, part, gres, cpus, mem, state = parts
        found.append(Node(name, part.rstrip("*"), gres, _count(cpus), _count(mem), state))
    return found


def _count(text: str) -> int:
    """sinfo's ``16`` or ``16+`` (a range, at least that many); 0 for anything else."""
    text = text.strip().rstrip("+")
    return int(text) if text.isdigit() else 0


def nodes() -> list[Node]:
    """Every node of every partition (``sinfo -N``). Raises SlurmUnreachable."""
    return parse_nodes(_asked(["sinfo", "-N", "-h", "-o", _NODE_FORMAT]) or "")


@dataclass(frozen=True)
class Associations:
    """What Slurm accounting lets a user submit as (``sacctmgr``)."""

    default_account: str | None
    accounts: tuple[str, ...]
    #: every QOS of those associations, and the default one if set
    qos: tuple[str, ...]
    default_qos: str | None


def parse_associations(assoc: str, default: str) -> Associations:
    """``sacctmgr -n -P show assoc user=U format=account,qos,defaultqos`` (``assoc``) and
    ``sacctmgr -n -P show user U format=defaultaccount`` (``default``)."""
    accounts: list[str] = []
    qos: list[str] = []
    default_qos = None
    for line in assoc.splitlines():
        parts = line.strip().split("|")
        if len(parts) < 3:
            continue
        account, qos_list, dqos = parts[:3]
        if account and account not in accounts:
            accounts.append(account)
        qos += [q for q in qos_list.split(",") if q and q not in qos]
        default_qos = default_qos or dqos or None
    default_account = next((ln.strip() for ln in default.splitlines() if ln.strip()), None)
    return Associations(default_account, tuple(accounts), tuple(qos), default_qos)


def associations(user: str) -> Associations | None:
    """The user's accounts and QOS; None when sacctmgr cannot be asked (no accounting)."""
    if shutil.which("sacctmgr") is None or _no_config() is not None:
        return None
    fmt = ["format=account,qos,defaultqos"]
    try:
        assoc = _run(["sacctmgr", "-n", "-P", "show", "assoc", f"user={user}", *fmt])
        default = _run(["sacctmgr", "-n", "-P", "show", "user", user, "format=defaultaccount"])
    except SlurmUnreachable:  # slurmdbd does not answer in time
        return None
    if assoc.returncode != 0:
        return None
    return parse_associations(assoc.stdout, default.stdout if default.returncode == 0 else "")
