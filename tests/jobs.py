"""Helpers for tests that submit real Slurm jobs and watch their run dirs."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import time
from pathlib import Path
from typing import Any

from hpc_llm.job import heartbeat
from tests.conftest import explain, run_app

#: one node, one rank, whole nodes (so a preemption hits this run only)
ALONE = [
    "+experiment=mpt_tiny",
    "hydra/launcher=slurm",
    "resources.nodes=1",
    "resources.tasks_per_node=1",
    "eval=none",
    "hydra.launcher.exclusive=true",
]


def paced(batch_s: float, **options: object) -> list[str]:
    """Overrides that hold every batch to ``batch_s`` seconds (tests/plugins/hpc-llm-pace, on
    PYTHONPATH through the ``test_site`` fixture): a test that must catch a run mid-training, or
    needs it to outlast several time limits, gets there on any machine. The loss is unchanged, so
    reference runs stay unpaced. ``options``: the plugin's others (``stall_file``, ...)."""
    key = "++train.callbacks.hpc_llm_test_pace"
    return [f"{key}.batch_s={batch_s:g}", *(f"{key}.{k}={v}" for k, v in options.items())]


def submit(args: list[str], env: dict[str, str], cwd: Path) -> tuple[str, Path]:
    """``python -m hpc_llm <args>`` (no wait): the Slurm job id and the run dir."""
    proc = run_app(args, env, cwd=cwd, timeout=120)
    assert proc.returncode == 0, explain(proc)
    line = next(ln for ln in proc.stdout.splitlines() if "submitted Slurm job" in ln)
    return line.split("submitted Slurm job ")[1].split(",")[0], Path(line.split("run dir ")[1].split()[0])


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text()) if path.exists() else None
    except ValueError:  # caught between write and rename: try again later
        return None


def results(run_dir: Path) -> dict:
    return read_json(run_dir / "results.json") or {}


def attempts(run_dir: Path) -> list[dict]:
    return read_json(run_dir / ".hpc_llm" / "attempts.json") or []


def story(run_dir: Path, lines: int = 25) -> str:
    """What a run went through, for a failed assertion: each attempt's cause and whole error,
    then the last lines of each of its logs (the supervisor's, the agents', the ranks')."""
    parts = [
        f"attempt {a.get('restart')}.{a.get('generation', 0)}: {a.get('state')} / {a.get('cause')}: {a.get('error')}"
        for a in attempts(run_dir)
    ]
    for log in sorted([*(run_dir / "logs").glob("*.log"), *(run_dir / "logs").glob("*.out")]):
        tail = log.read_text(errors="replace").splitlines()[-lines:]
        parts += [f"--- {log.name} (last {len(tail)} lines) ---", *tail]
    return "\n".join(parts)


def beat(run_dir: Path, rank: int) -> dict:
    """Rank ``rank``'s latest heartbeat: seq, batch, node, pid (a slot of its node's file)."""
    found = heartbeat.read_all(run_dir).get(rank)
    return dataclasses.asdict(found) if found else {}


def wait_for(predicate, timeout: float, what: str, poll: float = 0.5):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def finished(run_dir: Path, timeout: float) -> dict:
    """results.json once the run has completed or failed for good."""
    return wait_for(
        lambda: results(run_dir).get("status") in ("completed", "failed") and results(run_dir),
        timeout,
        f"the run in {run_dir} to finish",
    )


def in_queue(job_id: str, env: dict[str, str]) -> bool:
    out = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%i"], env=env, capture_output=True, text=True)
    return job_id in out.stdout.split()


def job_nodes(job_id: str, env: dict[str, str]) -> list[str]:
    out = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%N"], env=env, capture_output=True, text=True)
    nodelist = out.stdout.strip()
    if not nodelist:
        return []
    hosts = subprocess.run(["scontrol", "show", "hostnames", nodelist], env=env, capture_output=True, text=True)
    return hosts.stdout.split()


def preempt(nodes: list[str], env: dict[str, str]) -> str:
    """A short exclusive job on the high partition, on exactly ``nodes``: it preempts the
    (exclusive) job running there and nothing else on the cluster."""
    out = subprocess.run(
        [
            "sbatch",
            "--parsable",
            "-p",
            "high",
            "-N",
            str(len(nodes)),
            "-w",
            ",".join(nodes),
            "--exclusive",
            # not slurm-<id>.out in the directory the suite runs from (the checkout)
            "--output=/dev/null",
            "--wrap",
            "sleep 2",
        ],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    return out.stdout.strip()
