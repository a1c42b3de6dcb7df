"""Shared fixtures: subprocess runners for the real entry points.

Runs go through ``python -m hpc_llm`` / ``hpc-llm`` in subprocesses, exactly as
users run them; the tiny corpus cache is shared by the whole session so the
tokenizer and MDS shards are built once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable


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
        PYTHONUNBUFFERED="1",
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


def run_cli(args: list[str], env: dict[str, str], timeout: int = 300):
    """``hpc-llm <args>`` through the installed console script's module."""
    return subprocess.run(
        [PY, "-c", "from hpc_llm.cli import main; main()", *args],
        env=env,
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
    """A port p with p..p+n-1 all free on this host (slurmctld + one slurmd per node)."""
    import random
    import socket

    for _ in range(200):
        base = random.randrange(30000, 45000)
        try:
            socks = []
            for p in range(base, base + n):
                s = socket.socket()
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


def _slurm_tests_wanted(config: pytest.Config) -> bool:
    import shutil

    markexpr = config.getoption("markexpr") or ""
    return "not slurm" not in markexpr and shutil.which("slurmctld") is not None and os.geteuid() == 0


CLUSTER_ENV = "HPC_LLM_TEST_CLUSTER"


def _start_cluster(config: pytest.Config):
    from hpc_llm.slurm import devcluster

    shared = shared_dir(config)
    if str(shared).startswith("/tmp/"):
        raise pytest.UsageError("Slurm jobs get a private /tmp: run pytest with --basetemp outside /tmp (see README)")
    root = shared / "devcluster"
    devcluster.down(root)  # a cluster an interrupted session left behind
    import shutil

    shutil.rmtree(shared, ignore_errors=True)
    shared.mkdir(parents=True)
    cluster = devcluster.up(root=root, nodes=3, ctld_port=_free_port_block(16))
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
    if hasattr(config, "workerinput") or not config.getoption("numprocesses", None):
        return
    if _slurm_tests_wanted(config):
        _start_cluster(config)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``long`` go first: under xdist each then runs beside the short ones
    instead of alone at the end of the session."""
    items.sort(key=lambda item: item.get_closest_marker("long") is None)


def pytest_unconfigure(config: pytest.Config) -> None:
    cluster = getattr(config, "_hpc_llm_cluster", None)
    if cluster is not None:
        from hpc_llm.slurm import devcluster

        devcluster.down(cluster.root)


@pytest.fixture(scope="session")
def dev_cluster(pytestconfig: pytest.Config):
    """The session's real 3-node Slurm cluster (Debian slurm-wlm), shared by every Slurm test
    and every xdist worker: started through ``hpc_llm.slurm.devcluster`` (what ``hpc-llm
    dev-cluster up`` runs) before the tests and stopped, by pid, after them."""
    from hpc_llm.slurm import devcluster

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
