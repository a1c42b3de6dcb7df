"""A real Slurm cluster on this machine: slurmctld + N slurmd (Debian slurm-wlm).

``hpc-llm dev-cluster up`` writes a slurm.conf under ``--root`` (state, spool,
logs and per-node job containers all outside /tmp, which each job gets a
private copy of), starts ``slurmctld`` and one ``slurmd -N nX`` per node, waits
until the nodes are idle and prints ``export SLURM_CONF=...``. It is
idempotent, and ``down`` stops only the daemons whose pid files it wrote.

The recipe (auth/none, job_container/tmpfs, partition-priority preemption with
REQUEUE and preempt_send_user_signal) is the one verified in DESIGN.md §4.
Partitions: ``low`` (default, preemptable, GraceTime) and ``high``.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from hpc_llm.errors import ConfigError

DEFAULT_ROOT_ENV = "HPC_LLM_DEV_CLUSTER"
CTLD_PORT = 16817
SLURMD_BASE_PORT = CTLD_PORT + 1  # slurmd of node i listens on CTLD_PORT + i
GRACE_TIME_S = 20


def default_root() -> Path:
    env = os.environ.get(DEFAULT_ROOT_ENV)
    return Path(env).expanduser() if env else Path.home() / ".hpc_llm" / "dev-cluster"


@dataclass(frozen=True)
class DevCluster:
    root: Path
    nodes: int
    cpus_per_node: int
    ctld_port: int = CTLD_PORT
    slurmd_port: int = SLURMD_BASE_PORT

    @property
    def conf(self) -> Path:
        return self.root / "etc" / "slurm.conf"

    @property
    def node_names(self) -> list[str]:
        return [f"n{i}" for i in range(1, self.nodes + 1)]

    def env(self) -> dict[str, str]:
        return {"SLURM_CONF": str(self.conf)}

    def pidfile(self, daemon: str) -> Path:
        return self.root / "run" / f"{daemon}.pid"


def slurm_conf(c: DevCluster, hostname: str) -> str:
    r = c.root
    last = c.nodes
    return f"""\
# Written by `hpc-llm dev-cluster up`: a {c.nodes}-node Slurm cluster on {hostname}.
ClusterName=hpcllmdev
SlurmctldHost={hostname}(127.0.0.1)
SlurmctldPort={c.ctld_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/none
CredType=cred/none
# A requeued job may start again cred_expire seconds after it stopped (120 by
# default); 10 keeps preemption round trips short on a laptop.
AuthInfo=cred_expire=10
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
ReturnToService=2
MailProg=/bin/true
# Per-node private /tmp and /dev/shm (Streaming keeps state in /dev/shm).
JobContainerType=job_container/tmpfs
PrologFlags=Contain
# Preemption: a job on `high` requeues jobs on `low`; they get the --signal
# (USR2 by default) at preemption, TERM after GraceTime, then are requeued.
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
SlurmctldParameters=preempt_send_user_signal
JobRequeue=1
StateSaveLocation={r}/state
SlurmdSpoolDir={r}/spool/%n
SlurmctldPidFile={c.pidfile("slurmctld")}
SlurmdPidFile={r}/run/slurmd-%n.pid
SlurmctldLogFile={r}/log/slurmctld.log
SlurmdLogFile={r}/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
InactiveLimit=0
KillWait=10
MinJobAge=300
NodeName=n[1-{last}] NodeHostname={hostname} NodeAddr=127.0.0.1 Port=[{c.slurmd_port}-{c.slurmd_port + last - 1}] CPUs={c.cpus_per_node} State=UNKNOWN
PartitionName=low Nodes=n[1-{last}] Default=YES PriorityTier=1 PreemptMode=REQUEUE GraceTime={GRACE_TIME_S} MaxTime=INFINITE State=UP
PartitionName=high Nodes=n[1-{last}] PriorityTier=2 PreemptMode=OFF MaxTime=INFINITE State=UP
"""


def job_container_conf(c: DevCluster) -> str:
    # 22.05: one line per node (no Dirs=, %n not expanded); BasePath outside /tmp.
    lines = [f"NodeName={n} AutoBasePath=true BasePath={c.root}/jc/{n}" for n in c.node_names]
    return "\n".join(lines) + "\n"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _daemons(c: DevCluster) -> list[tuple[str, Path]]:
    return [("slurmctld", c.pidfile("slurmctld"))] + [
        (f"slurmd -N {n}", c.root / "run" / f"slurmd-{n}.pid") for n in c.node_names
    ]


def running(c: DevCluster) -> dict[str, int]:
    """Daemons of this cluster that are alive, by name."""
    out = {}
    for name, pf in _daemons(c):
        pid = _read_pid(pf)
        if pid is not None and _alive(pid):
            out[name] = pid
    return out


def _require_binaries() -> None:
    missing = [b for b in ("slurmctld", "slurmd", "sinfo", "sbatch") if shutil.which(b) is None]
    if missing:
        raise ConfigError(
            f"dev-cluster needs Slurm ({', '.join(missing)} not on PATH); install it with "
            "`apt-get install slurm-wlm` (scripts/setup-dev.sh does)"
        )
    if os.geteuid() != 0:
        raise ConfigError("dev-cluster runs slurmd as root (job containers need it); run it as root")


def load(root: Path) -> DevCluster | None:
    """The cluster described by ``root``'s slurm.conf, if one was written there."""
    conf = root / "etc" / "slurm.conf"
    if not conf.is_file():
        return None
    nodes, cpus, port, dport = 1, 1, CTLD_PORT, SLURMD_BASE_PORT
    for line in conf.read_text().splitlines():
        if line.startswith("NodeName=n[1-"):
            nodes = int(line.split("n[1-", 1)[1].split("]", 1)[0])
            cpus = int(line.split("CPUs=", 1)[1].split()[0])
            dport = int(line.split("Port=[", 1)[1].split("-", 1)[0])
        if line.startswith("SlurmctldPort="):
            port = int(line.split("=", 1)[1])
    return DevCluster(root=root, nodes=nodes, cpus_per_node=cpus, ctld_port=port, slurmd_port=dport)


def up(
    root: Path | None = None,
    nodes: int = 3,
    cpus_per_node: int | None = None,
    ctld_port: int = CTLD_PORT,
    timeout_s: float = 60,
) -> DevCluster:
    root = (root or default_root()).expanduser().resolve()
    if str(root).startswith("/tmp/") or str(root) == "/tmp":
        raise ConfigError(f"--root={root}: must be outside /tmp (every job gets a private /tmp)")
    if nodes < 1:
        raise ConfigError(f"--nodes={nodes}: must be >= 1")
    _require_binaries()
    cpus = cpus_per_node or max(2, os.cpu_count() or 2)
    c = DevCluster(root=root, nodes=nodes, cpus_per_node=cpus, ctld_port=ctld_port, slurmd_port=ctld_port + 1)
    existing = load(root)
    if existing is not None and running(existing):
        if len(running(existing)) == len(_daemons(existing)) and existing.nodes == nodes:
            return existing  # already up: idempotent
        down(root)
    for sub in ("etc", "state", "spool", "run", "log", "jc"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    hostname = socket.gethostname().split(".")[0]
    c.conf.write_text(slurm_conf(c, hostname))
    (c.conf.parent / "job_container.conf").write_text(job_container_conf(c))
    env = dict(os.environ, SLURM_CONF=str(c.conf))
    # -c: start from clean state (no jobs from an earlier `up`); -i: ignore errors in it.
    subprocess.run(["slurmctld", "-c", "-i", "-f", str(c.conf)], env=env, check=True)
    for n in c.node_names:
        subprocess.run(["slurmd", "-f", str(c.conf), "-N", n], env=env, check=True)
    _wait_idle(c, env, timeout_s)
    return c


def _wait_idle(c: DevCluster, env: dict[str, str], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    states: list[str] = []
    while time.monotonic() < deadline:
        out = subprocess.run(["sinfo", "-h", "-N", "-p", "low", "-o", "%N %T"], env=env, capture_output=True, text=True)
        states = [line.split()[-1] for line in out.stdout.splitlines() if line.strip()]
        if len(states) == c.nodes and all(s.rstrip("*") == "idle" for s in states):
            return
        time.sleep(0.5)
    raise RuntimeError(
        f"dev cluster not idle after {timeout_s:.0f}s (node states: {states}); "
        f"see {c.root / 'log'}"
    )


def down(root: Path | None = None, timeout_s: float = 30) -> list[str]:
    """Cancel this cluster's jobs and stop the daemons ``up`` started. Returns what was stopped."""
    root = (root or default_root()).expanduser().resolve()
    c = load(root)
    if c is None:
        return []
    env = dict(os.environ, SLURM_CONF=str(c.conf))
    alive = running(c)
    if "slurmctld" in alive:
        subprocess.run(["scancel", "--full", "--user", "root"], env=env, capture_output=True)
        _wait_no_jobs(env, timeout_s=15)
    stopped = []
    for name, pid in alive.items():
        os.kill(pid, signal.SIGTERM)
        stopped.append(f"{name} (pid {pid})")
    deadline = time.monotonic() + timeout_s
    for pid in alive.values():
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
    return stopped


def _wait_no_jobs(env: dict[str, str], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        out = subprocess.run(["squeue", "-h", "-o", "%i"], env=env, capture_output=True, text=True)
        if out.returncode != 0 or not out.stdout.strip():
            return
        time.sleep(0.5)
