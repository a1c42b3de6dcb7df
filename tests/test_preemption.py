"""Preemption on a real Slurm cluster: signal, save, requeue, resume exactly.

The dev cluster has a preemptable ``low`` partition and a ``high`` one
(partition-priority preemption, REQUEUE, preempt_send_user_signal). Requeued
jobs wait ``cred_expire`` seconds before starting again; the dev cluster sets
it to 10 s (Slurm's default is 120 s) -- that is how these tests stay short.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from hpc_llm.errors import ConfigError
from hpc_llm.record import Attempt, Attempts
from hpc_llm.slurm.spec import stop_signal
from tests.conftest import explain, results_of, run_app, run_cli

RUN = [
    "+experiment=mpt_tiny",
    "hydra/launcher=slurm",
    "resources.nodes=2",
    "resources.tasks_per_node=1",
    "eval=none",
    "train.max_duration=120ba",
]


def submit(args, env, cwd) -> tuple[str, Path]:
    proc = run_app(args, env, cwd=cwd, timeout=120)
    assert proc.returncode == 0, explain(proc)
    line = next(ln for ln in proc.stdout.splitlines() if "submitted Slurm job" in ln)
    job_id = line.split("submitted Slurm job ")[1].split(",")[0]
    run_dir = Path(line.split("run dir ")[1].split()[0])
    return job_id, run_dir


def attempts(run_dir: Path) -> list[dict]:
    path = run_dir / ".hpc_llm" / "attempts.json"
    return json.loads(path.read_text()) if path.exists() else []


def wait_for(predicate, timeout: float, what: str, poll: float = 1.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def results(run_dir: Path) -> dict:
    p = run_dir / "results.json"
    return json.loads(p.read_text()) if p.exists() else {}


def in_queue(job_id: str, env) -> bool:
    out = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%i"], env=env, capture_output=True, text=True)
    return job_id in out.stdout.split()


def test_batches_lost_arithmetic(tmp_path):
    a = Attempts(
        tmp_path / ".hpc_llm" / "attempts.json",
        [
            Attempt("1", 0, 0.0, resumed_at_batch=0, last_batch=45, stopped_at_batch=45),
            Attempt("1", 1, 1.0, resumed_at_batch=45, last_batch=70),  # killed without a save at 70
            Attempt("1", 2, 2.0, resumed_at_batch=60, last_batch=120),
        ],
    )
    assert a.batches_lost() == 10
    a.save()
    assert [x.last_batch for x in Attempts.load(tmp_path).items] == [45, 70, 120]


def test_usr1_is_refused_as_stop_signal():
    with pytest.raises(ConfigError, match="NCCL uses SIGUSR1"):
        stop_signal("USR1")
    assert stop_signal("SIGUSR2") == "USR2"
    with pytest.raises(ConfigError, match="not a signal name"):
        stop_signal("USR9")


@pytest.mark.slurm
def test_preempted_run_saves_requeues_and_resumes_exactly(slurm_env, tmp_path):
    env = dict(slurm_env, HPC_LLM_RUNS=str(tmp_path / "ref"))
    ref = run_app([*RUN, "hydra.launcher.wait=true", "hydra.launcher.poll_s=1"], env, cwd=tmp_path)
    assert ref.returncode == 0, explain(ref)
    [reference] = results_of(tmp_path / "ref")
    assert reference["status"] == "completed" and reference["restarts"] == 0

    env = dict(slurm_env, HPC_LLM_RUNS=str(tmp_path / "victim"))
    job_id, run_dir = submit(RUN, env, tmp_path)
    wait_for(lambda: any(a["last_batch"] >= 5 for a in attempts(run_dir)), 180, "the victim to train")
    subprocess.run(
        ["sbatch", "-p", "high", "-N", "3", "--exclusive", "--wrap", "sleep 2"],
        env=env,
        check=True,
        capture_output=True,
    )
    r = wait_for(
        lambda: results(run_dir).get("status") in ("completed", "failed") and results(run_dir),
        300,
        "the preempted run to finish",
    )
    assert r["status"] == "completed", r["error"]
    first, second = r["attempts"]
    assert first["ended"] == "preempted" and first["signal"] == "SIGUSR2"
    assert 0 < first["stopped_at_batch"] < 120
    assert second["resumed_at_batch"] == first["stopped_at_batch"]
    assert r["restarts"] == 1 and r["batches_lost"] == 0 and r["batches_done"] == 120
    assert r["slurm_job_ids"] == [job_id]
    assert 0 <= r["signal_to_requeue_s"] < 20
    assert r["train_loss"] == pytest.approx(reference["train_loss"], rel=1e-5)
    wait_for(lambda: not in_queue(job_id, env), 60, "the job to leave the queue")
    status = run_cli(["status"], env)
    row = next(ln for ln in status.stdout.splitlines() if f" {job_id} " in ln)
    assert "COMPLETED" in row and " 1 " in row


@pytest.mark.slurm
def test_max_requeues_exhausted_fails_with_the_reason(slurm_env, tmp_path):
    env = dict(slurm_env, HPC_LLM_RUNS=str(tmp_path / "runs"))
    job_id, run_dir = submit([*RUN, "train.max_duration=2000ba", "preemption.max_requeues=0"], env, tmp_path)
    wait_for(lambda: any(a["last_batch"] >= 2 for a in attempts(run_dir)), 180, "training to start")
    subprocess.run(["scancel", "--batch", "--signal=USR2", job_id], env=env, check=True)
    wait_for(lambda: not in_queue(job_id, env), 120, "the job to end")
    r = results(run_dir)
    assert r["status"] == "failed"
    assert "preemption.max_requeues=0 reached" in r["error"]
    assert r["attempts"][0]["ended"] == "preempted" and r["restarts"] == 0
    assert r["checkpoint"] and Path(r["checkpoint"]).exists()
    status = run_cli(["status"], env)
    assert "FAILED" in next(ln for ln in status.stdout.splitlines() if f" {job_id} " in ln)


@pytest.mark.slurm
def test_a_crash_is_not_requeued(slurm_env, tmp_path):
    env = dict(slurm_env, HPC_LLM_RUNS=str(tmp_path / "runs"))
    job_id, run_dir = submit([*RUN, "train.optimizer.name=no_such_optimizer"], env, tmp_path)
    wait_for(lambda: not in_queue(job_id, env), 180, "the crashed job to end")
    time.sleep(12)  # longer than cred_expire: a requeued job would be back in the queue
    assert not in_queue(job_id, env)
    r = results(run_dir)
    assert r["status"] == "failed" and "no_such_optimizer" in r["error"]
    assert r["restarts"] == 0 and len(r["attempts"]) == 1


@pytest.mark.slurm
def test_timeout_signal_saves_and_requeues(slurm_env, tmp_path):
    """The time-limit path: Slurm sends USR2 signal_lead_s before the limit."""
    env = dict(slurm_env, HPC_LLM_RUNS=str(tmp_path / "runs"))
    job_id, run_dir = submit(
        [*RUN, "train.max_duration=5000ba", "resources.time=2", "hydra.launcher.signal_lead_s=90"], env, tmp_path
    )
    try:
        first = wait_for(
            lambda: next((a for a in attempts(run_dir) if a["ended"] == "preempted"), None),
            240,
            "the time-limit signal",
        )
        assert first["signal"] == "SIGUSR2" and first["requeued"] is True
        resumed = wait_for(
            lambda: (
                len(attempts(run_dir)) > 1 and attempts(run_dir)[1]["resumed_at_batch"] > 0 and attempts(run_dir)[1]
            ),
            120,
            "the requeued job to resume",
        )
        assert resumed["restart"] == 1
        assert resumed["resumed_at_batch"] == first["stopped_at_batch"]
    finally:
        subprocess.run(["scancel", job_id], env=env)
