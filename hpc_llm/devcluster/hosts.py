"""Dev-cluster nodes that are separate hosts: one network, UTS and mount namespace per node.

``hpc-llm dev-cluster up --hosts`` (``cluster.up(hosts=True)``) runs each node's slurmd as a
host of its own on this machine:

- a **network namespace** per node (``ip netns add``), joined to the cluster's own Linux bridge
  by a veth pair: its ``eth0`` inside holds the node's address, the host side is plugged into
  the bridge (and is what :mod:`hpc_llm.devcluster.fabric` cuts, slows or makes lossy);
- the bridge holds the first address of the subnet in the root namespace, where slurmctld,
  slurmdbd and the S3 server run and listen: nodes reach them there, clients (sbatch, squeue,
  ``hpc-llm``, the tests) reach them as today, from the root namespace. slurmctld and slurmdbd
  run with a UTS and mount namespace of their own (:func:`controller_command`: the hostname
  ``ctl``, the nodes' hosts file), so that they name their peers without DNS. Nothing is routed:
  no ``ip_forward``, no default route inside a node, eth0 of this machine untouched; the
  subnet lives on the bridge and in the cluster's namespaces only;
- a **UTS and mount namespace** per slurmd start (``nsenter --net=/run/netns/NS unshare
  --uts --mount --propagation private``): the hostname ``nX``; a private hosts file
  (``<root>/etc/hosts``: the controller and every node) bind-mounted over /etc/hosts, and
  an nsswitch.conf whose ``hosts:`` reads that file only (``<root>/etc/nsswitch.conf``: a
  node reaches no DNS server, and glibc then fails every lookup the file does not answer
  with EAI_AGAIN, even a plain address-to-text ``getnameinfo``, where a real host's DNS says
  "not found" and the address is printed: torch's c10d warned "The hostname of the client
  socket cannot be retrieved. err=-3" on every connection); a tmpfs on /tmp and on /dev/shm
  of its own. ``ip netns exec`` would do the mounts too, but it
  remounts /sys, and slurmd then dies ("No filesystem mounted on /sys/fs/cgroup").

The mount and UTS namespaces live as long as the node's processes: a node killed
(``kill_node``) and started again (``revive_node``) comes back as a rebooted host, with an
empty /tmp and /dev/shm. The network namespace and its link outlive them, as a machine's
cabling does.

Names and addresses derive from the cluster's slurmctld port ``P`` (two clusters on this
machine never share one): the bridge ``hpclPbr``, node ``nX``'s namespace ``hpclP-nX`` and
the host side of its link ``hpclPnX`` (15 characters at most, the kernel's limit), the /24
subnet ``10.(P >> 8).(P & 255).0`` (one per port, so different ports never overlap), the
bridge ``.1``, node ``nX`` ``.(X + 1)``. :func:`setup` removes what a cluster on that port
left behind first, and refuses a subnet some other interface of this machine already routes.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import ipaddress
import os
import shutil
import signal
import struct
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from hpc_llm.errors import ConfigError

#: every name this module creates starts with it
PREFIX = "hpcl"
#: the most nodes one /24 holds beside the bridge's address
MAX_NODES = 250
#: where ``ip netns`` keeps its namespaces (bind mounts of /proc/PID/ns/net)
NETNS_DIR = Path("/run/netns")
#: the name the nodes' hosts file gives the controller (this machine's root namespace)
CONTROLLER = "ctl"


@dataclass(frozen=True)
class Net:
    """The network of one multi-host dev cluster, named after its slurmctld port."""

    port: int
    nodes: int

    def __post_init__(self) -> None:
        if not 0 < self.port < 65536:
            raise ConfigError(f"--port={self.port}: not a TCP port")
        if not 1 <= self.nodes <= MAX_NODES:
            raise ConfigError(f"--nodes={self.nodes}: a multi-host dev cluster holds 1 to {MAX_NODES} nodes")

    @property
    def tag(self) -> str:
        return f"{PREFIX}{self.port}"

    @property
    def bridge(self) -> str:
        return f"{self.tag}br"

    def netns(self, node: str) -> str:
        return f"{self.tag}-{node}"

    def veth(self, node: str) -> str:
        """The host side of node ``node``'s link (on the bridge); inside, the node calls it eth0."""
        return f"{self.tag}{node}"

    @property
    def subnet(self) -> ipaddress.IPv4Network:
        return ipaddress.IPv4Network(f"10.{self.port >> 8}.{self.port & 255}.0/24")

    @property
    def gateway(self) -> str:
        """The bridge's address: where the nodes reach slurmctld, slurmdbd and the S3 server."""
        return str(self.subnet.network_address + 1)

    @property
    def node_names(self) -> list[str]:
        return [f"n{i}" for i in range(1, self.nodes + 1)]

    def addr(self, node: str) -> str:
        return str(self.subnet.network_address + 1 + int(node.removeprefix("n")))

    def hosts_file(self, controller: str) -> str:
        """/etc/hosts as every node sees it: the controller (by ``controller``, this machine's
        name, and by ``ctl``) and every node of this cluster."""
        names = " ".join(dict.fromkeys([controller, CONTROLLER]))
        lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback", f"{self.gateway}\t{names}"]
        lines += [f"{self.addr(n)}\t{n}" for n in self.node_names]
        return "# Written by `hpc-llm dev-cluster up --hosts`: the nodes' /etc/hosts.\n" + "\n".join(lines) + "\n"


def nsswitch_conf(system: str) -> str:
    """The nodes' /etc/nsswitch.conf: the system's (``system``, its text), with host names from
    the hosts file only."""
    lines = [ln for ln in system.splitlines() if not ln.startswith("hosts:")]
    return (
        "# Written by `hpc-llm dev-cluster up --hosts`: names from the nodes' hosts file only.\n"
        + "\n".join([*lines, "hosts:          files"])
        + "\n"
    )


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and out.returncode != 0:
        raise RuntimeError(f"`ip {' '.join(args)}` failed (rc={out.returncode}): {out.stderr.strip()}")
    return out


@functools.cache
def unavailable() -> str | None:
    """Why this machine cannot run a multi-host dev cluster (None: it can). Tried for real, once
    per process: a throwaway network namespace holding a bridge and a veth pair."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    missing = [b for b in ("ip", "nsenter", "unshare", "mount", "tc", "taskset") if shutil.which(b) is None]
    if missing:
        return f"{', '.join(missing)} not on PATH (iproute2, util-linux)"
    probe = f"{PREFIX}-probe-{uuid.uuid4().hex[:8]}"
    try:
        out = _ip("netns", "add", probe, check=False)
        if out.returncode != 0:
            return f"no network namespaces here (`ip netns add` failed: {out.stderr.strip()})"
        tries = (("link", "add", "b0", "type", "bridge"), ("link", "add", "v0", "type", "veth", "peer", "name", "v1"))
        for args in tries:
            out = _ip("-n", probe, *args, check=False)
            if out.returncode != 0:
                return f"`ip {' '.join(args)}` fails here: {out.stderr.strip()}"
    finally:
        _ip("netns", "del", probe, check=False)
    return None


def namespaces() -> list[str]:
    """The network namespaces ``ip netns`` knows (any owner)."""
    out = _ip("netns", "list", check=False)
    return [line.split()[0] for line in out.stdout.splitlines() if line.strip()]


def links() -> list[str]:
    """The interfaces of the root namespace."""
    out = _ip("-o", "link", "show", check=False)
    return [line.split(":", 2)[1].strip().split("@", 1)[0] for line in out.stdout.splitlines() if ":" in line]


def leftovers(net: Net) -> list[str]:
    """What of this cluster's network exists now (its namespaces, links and bridge): after
    ``down``, nothing. Matched by name, so a cluster started with more nodes is found too."""
    ours = f"{net.tag}-"
    found = [f"netns {n}" for n in namespaces() if n.startswith(ours)]
    veth = f"{net.tag}n"
    found += [f"link {n}" for n in links() if n == net.bridge or (n.startswith(veth) and n[len(veth) :].isdigit())]
    return found


def pids(netns: str) -> set[int]:
    """Every process in network namespace ``netns`` (``ip netns pids``): a node's slurmd, its
    slurmstepds and their tasks; nothing else lives there."""
    out = _ip("netns", "pids", netns, check=False)
    return {int(p) for p in out.stdout.split() if p.isdigit()} - {os.getpid()}


#: route types ``ip route`` prints before the destination
_ROUTE_TYPES = ("unicast", "local", "broadcast", "multicast", "throw", "unreachable", "prohibit", "blackhole")


def _routed_elsewhere(net: Net) -> str | None:
    """A route of the root namespace, not through this cluster's bridge, that overlaps the
    cluster's subnet (the nodes' packets would go astray, or another network's would come here)."""
    out = _ip("-4", "-o", "route", "show", "table", "all", check=False)
    for line in out.stdout.splitlines():
        words = line.split()
        if words and words[0] in _ROUTE_TYPES:
            words = words[1:]
        if not words or words[0] == "default":
            continue
        dev = words[words.index("dev") + 1] if "dev" in words[:-1] else "?"
        if dev == net.bridge:
            continue
        with contextlib.suppress(ValueError):
            if ipaddress.IPv4Network(words[0], strict=False).overlaps(net.subnet):
                return f"{words[0]} on {dev}"
    return None


def setup(net: Net) -> None:
    """The bridge, one namespace and link per node, each node's address. What a cluster on this
    port left behind is removed first."""
    teardown(net)
    clash = _routed_elsewhere(net)
    if clash is not None:
        raise ConfigError(
            f"the multi-host dev cluster on port {net.port} would use {net.subnet}, which this machine "
            f"already routes ({clash}): pick another --port"
        )
    try:
        _ip("link", "add", net.bridge, "type", "bridge", "forward_delay", "0", "stp_state", "0")
        _ip("addr", "add", f"{net.gateway}/{net.subnet.prefixlen}", "dev", net.bridge)
        _ip("link", "set", net.bridge, "up")
        for node in net.node_names:
            ns, veth = net.netns(node), net.veth(node)
            _ip("netns", "add", ns)
            _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
            _ip("link", "set", veth, "master", net.bridge, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("-n", ns, "addr", "add", f"{net.addr(node)}/{net.subnet.prefixlen}", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
    except BaseException:
        teardown(net)
        raise


def teardown(net: Net) -> list[str]:
    """Remove this cluster's namespaces (SIGKILLing whatever still runs in them first), links and
    bridge. Returns what was removed."""
    removed = []
    ours = f"{net.tag}-"
    for ns in namespaces():
        if ns.startswith(ours):
            removed += [f"process {p} in {ns}" for p in kill_all(ns)]
    # the links first: deleting one end of a veth pair deletes both at once, while the pair of a
    # deleted namespace goes later, in the kernel's own time (a look right after still saw it)
    for name in leftovers(net):
        if name.startswith("link ") and _ip("link", "del", name.removeprefix("link "), check=False).returncode == 0:
            removed.append(name)
    for ns in namespaces():
        if ns.startswith(ours):
            _ip("netns", "del", ns, check=False)
            removed.append(f"netns {ns}")
    return removed


def kill_all(netns: str, timeout_s: float = 10) -> list[int]:
    """SIGKILL every process in ``netns`` until none is left (a process forked meanwhile is
    found on the next look). Returns the pids killed."""
    killed: set[int] = set()
    deadline = time.monotonic() + timeout_s
    while (left := pids(netns)) and time.monotonic() < deadline:
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        killed |= left
        time.sleep(0.05)
    return sorted(killed)


#: ioctl(2) on a mount namespace's file: its 64-bit id (``NS_GET_MNTNS_ID``; recent kernels only)
NS_GET_MNTNS_ID = 0x8008B705
_ID_OF_NEW_NS = (
    "import fcntl, os, struct; fd = os.open('/proc/self/ns/mnt', os.O_RDONLY); "
    f"print(struct.unpack('Q', fcntl.ioctl(fd, {NS_GET_MNTNS_ID}, bytes(8)))[0])"
)


def mount_ns_cpu() -> int | None:
    """The CPU on which a new mount namespace gets the smallest id now (None: ids cannot be read
    here, or there is one CPU). A node's mount namespace is made there.

    Why (found on this machine, kernel 6.18; job_container/tmpfs's "_create_ns: ns base mount
    failed: Invalid argument"): for each job, slurmstepd forks a child that unshares a mount
    namespace, and bind-mounts the child's /proc/PID/ns/mnt onto ``BasePath/<job>/.ns``. The
    kernel refuses (EINVAL, ``mnt_ns_loop`` in fs/namespace.c) to bind a mount namespace whose id
    is not greater than the caller's own, taking a greater id for a newer namespace. But ids are
    handed out from a batch per CPU (here: CPU 0 gave 175, 176, 177 while CPU 1 gave 4269,
    4270, 4271), so a job namespace made on CPU 0 is "older" than a node namespace made
    earlier on CPU 1, and that job fails to start on that node (some jobs, some nodes: whichever
    CPU each unshare ran on). slurmd in the root mount namespace (one host) never meets it: the
    boot namespace has the smallest id. A node namespace made on the CPU whose next id is the
    smallest has an id below every later one on any CPU (each CPU's ids only grow, and a new
    batch starts above every batch handed out), so every job namespace of that node is newer."""
    ids = next_mount_ns_ids()
    if len(ids) < 2:
        return None
    return min(ids, key=lambda c: ids[c])


def next_mount_ns_ids() -> dict[int, int]:
    """For each CPU this process may run on, the id of a mount namespace made there now (each
    made and gone at once): the next ids of each CPU are greater. Empty where ids cannot be read
    (an older kernel, without ``NS_GET_MNTNS_ID``)."""
    procs = {
        cpu: subprocess.Popen(
            ["taskset", "-c", str(cpu), "unshare", "--mount", "--propagation", "unchanged"]
            + [sys.executable, "-I", "-S", "-c", _ID_OF_NEW_NS],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        for cpu in sorted(os.sched_getaffinity(0))
    }
    ids = {}
    for cpu, proc in procs.items():
        out, _ = proc.communicate()
        if proc.returncode == 0 and out.strip().isdigit():
            ids[cpu] = int(out)
    return ids


def mount_ns_id(pid: int) -> int | None:
    """The id of process ``pid``'s mount namespace (None: not readable here)."""
    try:
        fd = os.open(f"/proc/{pid}/ns/mnt", os.O_RDONLY)
    except OSError:
        return None
    try:
        return int(struct.unpack("Q", fcntl.ioctl(fd, NS_GET_MNTNS_ID, bytes(8)))[0])
    except OSError:
        return None
    finally:
        os.close(fd)


def node_command(net: Net, node: str, etc: Path, argv: list[str]) -> list[str]:
    """``argv`` started as a process of host ``node``: in its network namespace, with a UTS and
    mount namespace of its own made here (hostname ``node``; ``etc/hosts`` and
    ``etc/nsswitch.conf`` over /etc's; a fresh tmpfs on /tmp and /dev/shm). ``--propagation
    private``: nothing mounted inside shows outside, nor the other way round once started.
    The setup runs in sh, then sh execs ``argv`` (slurmd, which daemonizes: its namespaces
    live on in it and its children).

    The namespaces are made on the CPU :func:`mount_ns_cpu` picks (``taskset`` around
    ``unshare``), and ``argv`` runs on every CPU this process may use again."""
    script = (
        'hostname "$1" && mount --bind "$2/hosts" /etc/hosts && mount --bind "$2/nsswitch.conf" /etc/nsswitch.conf'
        " && mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs /tmp"
        " && mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs /dev/shm"
        ' && shift 2 && exec "$@"'
    )
    cpu = mount_ns_cpu()
    if cpu is not None:
        every = ",".join(str(c) for c in sorted(os.sched_getaffinity(0)))
        argv = ["taskset", "-c", every, *argv]
    return [
        "nsenter",
        f"--net={NETNS_DIR / net.netns(node)}",
        *(["taskset", "-c", str(cpu)] if cpu is not None else []),
        "unshare",
        "--uts",
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        script,
        "sh",
        node,
        str(etc),
        *argv,
    ]


def controller_command(etc: Path, argv: list[str]) -> list[str]:
    """``argv`` (slurmctld, slurmdbd) as a process of the controller: in this machine's network
    namespace, where the clients reach it and the bridge holds its address, but with a UTS and
    mount namespace of its own: the hostname ``ctl`` (slurm.conf's ``SlurmctldHost=ctl(ADDR)``)
    and the nodes' hosts file and nsswitch.conf over /etc's.

    Why: 24.11's slurmctld and slurmdbd look up the name of every peer that connects
    (``sockaddr_to_string`` -> ``getnameinfo``). A node's address is in no file of this machine,
    so each lookup went to its DNS server, which sometimes did not answer for 5 s: a node's
    message waited past MessageTimeout (5 s), slurmstepd retried it 60 s later, and a 3-node
    srun took 5 s, or 70 s, instead of 0.2 s (seen here, 1 in 3 to 5 runs)."""
    script = (
        f'hostname {CONTROLLER} && mount --bind "$1/hosts" /etc/hosts'
        ' && mount --bind "$1/nsswitch.conf" /etc/nsswitch.conf && shift && exec "$@"'
    )
    return ["unshare", "--uts", "--mount", "--propagation", "private", "sh", "-c", script, "sh", str(etc), *argv]


def in_node(net: Net, node: str, argv: list[str], pid: int | None = None) -> list[str]:
    """``argv`` run inside node ``node`` as it is now: in the namespaces of process ``pid`` (its
    slurmd: network, UTS and mount, so its /tmp, /dev/shm and /etc/hosts), else in its network
    namespace only. For tests and tools; jobs get there through Slurm."""
    if pid is not None:
        return ["nsenter", "-t", str(pid), "--net", "--uts", "--mount", *argv]
    return ["nsenter", f"--net={NETNS_DIR / net.netns(node)}", *argv]
