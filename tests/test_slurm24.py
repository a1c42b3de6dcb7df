"""The smoke set on Slurm 24.11: a second dev cluster (Debian trixie's slurm-wlm 24.11 from
scripts/install-slurm.sh, ``devcluster.up(slurm="24.11")``) beside the session's 22.05 one.

The same scenarios as on 22.05, through the same helpers and, where a test is about exactly
that, the 22.05 test itself run against this cluster: a sweep that is one array, a dry run that
asks ``sbatch --test-only``, a preemption resumed exactly, a node death requeued, a killed rank
restarted in place, and what ``hpc-llm status`` reads from sacct. What differs between the
versions is in docs/design/verified/slurm.md ("Slurm 24.11 beside 22.05, verified"); the parsers are checked
on both versions' captured outputs in test_slurm_parsers.py. Marked slurm24 (and slurm): a
session that selects one of these tests starts the 24.11 cluster (tests/conftest.py).
"""

from __future__ import annotations

import re

import pytest

from tests import test_accounting, test_faults, test_sweeps
from tests.conftest import explain, results_of, run_app, run_cli
from tests.jobs import ALONE, in_queue, wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.slurm24]


def test_it_is_24_11(slurm24_env, dev_cluster_24):
    """Every Slurm command these tests run, and the jobs' srun and scontrol, are 24.11's."""
    import shutil
    import subprocess

    path = slurm24_env["PATH"]
    for cmd in ("sbatch", "srun", "scontrol", "squeue", "sacct", "sinfo", "scancel"):
        assert shutil.which(cmd, path=path) == str(dev_cluster_24.prefix / "bin" / cmd)
    out = subprocess.run(["scontrol", "show", "config"], env=slurm24_env, capture_output=True, text=True, check=True)
    assert re.search(r"^SLURM_VERSION\s*=\s*24\.11\.", out.stdout, re.M), out.stdout[:2000]


def test_a_sweep_of_two_is_one_array_and_trains(slurm24_env, runs_dir, tmp_path):
    args = [*ALONE, "hydra.launcher.exclusive=false", "train.max_duration=8ba", "train.seed=1,2"]
    proc = run_app([*args, "hydra.launcher.wait=true", "hydra.launcher.poll_s=1"], slurm24_env, cwd=tmp_path)
    assert proc.returncode == 0, explain(proc)
    refs = re.findall(r"submitted Slurm job (\d+_\d+)", proc.stdout)
    assert len(refs) == 2 and len({r.split("_")[0] for r in refs}) == 1, proc.stdout
    rs = results_of(runs_dir)
    assert [(r["status"], r["batches_done"], r["restarts"]) for r in rs] == [("completed", 8, 0)] * 2
    status = run_cli(["status", "--all"], slurm24_env)
    assert status.returncode == 0, explain(status)
    assert sum("COMPLETED" in line for line in status.stdout.splitlines() if any(r in line for r in refs)) == 2


def test_a_dry_run_asks_sbatch_test_only_and_submits_nothing(slurm24_env, runs_dir, tmp_path):
    """24.11's `sbatch --test-only` refuses 9 GPUs on 8-GPU nodes as 22.05's does."""
    dry = [*test_sweeps.QUICK, "hydra.launcher.dry_run=true"]
    proc = run_app([*dry, "resources.gpus_per_node=4,9"], slurm24_env, cwd=tmp_path, timeout=120)
    assert proc.returncode == 2, explain(proc)
    [line] = proc.stderr.strip().splitlines()
    assert "Slurm would refuse job 1 (" in line and "--gpus-per-node=9" in line, line
    assert "Requested node configuration is not available" in line
    ok = run_app([*dry, "resources.gpus_per_node=8"], slurm24_env, cwd=tmp_path, timeout=120)
    assert ok.returncode == 0, explain(ok)
    assert "dry run, batch script" in ok.stdout and len(list(runs_dir.rglob("sbatch.sh"))) == 1
    assert test_sweeps.queued(slurm24_env, tmp_path) == set()


def test_a_preempted_run_resumes_exactly_in_one_preempted_attempt(slurm24_env, test_site, tmp_path, pytestconfig):
    """As on 22.05 (test_faults), and accounting has exactly the preempted attempt and the one
    that finished: the supervisor ends its batch script in the grace time, so Slurm requeues it
    and clears the preemption's flag (with `scontrol requeue` instead, 24.11 booked the finished
    attempt PREEMPTED and started a third one: slurm_job.requeued_by_ending)."""
    args = [*ALONE, "train.max_duration=300ba"]
    ref = test_faults.reference(args, slurm24_env, pytestconfig)
    job_id, r = test_faults.preempted_run(args, slurm24_env, tmp_path, test_site)
    test_faults.same_loss(r, ref)
    first, second = r["attempts"]
    assert (first["state"], first["cause"], first["signal"]) == ("stopped", "preemption", "SIGUSR2")
    assert second["resumed_at_batch"] == first["stopped_at_batch"] > 0 and r["batches_lost"] == 0
    assert r["slurm_job_ids"] == [job_id] and 0 <= r["signal_to_requeue_s"] < 20
    wait_for(lambda: not in_queue(job_id, slurm24_env), 60, "the job to leave the queue")
    assert [state for state, _nodes in test_faults.slurm_attempts(job_id, slurm24_env)] == ["PREEMPTED", "COMPLETED"]
    shown = run_cli(["status", job_id], slurm24_env)
    assert "PREEMPTED" in shown.stdout and "COMPLETED" in shown.stdout and "preemption" in shown.stdout, explain(shown)


def test_status_reads_a_cancelled_and_a_failed_job_from_sacct(slurm24_env, runs_dir, tmp_path):
    """A job cancelled while queued (24.11's sacct: Start None where 22.05 gave the cancel
    time) and one whose batch script exits 3 before srun: Slurm's verdicts in status and report."""
    test_accounting.test_a_cancelled_run_and_one_killed_before_srun(slurm24_env, runs_dir, tmp_path)
