"""The Slurm path on a real Slurm cluster (slurmctld + 3 slurmd, Debian slurm-wlm).

Jobs are submitted through ``python -m hpc_llm ... hydra/launcher=slurm``
exactly as users do, run under sbatch + srun, and train for real.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import explain, results_of, run_app, run_cli

pytestmark = [pytest.mark.slurm]

FAST = [
    "+experiment=mpt_tiny",
    "train.max_duration=8ba",
    "eval=none",
    "hydra/launcher=slurm",
    "hydra.launcher.wait=true",
    "hydra.launcher.poll_s=1",
]


def jobs_from(cwd: Path, env) -> list[str]:
    """Jobs in the queue that were submitted from ``cwd`` (other tests run side by side)."""
    out = subprocess.run(["squeue", "-h", "-o", "%i|%Z"], env=env, capture_output=True, text=True, check=True)
    return [ln.split("|")[0] for ln in out.stdout.splitlines() if ln.endswith(f"|{cwd}")]


def squeue(env) -> list[str]:
    out = subprocess.run(["squeue", "-h", "-o", "%i"], env=env, capture_output=True, text=True, check=True)
    return out.stdout.split()


def test_single_run_without_m_trains_on_two_nodes(slurm_env, runs_dir, tmp_path):
    """No -m: one job is submitted (a 1-point sweep) and trains across 2 nodes."""
    proc = run_app(
        [
            "+experiment=mpt_tiny",
            "hydra/launcher=slurm",
            "resources.nodes=2",
            "hydra.launcher.wait=true",
            "hydra.launcher.poll_s=1",
        ],
        slurm_env,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, explain(proc)
    assert "submitted Slurm job" in proc.stdout
    [r] = results_of(runs_dir)
    assert r["status"] == "completed", r["error"]
    assert (r["nodes"], r["tasks_per_node"], r["world_size"]) == (2, 2, 4)
    assert r["batches_done"] == 40 and r["train_loss"] < r["train_loss_first"] - 1.0
    assert len(r["slurm_job_ids"]) == 1 and r["restarts"] == 0
    run_dir = Path(r["run_dir"])
    # one log per rank, written by srun; the script that was submitted is kept
    assert sorted(p.name for p in (run_dir / "logs").glob("rank*.log")) == [f"rank{i}.log" for i in range(4)]
    script = (run_dir / "sbatch.sh").read_text()
    assert "#SBATCH --nodes=2" in script and "#SBATCH --ntasks-per-node=2" in script
    # ranks 2 and 3 ran on the second node (node rank 1), each node's ranks in their own
    # node-local working dir, outside the shared run dir
    ranks = {p["rank"]: p for p in r["ranks"]}
    assert [ranks[i]["node_rank"] for i in range(4)] == [0, 0, 1, 1]
    assert [ranks[i]["local_rank"] for i in range(4)] == [0, 1, 0, 1]
    assert ranks[0]["node"] == ranks[1]["node"] != ranks[2]["node"] == ranks[3]["node"]
    assert ranks[0]["cwd"] == ranks[1]["cwd"] != ranks[2]["cwd"] == ranks[3]["cwd"]
    assert ranks[2]["cwd"].endswith(f"hpc_llm-{r['slurm_job_ids'][0]}/node1")
    assert not any(p["cwd"].startswith(str(run_dir)) for p in ranks.values())


def test_node_sweep_gives_jobs_of_their_own_size_and_a_ledger(slurm_env, runs_dir, tmp_path):
    proc = run_app([*FAST, "resources.nodes=1,2"], slurm_env, cwd=tmp_path)
    assert proc.returncode == 0, explain(proc)
    rs = results_of(runs_dir)
    assert [(r["nodes"], r["world_size"]) for r in rs] == [(1, 2), (2, 4)]
    assert all(r["status"] == "completed" and r["batches_done"] == 8 for r in rs)
    assert Path(rs[0]["run_dir"]).parent == Path(rs[1]["run_dir"]).parent  # one sweep dir
    ids = [r["slurm_job_ids"][0] for r in rs]
    assert len(set(ids)) == 2
    status = run_cli(["status", "--all"], slurm_env)  # without --all a sweep is one line
    assert status.returncode == 0, explain(status)
    for jid in ids:
        row = next(line for line in status.stdout.splitlines() if f" {jid} " in line)
        assert "COMPLETED" in row
    logs = run_cli(["logs", ids[1], "--rank", "3"], slurm_env)
    assert logs.returncode == 0 and "rank3" in logs.stdout
    # The sweep's report: speedup and efficiency computed from these results.
    sweep_dir = Path(rs[0]["run_dir"]).parent
    rep = run_cli(["report", str(sweep_dir), "--format", "json"], slurm_env)
    assert rep.returncode == 0, explain(rep)
    [group] = json.loads(rep.stdout)
    rows = {r["Nodes"]: r for r in group["rows"]}
    # over every attempt: total_wallclock_s (the report's measure), wallclock_s is the last attempt's
    wall = [r.get("total_wallclock_s") or r["wallclock_s"] for r in rs]
    speedup = wall[0] / wall[1]
    assert rows[2]["Speedup"] == round(speedup, 2) and rows[2]["Ideal"] == 2.0
    assert rows[2]["Efficiency"] == round(speedup / 2, 3)
    assert rows[1]["Model"] == "MPT-141K" and rows[1]["Tokens/s"] > 0
    assert (sweep_dir / "report.md").is_file() and (sweep_dir / "scaling.png").stat().st_size > 5000


def test_no_wait_submit_then_cancel(slurm_env, runs_dir, tmp_path):
    proc = run_app(
        ["+experiment=mpt_tiny", "hydra/launcher=slurm", "train.max_duration=100000ba"],
        slurm_env,
        cwd=tmp_path,
        timeout=60,
    )
    assert proc.returncode == 0, explain(proc)
    line = next(ln for ln in proc.stdout.splitlines() if "submitted Slurm job" in ln)
    job_id = line.split("submitted Slurm job ")[1].split(",")[0]
    assert job_id in squeue(slurm_env)
    cancel = run_cli(["cancel", job_id], slurm_env)
    assert cancel.returncode == 0, explain(cancel)
    deadline = time.monotonic() + 60
    while job_id in squeue(slurm_env) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert job_id not in squeue(slurm_env)
    status = run_cli(["status"], slurm_env)
    row = next(ln for ln in status.stdout.splitlines() if f" {job_id} " in ln)
    assert "CANCELLED" in row


BAD = [
    (["resources.nodes=4"], "resources.nodes=4 is more than partition 'low' has (3 nodes)"),
    (["hydra.launcher.partition=gpu"], "partition 'gpu' does not exist on this cluster; allowed: high, low"),
    (["resources.time=tomorrow"], "resources.time='tomorrow' is not a Slurm time limit"),
    (
        ["resources.tasks_per_node=8", "resources.cpus_per_task=3"],
        "= 24 CPUs per node, but nodes of partition 'low' have 16",
    ),
    (["resources.nodes=1,4"], "resources.nodes=4 is more than partition"),  # one bad point stops the sweep
]


@pytest.mark.parametrize("dry_run", [False, True], ids=["submit", "dry_run"])
@pytest.mark.parametrize("overrides,message", BAD, ids=[" ".join(b[0]) for b in BAD])
def test_bad_slurm_input_submits_nothing(overrides, message, dry_run, slurm_env, runs_dir, tmp_path):
    """A dry run checks everything a submit checks (the partition, sbatch --test-only), so
    "check everything, submit nothing" is hydra.launcher.dry_run=true."""
    dry = [f"hydra.launcher.dry_run={str(dry_run).lower()}"]
    proc = run_app(
        ["+experiment=mpt_tiny", "hydra/launcher=slurm", *overrides, *dry], slurm_env, cwd=tmp_path, timeout=60
    )
    assert proc.returncode == 2, explain(proc)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], explain(proc)
    assert not runs_dir.exists()
    assert jobs_from(tmp_path, slurm_env) == []  # nothing was submitted from here


def test_no_slurm_reachable_says_how_to_start_one(app_env, runs_dir, tmp_path):
    env = dict(app_env, SLURM_CONF=str(tmp_path / "nowhere" / "slurm.conf"))
    proc = run_app(["+experiment=mpt_tiny", "hydra/launcher=slurm"], env, cwd=tmp_path, timeout=60)
    assert proc.returncode == 2, explain(proc)
    [line] = proc.stderr.strip().splitlines()
    assert "no Slurm reachable" in line and "hpc-llm dev-cluster up" in line
    assert not runs_dir.exists()


def test_a_dry_run_without_slurm_writes_the_scripts_and_says_what_it_could_not_check(app_env, runs_dir, tmp_path):
    env = dict(app_env, SLURM_CONF=str(tmp_path / "nowhere" / "slurm.conf"))
    args = ["+experiment=mpt_tiny", "hydra/launcher=slurm", "hydra.launcher.dry_run=true", "resources.nodes=1,2"]
    proc = run_app(args, env, cwd=tmp_path, timeout=60)
    assert proc.returncode == 0, explain(proc)
    warned = [ln for ln in proc.stderr.splitlines() if "no Slurm reachable" in ln]
    assert len(warned) == 1 and "the partition and sbatch --test-only were not checked" in warned[0], explain(proc)
    assert len(list(runs_dir.rglob("sbatch.sh"))) == 2


def test_a_dry_run_with_slurmctld_down_asks_it_once_not_once_a_point(app_env, runs_dir, tmp_path):
    """A slurm.conf whose controller does not answer: each sinfo waits for it (1 s refused here,
    MessageTimeout on a frozen host), so the sweep asks once, not for every point. The real
    sinfo, behind a wrapper on PATH that counts its calls."""
    import shutil

    conf = tmp_path / "etc" / "slurm.conf"
    conf.parent.mkdir()
    conf.write_text(
        "ClusterName=down\nSlurmctldHost=localhost\nSlurmctldPort=9\nMessageTimeout=2\n"
        "NodeName=n1 CPUs=1 State=UNKNOWN\nPartitionName=low Nodes=n1 Default=YES\n"
    )
    shim = tmp_path / "bin"
    shim.mkdir()
    (shim / "sinfo").write_text(f'#!/bin/sh\necho "$@" >> {tmp_path}/sinfo.calls\nexec {shutil.which("sinfo")} "$@"\n')
    (shim / "sinfo").chmod(0o755)
    env = dict(app_env, SLURM_CONF=str(conf), PATH=f"{shim}:{app_env['PATH']}")
    args = ["+experiment=mpt_tiny", "hydra/launcher=slurm", "hydra.launcher.dry_run=true", "resources.nodes=1,2,4"]
    proc = run_app(args, env, cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, explain(proc)
    assert len([ln for ln in proc.stderr.splitlines() if "no Slurm reachable" in ln]) == 1, explain(proc)
    assert len(list(runs_dir.rglob("sbatch.sh"))) == 3
    assert len((tmp_path / "sinfo.calls").read_text().splitlines()) == 1


def test_dev_cluster_up_is_idempotent(dev_cluster, tmp_path):
    """On a cluster of its own (the session's is shared with tests that kill its nodes):
    a second ``up`` changes nothing; after a node's death it starts that slurmd alone."""
    from hpc_llm.devcluster import cluster as devcluster
    from tests.conftest import _free_port_block

    # slurmctld + one slurmd per node, and with accounting MariaDB + slurmdbd
    assert len(devcluster.running(dev_cluster)) == 1 + dev_cluster.nodes + (2 if dev_cluster.accounting else 0)
    own = devcluster.up(root=tmp_path / "own", nodes=2, ctld_port=_free_port_block(8), accounting=False)
    try:
        pids = devcluster.running(own)
        assert sorted(pids) == ["slurmctld", "slurmd -N n1", "slurmd -N n2"]
        again = devcluster.up(root=own.root, nodes=2, ctld_port=own.ctld_port, accounting=False)
        assert again == own and devcluster.running(own) == pids
        devcluster.kill_node(own, "n2")
        devcluster.up(root=own.root, nodes=2, ctld_port=own.ctld_port, accounting=False)
        now = devcluster.running(own)
        assert {k: now[k] for k in ("slurmctld", "slurmd -N n1")} == {k: pids[k] for k in ("slurmctld", "slurmd -N n1")}
        assert now["slurmd -N n2"] != pids["slurmd -N n2"]
    finally:
        devcluster.down(own.root)
    assert not devcluster.running(own)
    assert dev_cluster.env()["SLURM_CONF"] == str(dev_cluster.conf) and dev_cluster.conf.is_file()


def test_a_job_larger_than_the_nodes_up_now_is_queued_not_refused(app_env, runs_dir, tmp_path):
    """On a cluster of its own, one of its 2 nodes drained: ``sbatch --test-only`` refuses a
    2-node job ("Requested node configuration is not available": it counts only the nodes up)
    while a real sbatch queues it. The pre-submit check submits it with one warning line (a CI
    run refused another test's job while a test had killed a node of the shared cluster); a job
    larger than the partition is still refused before anything exists."""
    from hpc_llm.devcluster import cluster as devcluster
    from tests.conftest import _free_port_block

    own = devcluster.up(root=tmp_path / "own", nodes=2, ctld_port=_free_port_block(8), accounting=False)
    try:
        env = dict(app_env, **own.env())
        subprocess.run(["scontrol", "update", "NodeName=n2", "State=DRAIN", "Reason=test"], env=env, check=True)
        asked = subprocess.run(["sbatch", "--test-only", "-N2", "--wrap=true"], env=env, capture_output=True, text=True)
        assert "Requested node configuration is not available" in asked.stderr, asked.stderr
        args = ["+experiment=mpt_tiny", "hydra/launcher=slurm", "resources.nodes=2"]
        proc = run_app(args, env, cwd=tmp_path, timeout=120)
        assert proc.returncode == 0, explain(proc)
        warned = [ln for ln in proc.stderr.splitlines() if "hpc_llm: warning:" in ln and "--nodes=2" in ln]
        assert len(warned) == 1 and "wait in the queue" in warned[0], explain(proc)
        [job] = squeue(env)
        state = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T %r"], env=env, capture_output=True, text=True)
        assert state.stdout.startswith("PENDING"), state.stdout
        subprocess.run(["scancel", job], env=env, check=True)
        too_big = run_app(["+experiment=mpt_tiny", "hydra/launcher=slurm", "resources.nodes=4"], env, cwd=tmp_path)
        assert too_big.returncode == 2 and "more than partition" in too_big.stderr, explain(too_big)
    finally:
        devcluster.down(own.root)
