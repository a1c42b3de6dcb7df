"""Faults of the fabric, for a dev cluster whose nodes are hosts (``up(hosts=True)``): a node cut
off, a slow link, a lossy one. For the tests and the benchmarks; root only, like the cluster.

Each node hangs off the cluster's bridge by one veth pair (:mod:`hpc_llm.devcluster.hosts`):
the host side (``hpclPnX``) in this machine's namespace, ``eth0`` inside the node. So:

- :func:`cut` sets the host side down (``ip link set DEV down``): the node keeps running, its
  processes keep their sockets, and nothing gets through either way; the others' packets to it
  are dropped at the bridge (a connect from another node times out, or fails with EHOSTUNREACH
  once its ARP entry has gone), and the node's own get nowhere. ``for_s=N`` heals it after N
  seconds from a detached process (the link comes back even if the caller has exited by then);
  :func:`heal` brings it back at once.
- :func:`partition` drops everything between a node and some others, both ways, while each
  still reaches the controller (slurmctld, slurmdbd, the S3 server), as a switch whose uplink
  between two groups failed does: in each namespace, a policy rule drops what arrives from the
  peer (``ip rule add pref 10 from PEER iif eth0 blackhole``, ahead of the local table, which
  moves from priority 0 to 100 for it), so the sender sees a timeout and nothing is refused.
  A blackhole *route* would not do: the sender's own kernel then fails its connect at once
  (EINVAL), which no switch does. :func:`mend` removes the rules;
- :func:`slow` shapes both directions with a token bucket (``tc qdisc replace ... tbf``: on the
  host side, what goes to the node; on eth0 inside, what it sends); :func:`unslow` removes it.
- :func:`lose` drops a share of the packets both ways with ``netem``, where the kernel has
  ``sch_netem``: this machine's has none, and ``lose`` then raises :class:`NetemUnavailable`
  saying so (:func:`netem_unavailable` says why beforehand, for a test to skip).

Nothing here touches a link that is not the cluster's own.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import subprocess
import time
import uuid
from dataclasses import dataclass

from hpc_llm.devcluster import hosts
from hpc_llm.devcluster.cluster import DevCluster
from hpc_llm.errors import ConfigError


class NetemUnavailable(RuntimeError):
    """This kernel cannot add delay or loss (no ``sch_netem``)."""


def _net(c: DevCluster, node: str) -> hosts.Net:
    if c.net is None:
        raise ConfigError(
            f"fabric faults need a dev cluster whose nodes are hosts (`hpc-llm dev-cluster up --hosts`); "
            f"the one in {c.root} runs every node on this host's own network"
        )
    if node not in c.node_names:
        raise ConfigError(f"no node {node!r} in the dev cluster ({', '.join(c.node_names)})")
    return c.net


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(argv, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"`{' '.join(argv)}` failed (rc={out.returncode}): {out.stderr.strip()}")
    return out


def _link(dev: str, state: str) -> None:
    _run(["ip", "link", "set", "dev", dev, state])


@dataclass
class Cut:
    """A node cut off: :meth:`heal` ends it now; with ``for_s``, a detached timer heals it then."""

    cluster: DevCluster
    node: str
    #: the process that heals the link after ``for_s`` (None: cut for good)
    timer: subprocess.Popen | None = None

    def heal(self) -> None:
        self.cancel()
        heal(self.cluster, self.node)

    def cancel(self) -> None:
        """Stop the timer (the link stays as it is now)."""
        if self.timer is not None and self.timer.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.timer.pid, signal.SIGKILL)
            self.timer.wait()

    def wait(self, timeout_s: float | None = None) -> None:
        """Wait for the timer to heal the link."""
        if self.timer is not None:
            self.timer.wait(timeout_s)


def cut(c: DevCluster, node: str, for_s: float | None = None) -> Cut:
    """Cut node ``node`` off the fabric (its link down), for good or for ``for_s`` seconds."""
    net = _net(c, node)
    dev = net.veth(node)
    _link(dev, "down")
    timer = None
    if for_s is not None:
        timer = subprocess.Popen(
            ["sh", "-c", 'sleep "$1" && exec ip link set dev "$2" up', "sh", f"{for_s:g}", dev],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # heals even if the caller is gone by then
        )
    return Cut(c, node, timer)


def heal(c: DevCluster, node: str) -> None:
    """Node ``node``'s link up again (whatever cut it)."""
    _link(_net(c, node).veth(node), "up")


#: the priority of partition's rules, ahead of the local table's (moved to LOCAL_PREF)
PARTITION_PREF, LOCAL_PREF = "10", "100"


def _pairs(net: hosts.Net, node: str, others: list[str]) -> list[tuple[str, str]]:
    """(namespace, the peer whose packets it drops) for both directions between ``node`` and
    ``others``."""
    out = []
    for other in others:
        if other == node:
            raise ConfigError(f"a partition of {node} from itself")
        out += [(net.netns(node), net.addr(other)), (net.netns(other), net.addr(node))]
    return out


def _local_table_moved(ns: str) -> None:
    """The local table's rule at LOCAL_PREF instead of 0, so that a rule can come before it."""
    lines = _run(["ip", "-n", ns, "rule", "show"]).stdout.splitlines()
    local = [line.split(":", 1)[0] for line in lines if line.rstrip().endswith("lookup local")]
    if LOCAL_PREF not in local:
        _run(["ip", "-n", ns, "rule", "add", "pref", LOCAL_PREF, "lookup", "local"])
    if "0" in local:
        _run(["ip", "-n", ns, "rule", "del", "pref", "0", "lookup", "local"])


def _drop_rule(peer: str) -> list[str]:
    return ["pref", PARTITION_PREF, "from", f"{peer}/32", "iif", "eth0", "blackhole"]


def partition(c: DevCluster, node: str, others: list[str]) -> None:
    """Node ``node`` and each of ``others`` no longer reach each other (both ways, silently);
    every one of them still reaches the controller."""
    net = _net(c, node)
    for other in others:
        _net(c, other)
    for ns, peer in _pairs(net, node, others):
        _local_table_moved(ns)
        _run(["ip", "-n", ns, "rule", "add", *_drop_rule(peer)])


def mend(c: DevCluster, node: str, others: list[str]) -> None:
    """Undo :func:`partition` (a rule already gone is fine; the local table stays at its new
    priority, which routes the same)."""
    for ns, peer in _pairs(_net(c, node), node, others):
        subprocess.run(["ip", "-n", ns, "rule", "del", *_drop_rule(peer)], capture_output=True)


def _flags(argv: list[str]) -> list[str]:
    """The flags ``ip -o link show`` prints between < and >."""
    out = subprocess.run(argv, capture_output=True, text=True).stdout
    return out.split("<", 1)[1].split(">", 1)[0].split(",") if "<" in out else []


def is_cut(c: DevCluster, node: str) -> bool:
    """Whether node ``node``'s link is down (set so by :func:`cut`)."""
    return "UP" not in _flags(["ip", "-o", "link", "show", "dev", _net(c, node).veth(node)])


def _both_ways(net: hosts.Net, node: str) -> list[tuple[list[str], str]]:
    """``tc`` and the device for each direction of node ``node``'s link: to it (the host side's
    egress) and from it (its eth0's egress, inside its network namespace: ``tc -n``)."""
    return [(["tc"], net.veth(node)), (["tc", "-n", net.netns(node)], "eth0")]


def slow(c: DevCluster, node: str, rate: str = "8mbit", burst: str = "32kb", latency: str = "400ms") -> None:
    """Node ``node``'s link slowed to ``rate`` each way (a token bucket, ``tc ... tbf``): a
    transfer takes about its size over ``rate``; packets that wait more than ``latency`` for
    tokens are dropped, as a congested switch port does."""
    net = _net(c, node)
    for tc, dev in _both_ways(net, node):
        _run([*tc, "qdisc", "replace", "dev", dev, "root", "tbf", "rate", rate, "burst", burst, "latency", latency])


def unslow(c: DevCluster, node: str) -> None:
    """Node ``node``'s link back to full speed (its qdiscs removed; none there is fine)."""
    net = _net(c, node)
    for tc, dev in _both_ways(net, node):
        subprocess.run([*tc, "qdisc", "del", "dev", dev, "root"], capture_output=True)


@functools.cache
def netem_unavailable() -> str | None:
    """Why packets cannot be delayed or dropped here (None: they can): tried for real, once per
    process, on the loopback of a throwaway network namespace."""
    if (why := hosts.unavailable()) is not None:
        return why
    probe = f"{hosts.PREFIX}-netem-{uuid.uuid4().hex[:8]}"
    try:
        if subprocess.run(["ip", "netns", "add", probe], capture_output=True).returncode != 0:
            return "no network namespace to try netem in"
        out = subprocess.run(
            ["tc", "-n", probe, "qdisc", "add", "dev", "lo", "root", "netem", "loss", "1%"],
            capture_output=True,
            text=True,
        )
        if out.returncode != 0:
            return (
                f"this kernel ({os.uname().release}) has no sch_netem: `tc qdisc add ... netem` says "
                f"{out.stderr.strip()!r}; packet loss and delay cannot be injected here"
            )
    finally:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def lose(c: DevCluster, node: str, percent: float) -> None:
    """Drop ``percent`` % of node ``node``'s packets each way (``netem loss``). Raises
    :class:`NetemUnavailable` where the kernel has no ``sch_netem``; :func:`unslow` ends it."""
    net = _net(c, node)
    if (why := netem_unavailable()) is not None:
        raise NetemUnavailable(why)
    for tc, dev in _both_ways(net, node):
        _run([*tc, "qdisc", "replace", "dev", dev, "root", "netem", "loss", f"{percent:g}%"])


def settle(c: DevCluster, node: str, timeout_s: float = 5) -> None:
    """Wait until node ``node``'s link is up on both sides (after :func:`heal`, the kernel takes a
    moment to call the pair's carrier up again)."""
    net = _net(c, node)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if "LOWER_UP" in _flags(["ip", "-n", net.netns(node), "-o", "link", "show", "eth0"]) and not is_cut(c, node):
            return
        time.sleep(0.05)
    raise RuntimeError(f"node {node}'s link is not up {timeout_s:g} s after it was healed")
