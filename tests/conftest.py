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
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("hpc_llm_cache")


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
    if not any(a.startswith("hydra/launcher=") for a in args):
        args = [*args, "hydra.launcher.stream=false"]  # rank 0's output stays in its log file
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


@pytest.fixture(scope="session")
def dev_cluster(tmp_path_factory: pytest.TempPathFactory):
    """One real 3-node Slurm cluster (Debian slurm-wlm) shared by every Slurm test.

    Started through ``hpc_llm.slurm.devcluster`` (what ``hpc-llm dev-cluster up``
    runs) and stopped, by pid, at the end of the session.
    """
    import shutil

    from hpc_llm.slurm import devcluster

    if shutil.which("slurmctld") is None or os.geteuid() != 0:
        reason = "needs Debian slurm-wlm and root (scripts/setup-dev.sh installs it)"
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    root = tmp_path_factory.mktemp("devcluster")
    if str(root).startswith("/tmp/"):
        pytest.fail("Slurm jobs get a private /tmp: run pytest with --basetemp outside /tmp (see README)")
    cluster = devcluster.up(root=root, nodes=3, ctld_port=_free_port_block(4))
    yield cluster
    devcluster.down(root)


@pytest.fixture
def slurm_env(app_env: dict[str, str], dev_cluster) -> dict[str, str]:
    return dict(app_env, **dev_cluster.env())
