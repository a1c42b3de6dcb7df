"""The dev cluster whose nodes are hosts of their own (``hpc-llm dev-cluster up --hosts``), and
the fabric faults it makes possible (``hpc_llm.devcluster.fabric``).

Each node's slurmd runs in its own network, UTS and mount namespace on the cluster's bridge
(``hpc_llm.devcluster.hosts``). Where this machine has no network namespaces (or the suite is not
root) every test here skips, saying why; the single-host cluster runs the rest of the suite.

The session's shared multi-host clusters (``dev_cluster_hosts``, ``dev_cluster_hosts_24``) are
only looked at or given jobs; a test that cuts, slows, kills or freezes a node does it on a
cluster of its own (``hosts_cluster_of_its_own``: no accounting, up in under a second).
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.conftest import (
    _free_port_block,
    explain,
    hosts_cluster_of_its_own,
    require_hosts,
    results_of,
    run_app,
    run_cli,
    shared_dir,
)

pytestmark = [pytest.mark.slurm]


@pytest.fixture(params=["22.05", "24.11"])
def hosts_cluster(request):
    """Each version's shared multi-host cluster in turn (24.11 skips where it is not installed)."""
    return request.getfixturevalue("dev_cluster_hosts" if request.param == "22.05" else "dev_cluster_hosts_24")


def srun(cluster, *args: str, timeout: int = 60) -> str:
    out = subprocess.run(
        [cluster.bin("srun"), *args], env=cluster.full_env(), capture_output=True, text=True, timeout=timeout, cwd="/"
    )
    assert out.returncode == 0, explain(out)
    return out.stdout


def in_node(cluster, node: str, script: str) -> str:
    """``sh -c script`` inside node ``node`` as its slurmd sees it: its network, UTS and mount
    namespaces (its /tmp, /dev/shm, /etc/hosts)."""
    from hpc_llm.devcluster import cluster as devcluster
    from hpc_llm.devcluster import hosts

    pid = devcluster.running(cluster)[f"slurmd -N {node}"]
    argv = hosts.in_node(cluster.net, node, ["sh", "-c", script], pid=pid)
    out = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, explain(out)
    return out.stdout


def test_each_node_is_a_host_of_its_own(hosts_cluster):
    """Its own hostname and address (what srun, `hostname -I` and Slurm say), names from the
    cluster's hosts file, its own /tmp and /dev/shm; and job_container/tmpfs gives each job its
    private /tmp on top, on every node, every time."""
    from hpc_llm.devcluster import cluster as devcluster
    from hpc_llm.devcluster import hosts

    c = hosts_cluster
    seen = {}
    for line in srun(c, "-N3", "--label", "sh", "-c", 'echo "$(hostname) $(hostname -I)"').splitlines():
        _task, name, *addrs = line.split()
        seen[name] = addrs
    assert seen == {n: [c.node_addr(n)] for n in c.node_names}, seen
    assert len({c.node_addr(n) for n in c.node_names} | {c.addr, "127.0.0.1"}) == 5
    shown = subprocess.run(
        [c.bin("scontrol"), "show", "node", "n2"], env=c.full_env(), capture_output=True, text=True, check=True
    ).stdout
    assert f"NodeAddr={c.node_addr('n2')} NodeHostName=n2 " in shown, shown
    # names: the nodes and the controller, from the hosts file the nodes share
    resolved = srun(c, "-w", "n1", "getent", "hosts", "n3", "ctl").split()
    assert resolved[:2] == [c.node_addr("n3"), "n3"] and resolved[2] == c.addr and "ctl" in resolved, resolved

    # each node's own /tmp and /dev/shm (tmpfs), not this machine's, not another node's
    mark = f"hosts-{uuid.uuid4().hex[:8]}"
    try:
        in_node(c, "n1", f"touch /tmp/{mark} /dev/shm/{mark}")
        assert sorted(in_node(c, "n1", f"ls /tmp/{mark} /dev/shm/{mark}").split()) == [
            f"/dev/shm/{mark}",
            f"/tmp/{mark}",
        ]
        for node in ("n2", "n3"):
            assert mark not in in_node(c, node, "ls /tmp /dev/shm")
        assert not Path(f"/tmp/{mark}").exists() and not Path(f"/dev/shm/{mark}").exists()
    finally:
        in_node(c, "n1", f"rm -f /tmp/{mark} /dev/shm/{mark}")
    # a filesystem each (tmpfs: a device number of its own), the machine's own besides
    devices = [in_node(c, n, "stat -c %d /tmp /dev/shm").split() for n in c.node_names]
    devices += [[str(os.stat("/tmp").st_dev), str(os.stat("/dev/shm").st_dev)]]
    assert len({d for pair in devices for d in pair}) == 2 * (c.nodes + 1), devices
    assert {in_node(c, n, "stat -f -c %T /tmp /dev/shm") for n in c.node_names} == {"tmpfs\ntmpfs\n"}

    # job_container/tmpfs in a node namespace: every job's /tmp is its own (BasePath under the root)
    for _ in range(3):
        tmps = srun(c, "-N3", "sh", "-c", "findmnt -n -o SOURCE /tmp | tail -n 1").split()
        assert len(tmps) == 3 and all(f"{c.root}/jc/" in t for t in tmps), tmps
    logs = "".join((c.root / "log" / f"slurmd-{n}.log").read_text() for n in c.node_names)
    assert "_create_ns" not in logs and "container_g_stepd_create" not in logs
    # why it works: each node's mount namespace has an id below any made later, on any CPU
    # (hosts.mount_ns_cpu; job_container/tmpfs bind-mounts a job's namespace, which the kernel
    # refuses for a namespace whose id is not above the caller's)
    later = hosts.next_mount_ns_ids()
    node_ids = [hosts.mount_ns_id(devcluster.running(c)[f"slurmd -N {n}"]) for n in c.node_names]
    known = [i for i in node_ids if i is not None]
    if later and len(known) == len(node_ids):
        assert max(known) < min(later.values()), (node_ids, later)


def test_the_nodes_reach_slurmctld_slurmdbd_and_the_s3_server(dev_cluster_hosts):
    """The daemons of the root namespace listen where the nodes reach them: a job's sacct (slurmdbd)
    and scontrol (slurmctld) answer, and the S3 server answers at the address it was given."""
    from hpc_llm.devcluster import s3_server

    c = dev_cluster_hosts
    out = srun(
        c, "-w", "n3", "sh", "-c", 'sacct -n -X -j "$SLURM_JOB_ID" -o JobID 2>&1; echo "sacct $?"; scontrol ping'
    )
    assert "sacct 0" in out and "error" not in out and "is UP" in out, out
    server = s3_server.load(c.root)
    if server is None or s3_server.pid_of(server) is None:
        return  # no SeaweedFS here: nothing more to reach
    assert server.endpoint == f"http://{c.addr}:{server.port}"
    code = srun(c, "-w", "n2", sys.executable, "-c", _HTTP_STATUS, server.endpoint).strip()
    assert code == "403", code  # an unsigned request: the gateway answered


_HTTP_STATUS = """
import sys, urllib.error, urllib.request
try:
    print(urllib.request.urlopen(sys.argv[1], timeout=10).status)
except urllib.error.HTTPError as e:
    print(e.code)
"""


def test_up_prints_what_to_export_and_down_leaves_nothing_behind(pytestconfig):
    """`hpc-llm dev-cluster up --hosts` (what a user runs), then a session killed before its
    `down` (every daemon SIGKILLed: the namespaces, links and bridge stay), then `up` again,
    which finds and removes them; `down` leaves no namespace, link, mount or process."""
    from hpc_llm.devcluster import cluster as devcluster
    from hpc_llm.devcluster import hosts

    require_hosts(pytestconfig)
    root = shared_dir(pytestconfig) / f"hosts-cli-{os.getpid()}"
    port = _free_port_block(16)
    net = hosts.Net(port, 2)
    args = ["dev-cluster", "up", "--hosts", "--nodes", "2", "--root", str(root), "--port", str(port)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    try:
        started = time.monotonic()
        up = run_cli(args, env)
        up_s = time.monotonic() - started
        assert up.returncode == 0, explain(up)
        assert f"# nodes are hosts: n1 {net.addr('n1')}, n2 {net.addr('n2')}; slurmctld at {net.gateway}" in up.stdout
        assert f"export SLURM_CONF={root / 'etc' / 'slurm.conf'}" in up.stdout
        assert sorted(hosts.leftovers(net)) == sorted(
            [f"netns {net.netns('n1')}", f"netns {net.netns('n2')}", f"link {net.bridge}"]
            + [f"link {net.veth('n1')}", f"link {net.veth('n2')}"]
        )
        c = devcluster.load(root)
        assert c is not None and c.hosts and c.net == net
        # a session killed before its down: its daemons gone, its network left behind
        for pid in devcluster.running(c).values():
            os.kill(pid, 9)
        assert hosts.leftovers(net)
        again = run_cli(args, env)
        assert again.returncode == 0, explain(again)
        assert set(devcluster.running(c)) == {name for name, _ in devcluster._daemons(c)}
        assert srun(c, "-N2", "hostname").split() and len(hosts.leftovers(net)) == 5
    finally:
        started = time.monotonic()
        down = run_cli(["dev-cluster", "down", "--root", str(root)], env)
        down_s = time.monotonic() - started
    assert down.returncode == 0, explain(down)
    print(f"hpc-llm dev-cluster up --hosts --nodes 2: {up_s:.1f} s; down: {down_s:.1f} s")
    assert hosts.leftovers(net) == []
    assert not [n for n in hosts.namespaces() if n.startswith(net.tag)]
    assert not [n for n in hosts.links() if n.startswith(net.tag)]
    mounts = Path("/proc/mounts").read_text()
    assert str(root) not in mounts and f"/run/netns/{net.tag}-" not in mounts
    assert not devcluster.running(c)


def test_two_node_training_on_separate_hosts(dev_cluster_hosts, hosts_env, runs_dir, tmp_path):
    """hpc_llm's own 2-node run on nodes that are hosts: unchanged, it completes; its ranks ran on
    two hosts (their nodes' own names, node-local dirs in each node's /tmp) and met at the first
    node's own address (MASTER_ADDR from its NodeAddr), not at 127.0.0.1."""
    c = dev_cluster_hosts
    proc = run_app(
        [
            "+experiment=mpt_tiny",
            "hydra/launcher=slurm",
            "resources.nodes=2",
            "hydra.launcher.wait=true",
            "hydra.launcher.poll_s=1",
        ],
        hosts_env,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, explain(proc)
    [r] = results_of(runs_dir)
    assert r["status"] == "completed", r["error"]
    assert (r["nodes"], r["world_size"], r["restarts"]) == (2, 4, 0)
    ranks = {p["rank"]: p for p in r["ranks"]}
    first, second = ranks[0]["node"], ranks[2]["node"]
    assert first != second and {first, second} <= set(c.node_names)
    assert ranks[1]["node"] == first and ranks[3]["node"] == second
    assert ranks[0]["cwd"].startswith("/tmp/") and ranks[2]["cwd"].endswith("/node1")
    logs = "\n".join(p.read_text(errors="replace") for p in (Path(r["run_dir"]) / "logs").glob("*"))
    met = re.findall(r"rendezvous ([0-9.]+):\d+", logs)
    assert met and set(met) == {c.node_addr(first)}, met
    assert "127.0.0.1" not in met and "cannot be retrieved" not in logs  # c10d found its peers' names


# -- fabric faults, on a cluster of the test's own -----------------------------------------------

_LISTEN = """
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", int(sys.argv[1])))
s.listen(64)
print("listening", flush=True)
while True:
    c, _ = s.accept()
    c.close()
"""

_CONNECT = """
import errno, socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3])).close()
    print("ok")
except socket.timeout:
    print("timeout")
except OSError as e:
    print(errno.errorcode.get(e.errno, str(e.errno)))
"""

_SINK = """
import socket, sys, time
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", int(sys.argv[1])))
s.listen(8)
print("listening", flush=True)
while True:
    c, _ = s.accept()
    first, n = None, 0
    while True:
        b = c.recv(1 << 16)
        if not b:
            break
        first = first or time.monotonic()
        n += len(b)
    print(n, time.monotonic() - (first or time.monotonic()), flush=True)
    c.close()
"""

_SOURCE = """
import socket, sys
c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=60)
c.sendall(b"x" * int(sys.argv[3]))
c.close()
"""

PORT = 5001


@contextlib.contextmanager
def serving(cluster, node: str, script: str):
    """``script`` (a server printing "listening" once it does) running in node ``node``'s network
    namespace; yields the process (its stdout: what it prints after)."""
    from hpc_llm.devcluster import hosts

    argv = hosts.in_node(cluster.net, node, [sys.executable, "-c", script, str(PORT)])
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "listening", proc.stderr
        yield proc
    finally:
        proc.kill()
        proc.wait()


def run_in(cluster, node: str, script: str, *args: str) -> str:
    from hpc_llm.devcluster import hosts

    argv = hosts.in_node(cluster.net, node, [sys.executable, "-c", script, *args])
    out = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, explain(out)
    return out.stdout.strip()


@pytest.fixture(scope="module")
def fabric_cluster(pytestconfig):
    with hosts_cluster_of_its_own(pytestconfig) as cluster:
        yield cluster


def test_a_cut_link_fails_connects_until_it_is_healed(fabric_cluster):
    """A node cut off (its link down): a connect from another node to it fails (times out, or the
    address is unreachable) and so does one from it; healed, both get through. Cut for N seconds,
    the link comes back by itself."""
    from hpc_llm.devcluster import fabric

    c = fabric_cluster
    to_n2 = [c.node_addr("n2"), str(PORT), "2"]
    with serving(c, "n2", _LISTEN):
        assert run_in(c, "n3", _CONNECT, *to_n2) == "ok"
        cut = fabric.cut(c, "n2")
        try:
            assert fabric.is_cut(c, "n2") and not fabric.is_cut(c, "n3")
            assert run_in(c, "n3", _CONNECT, *to_n2) in ("timeout", "EHOSTUNREACH")
            # and from the node cut off: the controller's address is out of its reach too
            assert run_in(c, "n2", _CONNECT, c.addr, str(c.ctld_port), "2") in (
                "timeout",
                "EHOSTUNREACH",
                "ENETUNREACH",
            )
        finally:
            cut.heal()
        fabric.settle(c, "n2")
        assert run_in(c, "n3", _CONNECT, *to_n2) == "ok"

        timed = fabric.cut(c, "n2", for_s=1)
        assert fabric.is_cut(c, "n2")  # at once; the timer heals it a second later
        timed.wait(timeout_s=30)
        fabric.settle(c, "n2")
        assert not fabric.is_cut(c, "n2") and run_in(c, "n3", _CONNECT, *to_n2) == "ok"


def test_a_partition_drops_what_passes_between_its_sides_silently_and_nothing_else(fabric_cluster):
    """n2 partitioned from n3: a connect between them times out either way (no refusal, no
    unreachable: a switch drops silently), n1 still reaches both, and both still reach the
    controller; mended, n3 reaches n2 again."""
    from hpc_llm.devcluster import fabric

    c = fabric_cluster
    to_n2, to_n3 = [c.node_addr("n2"), str(PORT), "2"], [c.node_addr("n3"), str(PORT), "2"]
    with serving(c, "n2", _LISTEN), serving(c, "n3", _LISTEN):
        fabric.partition(c, "n2", ["n3"])
        try:
            assert run_in(c, "n3", _CONNECT, *to_n2) == "timeout"
            assert run_in(c, "n2", _CONNECT, *to_n3) == "timeout"
            assert run_in(c, "n1", _CONNECT, *to_n2) == "ok" and run_in(c, "n1", _CONNECT, *to_n3) == "ok"
            for node in ("n2", "n3"):
                assert run_in(c, node, _CONNECT, c.addr, str(c.ctld_port), "2") == "ok"
        finally:
            fabric.mend(c, "n2", ["n3"])
        assert run_in(c, "n3", _CONNECT, *to_n2) == "ok" and run_in(c, "n2", _CONNECT, *to_n3) == "ok"


def test_a_slowed_link_slows_a_transfer_and_unslowed_it_is_fast_again(fabric_cluster):
    """tbf at 4 Mbit/s on n2's link: 1 MiB from n2 to n3 takes at least half of 2 s (the rate
    allows no less; the bucket's burst is 32 KiB), and over 3 times the best of three unslowed
    transfers. Robust on a busy machine: ratios and a lower bound only (load makes a transfer
    slower, never faster; the unslowed figure is the best of three, so one stall does not count),
    no bound in seconds above."""
    from hpc_llm.devcluster import fabric

    c = fabric_cluster
    size, rate_bps = 1 << 20, 4_000_000

    def transfer(sink) -> float:
        run_in(c, "n2", _SOURCE, c.node_addr("n3"), str(PORT), str(size))
        n, seconds = sink.stdout.readline().split()
        assert int(n) == size
        return float(seconds)

    with serving(c, "n3", _SINK) as sink:
        fast = min(transfer(sink) for _ in range(3))
        fabric.slow(c, "n2", rate="4mbit")
        try:
            slow = transfer(sink)
        finally:
            fabric.unslow(c, "n2")
        again = min(transfer(sink) for _ in range(3))
    assert slow >= 0.5 * size * 8 / rate_bps, (slow, fast)
    assert slow > 3 * fast and slow > 3 * again, (slow, fast, again)


def test_packet_loss_needs_netem_and_says_so_where_there_is_none(fabric_cluster):
    """Loss (netem) where the kernel has sch_netem: every packet lost, nothing gets through, and
    back after; this machine's kernel has none, and the helper says so (the test then skips)."""
    from hpc_llm.devcluster import fabric

    c = fabric_cluster
    why = fabric.netem_unavailable()
    if why is not None:
        with pytest.raises(fabric.NetemUnavailable, match="netem"):
            fabric.lose(c, "n2", 100)
        pytest.skip(f"packet loss cannot be injected here: {why}")
    with serving(c, "n2", _LISTEN):
        fabric.lose(c, "n2", 100)
        try:
            assert run_in(c, "n3", _CONNECT, c.node_addr("n2"), str(PORT), "2") == "timeout"
        finally:
            fabric.unslow(c, "n2")
        assert run_in(c, "n3", _CONNECT, c.node_addr("n2"), str(PORT), "2") == "ok"


def test_kill_freeze_thaw_and_revive_a_node_that_is_a_host(fabric_cluster):
    """In hosts mode a node's processes are exactly those in its network namespace: freeze_node
    stops them all (a job's too), thaw_node resumes them, kill_node kills every one, and
    revive_node brings the node back as a host that rebooted (an empty /tmp)."""
    from hpc_llm.devcluster import cluster as devcluster
    from hpc_llm.devcluster import hosts

    c = fabric_cluster
    env = c.full_env()
    ns = c.net.netns("n3")
    in_node(c, "n3", "touch /tmp/before-the-reboot")
    job = subprocess.run(
        [c.bin("sbatch"), "--parsable", "-w", "n3", "--no-requeue", "-o", "/dev/null", "--wrap", "sleep 300"],
        env=env,
        capture_output=True,
        text=True,
        cwd="/",
        check=True,
    ).stdout.strip()
    try:
        deadline = time.monotonic() + 60
        while not any(_comm(p) == "sleep" for p in hosts.pids(ns)):
            assert time.monotonic() < deadline, "the job's sleep never started on n3"
            time.sleep(0.2)
        inside = hosts.pids(ns)
        sleeper = next(p for p in inside if _comm(p) == "sleep")
        frozen = devcluster.freeze_node(c, "n3")
        # stopped, or gone meanwhile (a step's short-lived helper: dead, or a zombie its frozen
        # parent cannot reap)
        assert inside <= set(frozen) and all(_state(p) in ("T", "Z", "") for p in inside)
        assert _state(sleeper) == "T"
        devcluster.thaw_node(frozen)
        assert _state(sleeper) in ("S", "R") and not [p for p in inside if _state(p) == "T"]
        killed = devcluster.kill_node(c, "n3")
        assert inside <= set(killed) and hosts.pids(ns) == set()
        assert ns in hosts.namespaces()  # the host's cabling stays
    finally:
        subprocess.run([c.bin("scancel"), job], env=env, capture_output=True)
    devcluster.revive_node(c, "n3")
    assert "before-the-reboot" not in in_node(c, "n3", "ls -a /tmp")
    assert srun(c, "-w", "n3", "hostname").strip() == "n3"


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""
