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
def app_env(runs_dir: Path, cache_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "HPC_LLM_", "HYDRA_"))}
    env.update(HPC_LLM_RUNS=str(runs_dir), HPC_LLM_CACHE=str(cache_dir), PYTHONUNBUFFERED="1")
    return env


EXAMPLE_PLUGIN = ROOT / "plugins" / "hpc-llm-jsonl"


def pip_install(src: Path, target: Path) -> None:
    """A real ``pip install`` of a plugin package into ``target`` (put it on PYTHONPATH)."""
    subprocess.run(
        [PY, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--target", str(target), str(src)],
        check=True, capture_output=True, text=True,
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
        [PY, *(python_flags or []), "-m", "hpc_llm", *args, "hydra.launcher.stream=false"],
        env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout,
    )


def run_cli(args: list[str], env: dict[str, str], timeout: int = 300):
    """``hpc-llm <args>`` through the installed console script's module."""
    return subprocess.run(
        [PY, "-c", "from hpc_llm.cli import main; main()", *args],
        env=env, capture_output=True, text=True, timeout=timeout,
    )


def results_of(runs_dir: Path) -> list[dict]:
    """Every results.json under ``runs_dir``, ordered by Hydra job number."""
    files = sorted(runs_dir.rglob("results.json"), key=lambda p: (str(p.parent.parent), int(p.parent.name)))
    return [json.loads(p.read_text()) for p in files]


def explain(proc: subprocess.CompletedProcess) -> str:
    return f"exit {proc.returncode}\n--- stdout ---\n{proc.stdout[-4000:]}\n--- stderr ---\n{proc.stderr[-4000:]}"
