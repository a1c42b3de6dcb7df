"""Slurm accounting for real (slurmdbd on MariaDB, started by the dev cluster): status,
reports and the ledger read a run's whole history from sacct and never lose or invent a
state. The preemption and node-death cases are checked against sacct in test_faults.py."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import PY, explain, run_app, run_cli
from tests.jobs import in_queue, submit, wait_for

TINY = [
    "+experiment=mpt_tiny",
    "hydra/launcher=slurm",
    "resources.tasks_per_node=1",
    "eval=none",
    "train.max_duration=2ba",
]


def sacct(job_id: str, env: dict[str, str], fields: str = "State,ElapsedRaw,AllocTRES,NodeList") -> list[list[str]]:
    out = subprocess.run(
        ["sacct", "-n", "-X", "-D", "-P", "-j", job_id, "-o", fields],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return [ln.split("|") for ln in out.stdout.splitlines() if ln.strip()]


def status_line(env: dict[str, str], job_id: str) -> str:
    out = run_cli(["status", "--all"], env)
    assert out.returncode == 0, explain(out)
    return next(ln for ln in out.stdout.splitlines() if f" {job_id} " in ln)


# -- the ledger ------------------------------------------------------------------------------

WRITER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from hpc_llm.results import ledger
    me, n, go = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])
    # a sweep being submitted while `status` refreshes
    runs = [
        ledger.record(f"/runs/{me}/{i}", f"/runs/{me}", i, "x", "slurm", [f"i={i}"], [f"{me}{i}"], "SUBMITTED")
        for i in range(n)
    ]
    deadline = time.time() + 120
    while not go.exists():  # the refresher has set restarts on every run: our copies are stale now
        assert time.time() < deadline, "the refresher never said go"
        time.sleep(0.05)
    for run in runs:
        ledger.update(run, state="RUNNING")
        ledger.update(run, expect_state="RUNNING", state="COMPLETED")
    """
)
REFRESHER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from hpc_llm.results import ledger
    total, go = int(sys.argv[1]), Path(sys.argv[2])
    deadline = time.time() + 120
    seen = []
    while len(seen) < total:  # refresh what is there while the writers submit
        assert time.time() < deadline, f"only {len(seen)} of {total} runs ever reached the ledger"
        seen = ledger.runs()
        for run in seen:
            ledger.update(run, restarts=7)  # status refreshing restarts from results.json
    go.touch()
    for run in seen:  # a refresh from a snapshot taken before the runs ended (stale states)
        ledger.update(run, restarts=7)
    """
)


def test_concurrent_writers_lose_nothing(app_env, tmp_path):
    """Four processes submit 25 runs each while a fifth refreshes every run's restarts; then
    the writers, holding copies that predate the refresher's restarts, end their runs while
    the refresher writes from a snapshot that predates those ends. Every run is COMPLETED with
    restarts 7: a whole-row update would lose the restarts (writers) or the states (refresher)."""
    env = dict(app_env, HPC_LLM_HOME=str(tmp_path / "home"))
    go = tmp_path / "go"
    writers = [
        subprocess.Popen([PY, "-c", WRITER, f"w{k}", "25", str(go)], env=env, stderr=subprocess.PIPE, text=True)
        for k in range(4)
    ]
    refresher = subprocess.Popen([PY, "-c", REFRESHER, "100", str(go)], env=env, stderr=subprocess.PIPE, text=True)
    for p in [*writers, refresher]:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
    rows = subprocess.run(
        [PY, "-c", "from hpc_llm.results import ledger; print([(r.state, r.restarts) for r in ledger.runs()])"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    states = eval(rows)  # noqa: S307 - our own repr of a list of tuples
    assert len(states) == 100 and set(states) == {("COMPLETED", 7)}


def test_a_final_state_is_never_undone_and_stale_writers_lose(app_env, tmp_path, monkeypatch):
    monkeypatch.setenv("HPC_LLM_HOME", str(tmp_path / "home"))
    from hpc_llm.results import ledger

    run = ledger.record("/r/0", "/r", 0, "x", "slurm", [], ["1"], "RUNNING")
    stale = ledger.Run(**{**run.__dict__})
    done = ledger.update(run, state="COMPLETED", error=None)
    assert done.state == "COMPLETED"
    assert ledger.update(stale, state="RUNNING").state == "COMPLETED"  # a late squeue answer
    assert ledger.update(stale, expect_state="RUNNING", restarts=3).restarts == 0  # CAS on a stale read
    assert ledger.update(done, restarts=2).restarts == 2 and ledger.find("1").state == "COMPLETED"


def test_a_ledger_on_nfs_is_named_once(tmp_path, monkeypatch, capsys):
    from hpc_llm import errors
    from hpc_llm.results import ledger

    mounts = tmp_path / "mounts"
    mounts.write_text(f"server:/export/home {tmp_path} nfs4 rw,relatime 0 0\n/dev/vda / ext4 rw 0 0\n")
    assert ledger.filesystem_type(tmp_path / "home", mounts) == "nfs4"
    assert ledger.filesystem_type(Path("/usr"), mounts) == "ext4"
    monkeypatch.setattr(ledger, "MOUNTS", mounts)
    monkeypatch.setattr(errors, "_warned", set())
    ledger._check_filesystem(tmp_path / "home" / "ledger.sqlite")
    ledger._check_filesystem(tmp_path / "home" / "ledger.sqlite")
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is on nfs4" in err[0] and "HPC_LLM_HOME" in err[0]


# -- on the dev cluster, against sacct -------------------------------------------------------


@pytest.mark.slurm
def test_a_completed_two_node_run_in_status_and_report(slurm_env, runs_dir, tmp_path):
    proc = run_app([*TINY, "resources.nodes=2", "hydra.launcher.wait=true", "hydra.launcher.poll_s=1"], slurm_env)
    assert proc.returncode == 0, explain(proc)
    job_id = re.search(r"submitted Slurm job (\d+)", proc.stdout).group(1)
    [(state, elapsed, tres, nodes)] = sacct(job_id, slurm_env)
    assert state == "COMPLETED" and "node=2" in tres
    assert "COMPLETED" in status_line(slurm_env, job_id)
    shown = run_cli(["status", job_id], slurm_env)
    assert "COMPLETED" in shown.stdout and "node=2" in shown.stdout, explain(shown)
    sweep = next(runs_dir.glob("mpt_tiny/*"))
    rep = run_cli(["report", str(sweep), "--format", "json"], slurm_env)
    groups, _ = json.JSONDecoder().raw_decode(rep.stdout)
    [row] = [row for g in groups for row in g["rows"]]
    cpus = int(dict(kv.split("=") for kv in tres.split(","))["cpu"])
    assert row["Resource-hours"] == f"{cpus * int(elapsed) / 3600:.3g} CPU-hours"
    assert row["Attempts (Slurm)"] == "COMPLETED" and row["Queue wait"] is not None
    compare = run_cli(["estimate", "--compare", str(sweep), "--peak-flops", "1e11", "--mfu", "0.5"], slurm_env)
    assert compare.returncode == 0, explain(compare)
    assert f"{cpus * int(elapsed) / 3600:.3g} CPU-hours" in compare.stdout


@pytest.mark.slurm
def test_a_cancelled_run_and_one_killed_before_srun(slurm_env, runs_dir, tmp_path):
    queued, _ = submit([*TINY, "+hydra.launcher.extra_sbatch.begin=now+3600"], slurm_env, tmp_path)
    broken, run_dir = submit([*TINY, "hydra.launcher.setup=[exit 3]"], slurm_env, tmp_path)
    subprocess.run(["scancel", queued], env=slurm_env, check=True)
    wait_for(lambda: not in_queue(queued, slurm_env) and not in_queue(broken, slurm_env), 120, "both to end")
    assert sacct(queued, slurm_env)[-1][0].startswith("CANCELLED")
    assert sacct(broken, slurm_env, "State,ExitCode") == [["FAILED", "3:0"]]
    assert "CANCELLED" in status_line(slurm_env, queued)
    line = status_line(slurm_env, broken)
    assert "FAILED" in line
    shown = run_cli(["status", broken], slurm_env)
    # it died before writing anything: Slurm's verdict is all there is, and says why
    assert "error: Slurm: FAILED" in shown.stdout and "exit code 3:0" in shown.stdout, explain(shown)
    assert not (run_dir / "results.json").exists()
    # the report has both, from accounting (neither run wrote a results.json), neither "running"
    rep = run_cli(["report", str(runs_dir / "mpt_tiny"), "--format", "json"], slurm_env)
    assert rep.returncode == 0, explain(rep)
    groups, _ = json.JSONDecoder().raw_decode(rep.stdout)
    rows = sorted((row["Attempts (Slurm)"], row["Status"]) for g in groups for row in g["rows"])
    assert [attempts for attempts, _ in rows] == ["CANCELLED", "FAILED"], rows
    assert rows[0][1].startswith("cancelled (Slurm: CANCELLED"), rows
    assert rows[1][1] == "failed (Slurm: FAILED, exit code 3:0)", rows


@pytest.mark.slurm
def test_a_failing_squeue_and_sacct_leave_a_running_job_running(slurm_env, runs_dir, tmp_path):
    job_id, run_dir = submit([*TINY, "train.max_duration=100000ba"], slurm_env, tmp_path)
    wait_for(lambda: "RUNNING" in status_line(slurm_env, job_id), 120, "the job to run")
    lost = dict(slurm_env, SLURM_CONF=str(tmp_path / "no-such" / "slurm.conf"))  # slurmctld unreachable
    for _ in range(2):
        out = run_cli(["status", "--all"], lost)
        assert out.returncode == 0, explain(out)
        row = next(ln for ln in out.stdout.splitlines() if f" {job_id} " in ln)
        assert "RUNNING" in row  # unknown is not finished
    assert in_queue(job_id, slurm_env) and "RUNNING" in status_line(slurm_env, job_id)
    subprocess.run(["scancel", job_id], env=slurm_env, check=True)
    wait_for(lambda: "CANCELLED" in status_line(slurm_env, job_id), 120, "the cancel to show")


@pytest.mark.slurm
def test_an_h100_shaped_job_is_scheduled_and_its_ranks_see_their_gpus(slurm_env, tmp_path):
    """8 GPUs per node as GRES (no devices): the flags hpc_llm renders for cluster=h100, bar
    the partition and account this cluster does not have, run `srun` of 8 tasks a node."""
    render = run_cli(["render", "+experiment=mpt125m_c4", "cluster=h100", "resources.nodes=2"], slurm_env)
    assert render.returncode == 0, explain(render)
    flags = [
        ln.split(" ", 1)[1]
        for ln in render.stdout.splitlines()
        if ln.startswith("#SBATCH ")
        and not ln.startswith(("#SBATCH --partition", "#SBATCH --account", "#SBATCH --output", "#SBATCH --export"))
    ]
    assert "--gpus-per-node=8" in flags and "--ntasks-per-node=8" in flags
    # two whole nodes on the shared cluster, which other tests' jobs keep busy: first in line
    # (as root, an administrator), or it waits behind every job submitted meanwhile
    flags = [f for f in flags if not f.startswith("--cpus-per-task")]
    flags += ["--cpus-per-task=1", "--time=5", "--priority=TOP"]
    out = tmp_path / "gpus.txt"
    job = subprocess.run(
        [
            "sbatch",
            "--parsable",
            "--wait",
            f"--output={out}",
            *flags,
            "--wrap",
            "srun bash -c 'echo $SLURMD_NODENAME $SLURM_LOCALID $CUDA_VISIBLE_DEVICES'",
        ],
        env=slurm_env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert job.returncode == 0, job.stderr
    seen = sorted(tuple(ln.split()) for ln in out.read_text().splitlines() if ln.strip())
    assert len(seen) == 16 and len({node for node, _l, _g in seen}) == 2
    assert {gpus for _n, _l, gpus in seen} == {"0,1,2,3,4,5,6,7"}  # --gpus-per-node: all 8 visible
    [(state, _e, tres, _nodes)] = sacct(job.stdout.strip().split(";")[0], slurm_env)
    assert state == "COMPLETED" and "gres/gpu=16" in tres


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
