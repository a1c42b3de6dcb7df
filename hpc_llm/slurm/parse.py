"""What Slurm's client commands print, read: one parser per output, for both sides.

Each parser is pure and checked against real outputs of Slurm 22.05 and 24.11
(tests/test_slurm_parsers.py, over tests/fixtures/slurm/). ``sacct``'s rows are read by
:mod:`hpc_llm.slurm.accounting`, beside the queries that ask for them. Stdlib only.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from dataclasses import dataclass

# -- scontrol show job / partition / config / --version ---------------------------------------

#: ``scontrol show job`` fields that fill their line (a path may hold spaces)
_WHOLE_LINE = ("Command", "WorkDir", "StdErr", "StdIn", "StdOut")


def show_job(out: str) -> dict[str, str]:
    """``scontrol show job`` of one job as its fields (JobState, EndTime, NodeList, ...), in its
    usual form (a field per token, some lines whole) or one line (``-o``). A key's first value
    wins: 22.05 prints TRES=, 24.11 ReqTRES= and AllocTRES=."""
    fields: dict[str, str] = {}
    for line in out.splitlines():
        text = line.strip()
        key, _, value = text.partition("=")
        if key in _WHOLE_LINE:
            fields.setdefault(key, value)
            continue
        for token in text.split():
            k, sep, v = token.partition("=")
            if sep:
                fields.setdefault(k, v)
    return fields


def show_partitions(out: str) -> dict[str, dict[str, str]]:
    """``scontrol show partition`` (every partition) -> name -> its fields (GraceTime,
    PreemptMode, MaxTime, PriorityTier, ...), each record read as :func:`show_job` reads a job."""
    parts: dict[str, dict[str, str]] = {}
    for record in out.split("\n\n"):
        fields = show_job(record)
        if fields.get("PartitionName"):
            parts[fields["PartitionName"]] = fields
    return parts


def show_config(out: str) -> dict[str, str]:
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


def version(text: str) -> tuple[int, int] | None:
    """``scontrol --version`` ("slurm-wlm 24.11.5", "slurm 22.05.8") -> (24, 11)."""
    for word in text.split():
        parts = word.split(".")
        if len(parts) >= 2 and parts[0].isdigit() and parts[1].isdigit():
            return int(parts[0]), int(parts[1])
    return None


def slurm_time(text: str | None) -> float | None:
    """A time as scontrol prints it (epoch seconds under ``SLURM_TIME_FORMAT=%s``, else local
    ``2026-11-28T10:00:00``); None for Unknown, None, (null)."""
    if not text or text in ("Unknown", "None", "(null)"):
        return None
    if text.isdigit():  # SLURM_TIME_FORMAT=%s
        return float(text) or None
    try:
        return time.mktime(time.strptime(text, "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None


def seconds_setting(conf: dict[str, str], key: str, default: int) -> int:
    """A setting of :func:`show_config` in seconds ("300 sec"), ``default`` when unreadable."""
    words = (conf.get(key) or "").split()
    return int(words[0]) if words and words[0].isdigit() else default


#: Slurm's default AuthInfo cred_expire: a requeued job may start again this long after it stopped
CRED_EXPIRE_DEFAULT_S = 120


def cred_expire_s(conf: Mapping[str, str]) -> int:
    """``cred_expire`` of :func:`show_config`'s AuthInfo (``cred_expire=10,...``), Slurm's
    default when it is not set."""
    for item in (conf.get("AuthInfo") or "").split(","):
        key, _, value = item.strip().partition("=")
        if key == "cred_expire" and value.isdigit():
            return int(value)
    return CRED_EXPIRE_DEFAULT_S


# -- sinfo ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Partition:
    name: str
    nodes: int
    cpus_per_node: int
    default: bool
    state: str


def partitions(out: str) -> dict[str, Partition]:
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


#: sinfo -N fields of :class:`Node`, in order
NODE_FORMAT = "%N|%P|%G|%c|%m|%T"


def nodes(out: str) -> list[Node]:
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


#: sinfo -N fields of :func:`node_states`
STATE_FORMAT = "%N %t"
#: sinfo's short states of a node that cannot take a job (down, drained or draining, failing)
_NOT_UP = ("down", "drain", "drng", "fail", "maint", "unk", "boot", "npc", "inval", "futr", "pow")
#: sinfo's short states of a node being drained: allocated (draining) or already idle (drained)
_DRAINING = ("drng", "drain")


def node_states(out: str) -> dict[str, str]:
    """``sinfo -h -N -o '%N %t'`` -> node -> its short state without the trailing flags (``~``
    powered off, ...: a drained node not responding is still drained), but for ``*`` (not
    responding) on a state otherwise up: ``idle*`` is a node slurmctld cannot ping, which takes no
    job (it is DOWN at SlurmdTimeout), and is not up for :func:`up`."""
    states = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 2:
            base = parts[1].rstrip("*~#!%$@^-")
            silent = "*" in parts[1][len(base) :] and not base.startswith(_NOT_UP)
            states[parts[0]] = base + ("*" if silent else "")
    return states


def up(states: dict[str, str]) -> list[str]:
    """The nodes of :func:`node_states` that can take a job. After a node death 24.11 showed the
    survivors of its job ``comp`` (completing) for a while, 22.05 ``idle``: both are up."""
    return sorted(n for n, s in states.items() if not s.startswith(_NOT_UP) and not s.endswith("*"))


def draining(states: dict[str, str]) -> list[str]:
    """The nodes of :func:`node_states` an operator is draining (planned maintenance)."""
    return sorted(n for n, s in states.items() if s in _DRAINING)


#: slurmd's port where a node line of ``scontrol show node`` names none (Slurm's default)
SLURMD_PORT = 6818


def slurmd_addresses(out: str) -> dict[str, tuple[str, int]]:
    """``scontrol show node -o <nodes>`` -> node -> (NodeAddr, slurmd's Port)."""
    found = {}
    for line in out.splitlines():
        fields = show_job(line)
        if fields.get("NodeName") and fields.get("NodeAddr"):
            port = fields.get("Port", "")
            found[fields["NodeName"]] = (fields["NodeAddr"], int(port) if port.isdigit() else SLURMD_PORT)
    return found


def state_gone(state: str) -> bool:
    """``scontrol show node``'s State (``IDLE+NOT_RESPONDING``, ``DOWN+DRAIN+NOT_RESPONDING``;
    sinfo's ``down*`` too) says the node is dead or missed slurmctld's pings."""
    flags = set(state.upper().replace("*", "+NOT_RESPONDING").split("+"))
    return bool({"DOWN", "NOT_RESPONDING"} & flags)


def gone_nodes(out: str) -> list[str]:
    """``scontrol show node -o <nodes>`` -> the nodes it finds dead or not responding, sorted."""
    return sorted(
        f["NodeName"] for f in map(show_job, out.splitlines()) if f.get("NodeName") and state_gone(f.get("State", ""))
    )


# -- squeue, sbatch --test-only, sacctmgr -------------------------------------------------------


#: squeue's fields of :func:`queue`: job id, state, reason
QUEUE_FORMAT = "%i|%T|%r"


def held(reason: str) -> bool:
    """A pending job's reason says it is held (JobHeldAdmin, JobHeldUser, and what slurmctld
    holds a job with after a launch that failed: ``launch_failed_requeued_held``): it will not
    start until someone releases it."""
    return "held" in reason.lower()


def queue(out: str) -> dict[str, str]:
    """``squeue -h -r -o '%i|%T|%r'`` -> job id (``A_i`` for an array task) -> state, with
    ``HELD`` for a pending job that is held (:func:`held`). Lines without the reason (``%i|%T``)
    read as before."""
    return {job: state for job, (state, _reason) in queue_reasons(out).items()}


def queue_reasons(out: str) -> dict[str, tuple[str, str]]:
    """:func:`queue`'s lines as job id -> (state, Slurm's reason: ``None``, ``Priority``,
    ``launch_failed_requeued_held``, ...)."""
    jobs: dict[str, tuple[str, str]] = {}
    for line in out.splitlines():
        if "|" not in line:
            continue
        jid, state, *rest = (x.strip() for x in line.split("|"))
        reason = rest[0] if rest else ""
        jobs[jid] = ("HELD" if state == "PENDING" and held(reason) else state, reason)
    return jobs


def test_only_reason(returncode: int, stderr: str) -> str | None:
    """What ``sbatch --test-only`` said: None when accepted ("sbatch: Job 5 to start at ... on
    nodes n[1-2]"), else its reason. 22.05 and 24.11 both refuse with one stderr line,
    "allocation failure: <reason>", and exit 1."""
    if returncode == 0:
        return None
    errors = [ln.strip() for ln in stderr.splitlines() if "error" in ln.lower()]
    reason = (errors or [stderr.strip() or f"sbatch --test-only exited with {returncode}"])[-1]
    return reason.removeprefix("sbatch: error: ").removeprefix("Batch job submission failed: ")


@dataclass(frozen=True)
class Associations:
    """What Slurm accounting lets a user submit as (``sacctmgr``)."""

    default_account: str | None
    accounts: tuple[str, ...]
    #: every QOS of those associations, and the default one if set
    qos: tuple[str, ...]
    default_qos: str | None


def associations(assoc: str, default: str) -> Associations:
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
