"""Preflight health checks and the throughput watchdog.

The all-reduce runs for real over gloo between ranks on the dev cluster's
nodes; the slowdown the watchdog must catch is real too (a rank process is
stopped with SIGSTOP for a few seconds, as a straggler would stall).
"""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from pathlib import Path

import pytest

from hpc_llm.job.rank.watchdog import ThroughputWatch
from hpc_llm.results import preflight
from tests.conftest import explain, results_of, run_app, run_cli, with_site
from tests.jobs import paced


def test_busbw_is_algbw_times_two_n_minus_one_over_n():
    # 1 GiB in 10 ms: algbw 107.37 GB/s; 8 ranks -> x 1.75; 2 ranks -> x 1; 1 rank -> no traffic
    size, t = 1 << 30, 0.010
    assert preflight.algbw_gbps(size, t) == pytest.approx(107.374, rel=1e-4)
    assert preflight.busbw_gbps(size, t, 8) == pytest.approx(107.374 * 14 / 8, rel=1e-4)
    assert preflight.busbw_gbps(size, t, 2) == pytest.approx(107.374, rel=1e-4)
    assert preflight.busbw_gbps(size, t, 1) == 0.0
    r = preflight.row(64, 0.000010, 4)
    assert (r["count"], r["time_us"], r["algbw_gbps"], r["busbw_gbps"]) == (16, 10.0, 0.006, 0.01)


def test_message_sizes_are_powers_of_two_from_8_bytes():
    assert preflight.message_sizes(64) == [8, 16, 32, 64]
    assert len(preflight.message_sizes(256 << 20)) == 26
    for bad in (4, 100):
        with pytest.raises(ValueError, match="must be a power of two >= 8"):
            preflight.message_sizes(bad)


def test_table_has_nccl_tests_columns_and_the_peak():
    rows = [preflight.row(s, 1e-4 * (1 + i), 8) for i, s in enumerate((8, 16, 32))]
    text = preflight.format_table(rows, 8, 2)
    header = text.splitlines()[1]
    assert header.split()[1:] == ["size", "count", "type", "redop", "time", "algbw", "busbw"]
    peak = max(r["busbw_gbps"] for r in rows)
    assert f"# peak busbw: {peak:.2f} GB/s" in text and "8 ranks on 2 node(s)" in text


def test_watch_fires_once_per_slowdown_and_keeps_slow_batches_out_of_the_median():
    w = ThroughputWatch(window=5, fraction=0.5, patience=3)
    events = [w.observe(v) for v in [100, 98, 102, 101, 99] + [100] * 5]
    assert events == [None] * 10
    slow = [w.observe(v) for v in (40, 30, 45, 20, 10)]  # five slow batches: one event at the third
    assert [e is not None for e in slow] == [False, False, True, False, False]
    assert slow[2]["median"] == 100 and slow[2]["ratio"] == pytest.approx(0.45)
    assert w.observe(100) is None and w.low_run == 0  # recovered
    again = [w.observe(v) for v in (10, 10, 10)]
    assert again[2] is not None and again[2]["median"] == 100  # the median never absorbed the slow batches
    # a dip shorter than the patience is no event
    w2 = ThroughputWatch(window=3, fraction=0.5, patience=3)
    assert [w2.observe(v) for v in (10, 10, 10, 1, 1, 10, 1, 1, 10)] == [None] * 9


#: how long the rank is frozen
STALL_S = 20


@pytest.mark.train
def test_watchdog_warns_about_an_injected_stall(app_env, runs_dir, test_site, tmp_path):
    """The rank is frozen for STALL_S mid-run (SIGSTOP/SIGCONT), as a stalled node would be."""
    stalled: dict[str, float] = {}

    def stall() -> None:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            log = next(runs_dir.rglob("rank0.log"), None)
            if log and re.search(r"\[batch=1[5-9]/", log.read_text(errors="replace")):
                break
            time.sleep(0.2)
        ranks = {}
        for proc_dir in Path("/proc").iterdir():  # the rank processes of this run, by their command line
            try:
                cmd = (proc_dir / "cmdline").read_bytes().split(b"\0")
                if b"hpc_llm.job.rank.entry" not in cmd or not any(str(runs_dir).encode() in c for c in cmd):
                    continue
                env = (proc_dir / "environ").read_bytes().split(b"\0")
            except OSError:
                continue
            pid = proc_dir.name
            rank = next((e.split(b"=", 1)[1] for e in env if e.startswith(b"SLURM_PROCID=")), None)
            if rank is not None:
                ranks[rank.decode()] = int(pid)
        os.kill(ranks["0"], signal.SIGSTOP)
        stalled["at"] = time.time()
        time.sleep(STALL_S)
        os.kill(ranks["0"], signal.SIGCONT)

    t = threading.Thread(target=stall, daemon=True)
    t.start()
    proc = run_app(
        [
            "+experiment=mpt_tiny",
            "train.max_duration=40ba",
            "eval=none",
            "watchdog.enabled=true",
            "resources.tasks_per_node=1",
            "watchdog.window=5",
            "watchdog.patience=1",
            # a 20 s stall is ~5% of the median even with the ~1 s batches of a busy machine (seen
            # here with both workers training), far below what load alone does
            "watchdog.fraction=0.2",
            "train.console_log_interval=1ba",
            # batches 15-40 last at least 10 s on any machine: the stall lands mid-run. And a batch
            # held to 0.4 s must take 2 s to fall below 0.2 of the median: at 0.1 s, a busy CI
            # machine once slowed batch 15 that far on its own; the stall at batch 16 then only
            # continued that slowdown (one event per slowdown) and no event came after the stall.
            *paced(0.4),
        ],
        with_site(app_env, test_site),
        cwd=tmp_path,
    )
    t.join(timeout=STALL_S + 10)
    assert proc.returncode == 0, explain(proc)
    assert "at" in stalled, "the stall was never injected"
    [r] = results_of(runs_dir)
    assert r["status"] == "completed" and r["batches_done"] == 40
    # the stall is the first event after the SIGSTOP: the batch the rank was frozen in,
    # far below the median, reported when the rank is let go. A busy CI machine may add
    # slow batches of its own anywhere in the run, even a few seconds after the stall
    # (CI once saw one at batch 29, 13 tiny batches later), so only the first is the stall.
    events = r["watchdog_events"]
    after = [e for e in events if e["time"] >= stalled["at"]]
    assert after and len(events) <= 5, events
    event = after[0]
    assert event["ratio"] < 0.2 and event["time"] >= stalled["at"] + STALL_S - 0.5, events
    assert event["action"] == "warn" and event["nodes"] and 15 <= event["batch"] <= 40
    log = (Path(r["run_dir"]) / "logs" / "rank0.log").read_text()
    assert "hpc_llm watchdog:" in log and "of the running median" in log


@pytest.mark.slurm
def test_preflight_prints_a_busbw_table_from_two_dev_cluster_nodes(slurm_env, tmp_path):
    proc = run_cli(
        [
            "preflight",
            "hydra/launcher=slurm",
            "resources.nodes=2",
            "preflight.max_bytes=65536",
            "hydra.launcher.poll_s=1",
        ],
        dict(slurm_env, HPC_LLM_RUNS=str(tmp_path / "runs")),
        timeout=600,
    )
    assert proc.returncode == 0, explain(proc)
    lines = proc.stdout.splitlines()
    header = next(ln for ln in lines if ln.startswith("#") and ln.split()[-1] == "busbw")
    assert header.split()[-2:] == ["algbw", "busbw"]
    rows = [ln.split() for ln in lines if re.match(r"^\s+\d+\s+\d+\s+float\s+sum", ln)]
    assert [int(r[0]) for r in rows] == [8 << i for i in range(14)]
    assert all(float(r[-1]) >= 0 for r in rows) and float(rows[-1][-1]) > 0
    assert "4 ranks on 2 node(s)" in proc.stdout and "# preflight passed" in proc.stdout
    [results] = (tmp_path / "runs").rglob("results.json")
    assert '"batches_done": 0' in results.read_text()  # checks only: nothing trained


@pytest.mark.slurm
def test_an_impossible_threshold_stops_training_before_the_first_batch(slurm_env, runs_dir, tmp_path):
    proc = run_app(
        [
            "+experiment=mpt_tiny",
            "hydra/launcher=slurm",
            "resources.nodes=2",
            "preflight.enabled=true",
            "preflight.max_bytes=4096",
            "preflight.min_busbw_gbps=1e6",
            "hydra.launcher.wait=true",
            "hydra.launcher.poll_s=1",
        ],
        slurm_env,
        cwd=tmp_path,
    )
    assert proc.returncode == 1, explain(proc)
    [r] = results_of(runs_dir)
    assert r["status"] == "failed" and r["batches_done"] == 0
    assert r["error"].startswith("preflight check 'allreduce' failed: all-reduce peak busbw")
    assert "< preflight.min_busbw_gbps=1e+06" in r["error"]
    pf = r["preflight"]
    assert pf["passed"] is False and pf["failed_check"] == "allreduce" and len(pf["nodes"]) == 2
    assert len(pf["checks"]["allreduce"]["rows"]) == 10  # the figures are kept
    # each node alone is below the bar too: both named, so nothing is worth excluding
    assert sorted(pf["bad_nodes"]) == sorted(pf["nodes"])
    run_dir = Path(r["run_dir"])
    assert not (run_dir / "checkpoints").exists()
    assert "train/loss" not in (run_dir / "logs" / "rank0.log").read_text()


def test_bad_preflight_watchdog_and_straggler_input(app_env, runs_dir, tmp_path):
    cases = [
        (["preflight.enabled=true", "preflight.max_bytes=1000"], "preflight.max_bytes=1000: must be a power of two"),
        (["preflight.enabled=true", "preflight.checks=[allreduce,nvlink]"], "unknown health check 'nvlink'"),
        (["preflight.enabled=true", "preflight.min_tflops=500"], "preflight.min_tflops is set but cluster.device=cpu"),
        (["watchdog.action=reboot"], "watchdog.action='reboot'; allowed: warn, requeue"),
        (["watchdog.enabled=true", "watchdog.action=requeue", "fault.enabled=false"], "needs fault.enabled"),
        (["straggler.action=cordon"], "straggler.action='cordon'; allowed: warn, swap, exclude"),
        (["straggler.factor=0.5"], "straggler.factor=0.5: must be above 1"),
        (["straggler.action=swap", "fault.enabled=false"], "straggler.action=swap is carried out by the job's"),
    ]
    for overrides, message in cases:
        proc = run_app(["+experiment=mpt_tiny", *overrides], app_env, cwd=tmp_path, timeout=120)
        assert proc.returncode == 2, explain(proc)
        [line] = proc.stderr.strip().splitlines()
        assert message in line, line
    assert not runs_dir.exists()


def test_preflight_alone_skips_the_checks_only_training_needs(app_env):
    """The README's `hpc-llm preflight hydra/launcher=slurm cluster=h100 resources.nodes=2` was
    refused for a global batch of 8 over 16 ranks; preflight.only stops before training."""
    args = ["hydra/launcher=slurm", "cluster=h100", "resources.nodes=2"]
    trains = run_cli(["config", *args], app_env)
    assert trains.returncode == 2 and "is not divisible by the world size 16" in trains.stderr, explain(trains)
    checks = run_cli(["config", *args, "preflight.enabled=true", "preflight.only=true"], app_env)
    assert checks.returncode == 0, explain(checks)
