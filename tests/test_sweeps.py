"""Sweeps on the dev cluster: job arrays, all-or-nothing submission, the scheduler asked
first, detached sweeps (``hpc-llm wait``), provenance and code snapshots."""

from __future__ import annotations

import datetime
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import PY, ROOT, explain, run_app, run_cli, with_site
from tests.jobs import ALONE, attempts, beat, finished, job_nodes, paced, preempt, submit, wait_for

pytestmark = pytest.mark.slurm

APP = ROOT / "tests" / "hydra_app" / "app.py"
QUICK = [  # a run that only starts its ranks and records (no training): seconds a task
    "+experiment=mpt_tiny",
    "hydra/launcher=slurm",
    "resources.nodes=1",
    "resources.tasks_per_node=1",
    "preflight.enabled=true",
    "preflight.only=true",
    "preflight.checks=[]",
]
LATER = "+hydra.launcher.extra_sbatch.begin=now+3600"  # queued, never started (sbatch still judges it)


def sacct_rows(job: str, env: dict[str, str]) -> list[list[str]]:
    out = subprocess.run(
        ["sacct", "-X", "-n", "-P", "-j", job, "--format=JobID,State,Start,End"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return [line.split("|") for line in out.stdout.split()]


def most_at_once(rows: list[list[str]]) -> int:
    """The most tasks that ran at the same time, from sacct's Start/End."""
    events = []
    for _job, _state, start, end in rows:
        events += [(datetime.datetime.fromisoformat(start), 1), (datetime.datetime.fromisoformat(end), -1)]
    running = most = 0
    for _t, step in sorted(events):  # an end sorts before a start at the same second
        running += step
        most = max(most, running)
    return most


def queued(env: dict[str, str], under: Path) -> set[str]:
    """Jobs in the queue whose batch script lies under ``under`` (other tests share the cluster)."""
    out = subprocess.run(["squeue", "-h", "-r", "-o", "%i %o"], env=env, capture_output=True, text=True, check=True)
    return {job for job, _, script in (ln.partition(" ") for ln in out.stdout.splitlines()) if str(under) in script}


def test_a_100_point_sweep_is_one_array_throttled_and_waited_for(slurm_env, tmp_path):
    """A plain Hydra app (a second of CPU a task) so that the array, not training, is tested."""
    env = {k: v for k, v in slurm_env.items() if not k.startswith("HPC_LLM_")}
    env["HPC_LLM_HOME"] = slurm_env["HPC_LLM_HOME"]
    sweep = tmp_path / "sweep"
    proc = subprocess.run(
        [
            PY,
            str(APP),
            "-m",
            "x=range(0,100)",
            "hydra/launcher=slurm",
            "hydra.launcher.array_parallelism=4",
            f"hydra.sweep.dir={sweep}",
        ],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, explain(proc)
    refs = re.findall(r"submitted Slurm job (\d+)_(\d+)", proc.stdout)
    assert len(refs) == 100 and len({a for a, _ in refs}) == 1  # one array: one sbatch call
    assert sorted(int(i) for _, i in refs) == list(range(100))
    [array] = {a for a, _ in refs}
    assert f"Slurm job array {array}: 100 points of one shape, at most 4 running at once" in proc.stdout
    waited = run_cli(["wait", str(sweep), "--poll", "1"], env, timeout=900)
    assert waited.returncode == 0, explain(waited)
    for i in range(100):  # each task ran its own point in its own run dir
        seen = json.loads((sweep / str(i) / "seen.json").read_text())
        assert seen["cfg"] == {"x": i, "doubled": 2 * i} and seen["num"] == i
    rows = sacct_rows(array, env)
    assert len(rows) == 100 and {r[1] for r in rows} == {"COMPLETED"}
    assert 1 < most_at_once(rows) <= 4
    status = run_cli(["status"], env)
    # the sweep is one row (its run dir may fold onto more lines: match the row by its count)
    [line] = [ln for ln in status.stdout.splitlines() if "100 runs" in ln]
    assert "100 COMPLETED" in line and "100 runs" in line


@pytest.mark.parametrize("keep", [False, True], ids=["cancel", "keep"])
def test_a_point_refused_mid_sweep_cancels_or_keeps_what_went_before(keep, slurm_env, runs_dir, tmp_path):
    """Without asking first (test_only=false), sbatch itself refuses the third point (9 GPUs,
    the nodes have 8): one line names it, and what was submitted is cancelled (or kept)."""
    before = queued(slurm_env, tmp_path)
    proc = run_app(
        [
            *QUICK,
            "resources.gpus_per_node=0,1,9",
            LATER,
            "hydra.launcher.test_only=false",
            f"hydra.launcher.keep_on_reject={str(keep).lower()}",
        ],
        slurm_env,
        cwd=tmp_path,
        timeout=120,
    )
    assert proc.returncode == 2, explain(proc)
    [line] = proc.stderr.strip().splitlines()
    assert "Slurm refused job 2 [" in line and "resources.gpus_per_node=9" in line
    assert "Requested node configuration is not available" in line
    mine = queued(slurm_env, tmp_path) - before
    try:
        if keep:
            assert len(mine) == 2 and "kept the 2 point(s) already submitted" in line
            runs = sorted(p.name for p in next(runs_dir.glob("mpt_tiny/*")).iterdir() if p.name.isdigit())
            assert runs == ["0", "1"]  # the refused point left nothing behind
        else:
            assert mine == set() and "cancelled the 2 job(s) it had submitted" in line
            assert not list(runs_dir.glob("mpt_tiny/*"))
    finally:
        subprocess.run(["scancel", *mine], env=slurm_env, check=False)


def test_the_scheduler_is_asked_before_anything_is_submitted(slurm_env, runs_dir, tmp_path):
    before = queued(slurm_env, tmp_path)
    proc = run_app([*QUICK, "resources.gpus_per_node=4,9"], slurm_env, cwd=tmp_path, timeout=120)
    assert proc.returncode == 2, explain(proc)
    [line] = proc.stderr.strip().splitlines()
    assert line.startswith("hpc_llm: error: Slurm would refuse job 1 (") and "--gpus-per-node=9" in line
    assert "Requested node configuration is not available; nothing was submitted" in line
    assert queued(slurm_env, tmp_path) == before and not runs_dir.exists()


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout


def test_each_run_records_its_commit_dirty_tree_diff_and_command(slurm_env, runs_dir, tmp_path):
    """Submitted from a user's project repository with an uncommitted change."""
    repo = tmp_path / "project"
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / "notes.txt").write_text("first\n")
    _git(repo, "add", "notes.txt")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "one")
    commit = _git(repo, "rev-parse", "HEAD").strip()
    (repo / "notes.txt").write_text("first\nchanged after the commit\n")
    args = [*QUICK, "train.optimizer.lr=1e-4,2e-4", "hydra.launcher.dry_run=true"]
    proc = run_app(args, slurm_env, cwd=repo, timeout=120)
    assert proc.returncode == 0, explain(proc)
    run_dirs = sorted(p for p in next(runs_dir.glob("mpt_tiny/*")).iterdir() if p.name.isdigit())
    assert len(run_dirs) == 2
    for run_dir in run_dirs:
        prov = json.loads((run_dir / ".hpc_llm" / "provenance.json").read_text())
        assert prov["git"]["commit"] == commit and prov["git"]["dirty"] is True
        assert prov["git"]["repo"] == str(repo)
        assert "+changed after the commit" in (run_dir / prov["diff_file"]).read_text()
        assert prov["command"].startswith("python -m hpc_llm +experiment=mpt_tiny")
        assert "train.optimizer.lr=1e-4,2e-4" in prov["command"]
        assert prov["versions"]["hpc-llm"] and prov["versions"]["hydra-core"]
        # hpc_llm's own checkout is recorded too (the repository the package runs from)
        assert {r["repo"] for r in prov["repos"]} >= {str(repo), str(ROOT)}


def test_a_snapshot_runs_the_code_as_it_was_submitted(slurm_env, runs_dir, tmp_path):
    """snapshot=true: the job imports hpc_llm from the copy in its sweep dir, taken at
    submit time, and results.json has the provenance with the job's own versions."""
    job_id, run_dir = submit(
        [*QUICK, "hydra.launcher.snapshot=true", "+hydra.launcher.extra_sbatch.hold=true"], slurm_env, tmp_path
    )
    code = run_dir.parent / ".hpc_llm" / "code"
    copied = code / "hpc_llm" / "job" / "rank" / "task.py"
    assert copied.read_text() == (ROOT / "hpc_llm" / "job" / "rank" / "task.py").read_text()
    assert (code / "hpc_llm" / "_data" / "conf" / "config.yaml").is_file()
    assert (code / "hydra_plugins" / "hpc_llm_launchers").is_dir()
    assert f"export PYTHONPATH={code}" in (run_dir / "sbatch.sh").read_text()
    subprocess.run(["scontrol", "release", job_id], env=slurm_env, check=True)
    r = finished(run_dir, 180)
    assert r["status"] == "completed", r.get("error")
    job = r["provenance"]["job"]
    assert job["hpc_llm_path"] == str(code / "hpc_llm")
    assert job["versions"]["torch"] and job["versions"]["llm-foundry"] == "0.22.0"
    assert r["provenance"]["git"]["commit"] == _git(ROOT, "rev-parse", "HEAD").strip()


def test_snapshot_with_a_container_is_refused_in_one_line(slurm_env, runs_dir, tmp_path):
    image = tmp_path / "x.sif"
    image.write_bytes(b"hsqs" + bytes(92))  # passes the header check; never run: the combination is refused
    proc = run_app(
        [*QUICK, "hydra.launcher.snapshot=true", "container=apptainer", f"container.image={image}"],
        slurm_env,
        cwd=tmp_path,
        timeout=120,
    )
    assert proc.returncode == 2, explain(proc)
    line = proc.stderr.strip().splitlines()[-1]  # (after a warning where apptainer is not installed)
    assert line.startswith("hpc_llm: error: hydra.launcher.snapshot=true") and "container=apptainer" in line
    assert not runs_dir.exists()


def test_an_array_task_is_preempted_and_resumed_on_its_own(slurm_env, runs_dir, test_site, tmp_path):
    """Two points of one shape (one array, each task on a node of its own): preempting the
    node of task 1 stops, requeues and resumes task 1 alone."""
    env = with_site(dict(slurm_env), test_site)
    proc = run_app(
        [
            *ALONE,
            "checkpoint.interval=10ba",
            "train.max_duration=200ba",
            "train.seed=1,2",
            *paced(0.1),  # still training when the preemption lands, on any machine
        ],
        env,
        cwd=tmp_path,
        timeout=120,
    )
    assert proc.returncode == 0, explain(proc)
    refs = re.findall(r"submitted Slurm job (\d+_\d+), run dir (\S+)", proc.stdout)
    assert len(refs) == 2 and refs[0][0].split("_")[0] == refs[1][0].split("_")[0]
    (task0, dir0), (task1, dir1) = [(j, Path(d)) for j, d in refs]
    wait_for(lambda: beat(dir1, 0).get("batch", -1) >= 20, 240, "task 1 to train")
    preempt(job_nodes(task1, env), env)
    r1, r0 = finished(dir1, 400), finished(dir0, 400)
    assert r1["status"] == r0["status"] == "completed"
    assert r1["restarts_by_cause"] == {"preemption": 1} and r1["batches_done"] == 200
    first, second = attempts(dir1)
    assert first["cause"] == "preemption" and second["resumed_at_batch"] == first["stopped_at_batch"] > 0
    assert r0["restarts"] == 0 and len(attempts(dir0)) == 1


def test_status_of_a_sweep_and_report_wait(slurm_env, tmp_path):
    """Detached: submit, then ``hpc-llm report --wait`` returns the finished sweep's table."""
    proc = run_app([*QUICK, "train.optimizer.lr=1e-4,2e-4,3e-4"], slurm_env, cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, explain(proc)
    sweep = Path(re.search(r"run dir (\S+)/0 ", proc.stdout).group(1))
    rep = run_cli(["report", str(sweep), "--wait", "--poll", "1", "--format", "json"], slurm_env, timeout=600)
    assert rep.returncode == 0, explain(rep)
    groups, _end = json.JSONDecoder().raw_decode(rep.stdout)
    rows = [row for g in groups for row in g["rows"]]
    assert len(rows) == 3 and all(r["Status"] == "completed" for r in rows)
    status = run_cli(["status"], slurm_env)
    [line] = [ln for ln in status.stdout.splitlines() if "3 runs" in ln and "(a sweep)" in ln]
    assert "3 COMPLETED" in line


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
