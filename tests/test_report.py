"""Sweep reports from results.json files, and the time/cost estimator."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

import pytest

from hpc_llm.config.flops import model_flops_per_token
from hpc_llm.errors import ConfigError
from hpc_llm.results import report
from hpc_llm.results.estimate import DEFAULT_EFFICIENCY, estimate
from tests.conftest import ROOT, explain, run_cli

GOLDEN = ROOT / "tests" / "golden" / "report.md"


def write_run(sweep: Path, num: int, **fields) -> Path:
    d = sweep / str(num)
    d.mkdir(parents=True)
    base = {
        "experiment": "mpt7b_dolly",
        "status": "completed",
        "model": "MPT-6.7B",
        "data": "mosaicml/dolly_hhrlhf",
        "max_duration": "2ep",
        "eval_interval": "1ep",
        "tasks_per_node": 8,
        "mfu": 0.41,
        "restarts": 0,
        "peak_memory_bytes": 24.9e9,
        "checkpoint_bytes": 80 * (1 << 30),
        "conversion_ok": True,
        "inference_ok": True,
        "eval": {"loss": 0.5, "token_accuracy": 0.85},
    }
    base.update(fields)
    base.setdefault("world_size", base["nodes"] * 8)
    (d / "results.json").write_text(json.dumps(base))
    return d


@pytest.fixture
def sweep(tmp_path: Path) -> Path:
    s = tmp_path / "sweep"
    # the seeds' Table 2 wall-clock times for 1, 2, 4 nodes, and a run that failed at 8
    write_run(s, 0, nodes=1, wallclock_s=4708.121, tokens_per_sec=7124)
    # preempted once: its last attempt took 1000 s, the whole run (queue wait included) 1764.485 s
    write_run(
        s,
        1,
        nodes=2,
        wallclock_s=1000.0,
        total_wallclock_s=1764.485,
        tokens_per_sec=13844,
        restarts=1,
        restarts_by_cause={"preemption": 1},
        goodput=0.912,
    )
    write_run(s, 2, nodes=4, wallclock_s=1101.026, tokens_per_sec=28959)
    write_run(s, 3, nodes=8, status="failed", error="NCCL timeout", wallclock_s=None, tokens_per_sec=None)
    running = s / "4" / ".hydra"  # submitted, no results yet
    running.mkdir(parents=True)
    (running / "config.yaml").write_text("experiment: mpt7b_dolly\nresources:\n  nodes: 16\n")
    return s


def test_speedup_and_efficiency_arithmetic(sweep):
    [g] = report.build(sweep)
    rows = {r["Nodes"]: r for r in g.rows}
    assert g.baseline_nodes == 1
    # from the whole run's wall clock, not its last attempt's (which would say 4.71)
    assert rows[2]["Speedup"] == round(4708.121 / 1764.485, 2) == 2.67  # as in the seeds' Table 2
    assert rows[2]["Restarts"] == "1 (preemption 1)" and rows[2]["Goodput"] == 0.912
    assert rows[4]["Speedup"] == round(4708.121 / 1101.026, 2) == 4.28
    assert rows[4]["Ideal"] == 4.0
    assert rows[4]["Efficiency"] == round((4708.121 / 1101.026) / 4, 3)
    assert rows[8]["Status"].startswith("failed") and rows[8]["Speedup"] is None  # shown, not dropped
    assert rows[16]["Status"] == "running"
    assert rows[1]["Wallclock"] == "1h18m28.121s"
    [g2] = report.build(sweep, baseline_nodes=2)
    assert {r["Nodes"]: r["Speedup"] for r in g2.rows}[4] == round(1764.485 / 1101.026, 2)


def test_golden_markdown_and_files(sweep):
    groups, paths = report.write_report(sweep)
    md = paths["md"].read_text()
    if not GOLDEN.exists():
        GOLDEN.write_text(md)
        pytest.fail(f"wrote missing golden file {GOLDEN}; check it and commit it")
    assert md == GOLDEN.read_text(), f"report changed; delete {GOLDEN} to regenerate"
    png = paths["png"].read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
    # report.csv keeps every column of every run, the ones the Markdown leaves out included
    header, *rows = list(csv.reader(io.StringIO(paths["csv"].read_text())))
    assert header == ["Experiment", *report.COLUMNS] and len(rows) == 5
    assert all(set(row) == set(report.COLUMNS) for row in groups[0].rows)
    by_run = {row[header.index("Run")]: dict(zip(header, row, strict=True)) for row in rows}
    assert by_run["1"]["Code"] == "-" and by_run["1"]["Restarts"] == "1 (preemption 1)"
    assert by_run["1"]["Wallclock (s)"] == "1764.5" and by_run["3"]["Status"] == "failed (NCCL timeout)"


def markdown_tables(md: str) -> list[tuple[str, list[str], list[list[str]]]]:
    """(the heading above it, header cells, body rows' cells) of every table in ``md``."""
    tables: list[tuple[str, list[str], list[list[str]]]] = []
    heading, rows = "", []
    for line in [*md.splitlines(), ""]:
        if line.startswith("|"):
            rows.append([c.strip() for c in line.strip().strip("|").split("|")])
            continue
        if rows:
            tables.append((heading, rows[0], rows[2:]))
            rows = []
        if line.startswith("#"):
            heading = line
    return tables


def test_the_first_table_is_the_scaling_table_and_accounting_has_its_own(sweep):
    md = report.to_markdown(report.build(sweep))
    (head1, main, body), (head2, details, body2) = markdown_tables(md)
    assert head1 == "### mpt7b_dolly (speedup vs 1 node(s))" and len(main) <= 10
    assert main[:2] == ["Nodes", "GPUs / ranks"] and main[-1] == "Status"
    assert {"Wallclock", "Speedup", "Ideal", "Efficiency", "Tokens/s", "MFU", "Eval loss"} <= set(main)
    assert [r[0] for r in body] == ["1", "2", "4", "8", "16"] and all(len(r) == len(main) for r in body)
    assert body[2][main.index("Tokens/s")] == "28,959" and body[2][main.index("Speedup")] == "4.28x"
    # accounting and provenance: under their own heading, one row per run, never in the first table
    accounting = {"Restarts", "Goodput", "Resource-hours", "Queue wait", "Attempts (Slurm)", "Code", "Run"}
    assert head2.startswith("#### mpt7b_dolly") and "accounting" in head2
    assert accounting <= set(details) and not accounting & set(main) and len(body2) == 5
    # what every run trained is said once, under the heading, not in a column of its own
    assert "Model MPT-6.7B; data mosaicml/dolly_hhrlhf; max duration 2ep; eval interval 1ep." in md
    assert not set(report.DESCRIBE) & (set(main) | set(details))
    # and every column is in one of the three places (report.csv has them all besides)
    assert set(report.COLUMNS) == set(report.DESCRIBE) | set(main) | set(details) | {"Wallclock (s)"}


def test_an_lr_sweep_shows_its_point_in_the_scaling_table(tmp_path):
    s = tmp_path / "lr"
    for i, lr in enumerate(("1e-4", "3e-4")):
        d = write_run(s, i, nodes=1, wallclock_s=100.0 + i, tokens_per_sec=1000)
        (d / ".hydra").mkdir()
        (d / ".hydra" / "overrides.yaml").write_text(f"- +experiment=mpt7b_dolly\n- train.optimizer.lr={lr}\n")
    [g] = report.build(s)
    [(_, main, body), _] = markdown_tables(report.to_markdown([g]))
    assert [r[main.index("Point")] for r in body] == ["train.optimizer.lr=1e-4", "train.optimizer.lr=3e-4"]
    assert len(main) <= 11
    # a node-count sweep's point is its node count, already the first column
    nodes = tmp_path / "nodes"
    for i, n in enumerate((1, 2)):
        d = write_run(nodes, i, nodes=n, wallclock_s=100.0 / n, tokens_per_sec=1000 * n)
        (d / ".hydra").mkdir()
        (d / ".hydra" / "overrides.yaml").write_text(f"- +experiment=mpt7b_dolly\n- resources.nodes={n}\n")
    [(_, main, _), _] = markdown_tables(report.to_markdown(report.build(nodes)))
    assert main == report.MAIN


def axes_by_title(fig) -> dict[str, Any]:
    return {ax.get_title(): ax for ax in fig.axes}


def line(ax, label: str) -> tuple[list[float], list[float]]:
    [found] = [ln for ln in ax.get_lines() if ln.get_label() == label]
    return [float(x) for x in found.get_xdata()], [float(y) for y in found.get_ydata()]


def test_scaling_figure_has_node_ticks_on_log2_the_ideal_and_axes_from_zero(sweep):
    from hpc_llm.results import plot

    axes = axes_by_title(plot.figure(report.build(sweep)))
    assert set(axes) == {"Speedup", "Throughput", "MFU"}
    for title, ax in axes.items():
        assert ax.get_xscale() == "log" and ax.xaxis.get_transform().base == 2, title
        # the completed runs' node counts, as integers, and nothing between them
        assert list(ax.get_xticks()) == [1, 2, 4], title
        assert [t.get_text() for t in ax.get_xticklabels()] == ["1", "2", "4"], title
        assert len(ax.xaxis.get_minorticklocs()) == 0, title
        assert ax.get_ylim()[0] == 0, title
    xs, ys = line(axes["Throughput"], "mpt7b_dolly")
    assert (xs, ys) == ([1, 2, 4], [7124, 13844, 28959])
    xs, ideal = line(axes["Throughput"], "ideal")  # linear from the smallest node count
    assert (xs[0], xs[-1]) == (1, 4) and ideal[0] == 7124 and ideal[-1] == pytest.approx(4 * 7124)
    assert ideal[len(ideal) // 2] == pytest.approx(7124 * xs[len(xs) // 2])
    _, ideal = line(axes["Speedup"], "ideal")
    assert (ideal[0], ideal[-1]) == (1.0, pytest.approx(4.0))
    _, ideal = line(axes["MFU"], "ideal")  # perfect scaling keeps the MFU
    assert set(ideal) == {0.41}
    assert axes["Throughput"].get_ylim()[1] >= 28959 and axes["MFU"].get_ylim()[1] >= 0.41


def test_a_small_throughput_difference_is_drawn_small(tmp_path):
    """Two CPU runs 0.7% apart: the axis starts at zero (not at 9,220) and the ticks are 1 and 2."""
    from hpc_llm.results import plot

    s = tmp_path / "cpu"
    write_run(s, 0, nodes=1, wallclock_s=53.7, tokens_per_sec=9285, mfu=None, world_size=1)
    write_run(s, 1, nodes=2, wallclock_s=57.4, tokens_per_sec=9220, mfu=None, world_size=2)
    axes = axes_by_title(plot.figure(report.build(s)))
    low, high = axes["Throughput"].get_ylim()
    assert low == 0 and (9285 - 9220) / (high - low) < 0.01
    assert list(axes["Throughput"].get_xticks()) == [1, 2]
    assert not line_labels(axes["MFU"]) and axes["MFU"].get_ylim()[0] == 0  # no MFU on CPU: an empty panel


def line_labels(ax) -> list[str]:
    return [str(ln.get_label()) for ln in ax.get_lines()]


def test_mixed_experiments_are_grouped(tmp_path):
    s = tmp_path / "mixed"
    write_run(s, 0, nodes=1, wallclock_s=100.0, tokens_per_sec=1)
    write_run(s, 1, nodes=2, wallclock_s=60.0, tokens_per_sec=2, experiment="mpt_tiny")
    groups = report.build(s)
    assert [g.experiment for g in groups] == ["mpt7b_dolly", "mpt_tiny"]
    assert report.to_markdown(groups).startswith("Note: this directory holds 2 experiments")


def test_bad_report_input(tmp_path, sweep, app_env):
    empty = tmp_path / "empty"
    empty.mkdir()
    proc = run_cli(["report", str(empty)], app_env)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "no runs under" in proc.stderr
    with pytest.raises(ConfigError, match="--baseline-nodes=3 is not in this sweep"):
        report.build(sweep, baseline_nodes=3)
    proc = run_cli(["report", str(sweep), "--format", "csv"], app_env)
    assert proc.returncode == 0, explain(proc)
    assert proc.stdout.startswith("Experiment,")


def test_estimate_arithmetic_by_hand():
    from omegaconf import OmegaConf

    from hpc_llm.config.compose import compose

    train = OmegaConf.to_container(compose(["model=mpt-70b", "cluster=h100"]).train, resolve=True)
    e8 = estimate(train, nodes=8, gpus_per_node=8, peak_flops_per_gpu=989e12, from_experiment=False)
    n, fpt = 64862437376, 6 * 64862437376 + 12 * 80 * 8192 * 2048
    assert (e8.n_params, e8.flops_per_token) == (n, fpt)
    assert e8.tokens.value == 20 * n
    assert e8.mfu.value == 0.426 and e8.efficiency.value == DEFAULT_EFFICIENCY
    seconds = 20 * n * fpt / (64 * 989e12 * 0.426 * 0.9)
    assert e8.seconds == pytest.approx(seconds)
    assert e8.gpu_hours == pytest.approx(seconds * 64 / 3600)
    e64 = estimate(train, nodes=64, gpus_per_node=8, peak_flops_per_gpu=989e12, from_experiment=False)
    assert e8.seconds / e64.seconds == pytest.approx(8.0)  # same efficiency: 8x the nodes, 1/8 the time
    assert 200 < e8.seconds / 86400 < 300 and 25 < e64.seconds / 86400 < 40
    measured = estimate(
        train,
        nodes=8,
        gpus_per_node=8,
        peak_flops_per_gpu=989e12,
        mfu=0.5,
        efficiency=0.8,
        tokens=1e12,
        from_experiment=False,
    )
    assert measured.seconds == pytest.approx(1e12 * fpt / (64 * 989e12 * 0.5 * 0.8))


def test_estimate_cli_answers_the_70b_question(app_env):
    proc = run_cli(["estimate", "model=mpt-70b", "cluster=h100", "--nodes", "8", "64"], app_env)
    assert proc.returncode == 0, explain(proc)
    assert "64,862,437,376 parameters" in proc.stdout
    assert "| 8 | 64 |" in proc.stdout and "| 64 | 512 |" in proc.stdout
    assert "Chinchilla" in proc.stdout and "LLM Foundry H100 bf16 benchmark, 70b" in proc.stdout
    bad = run_cli(["estimate", "model=mpt-70b"], app_env)  # the local CPU profile has no peak FLOP/s
    assert bad.returncode == 2 and "resources.gpus_per_node is 0" in bad.stderr


def test_estimate_uses_a_measured_sweep(sweep):
    from omegaconf import OmegaConf

    from hpc_llm.config.compose import compose

    train = OmegaConf.to_container(compose(["model=mpt-7b"]).train, resolve=True)
    e = estimate(train, nodes=4, gpus_per_node=8, peak_flops_per_gpu=989e12, sweep=sweep, from_experiment=False)
    assert e.efficiency.value == round((4708.121 / 1101.026) / 4, 3)
    assert "measured at 4 node(s)" in e.efficiency.source
    assert model_flops_per_token({**train, "max_seq_len": 2048})[0] == e.n_params


PRETRAINING = [
    "mpt125m_c4",
    "mpt350m_c4",
    "mpt760m_c4",
    "mpt1b_c4",
    "mpt3b_c4",
    "mpt7b_c4",
    "mpt13b_c4",
    "mpt30b_c4",
    "mpt70b_c4",
]


@pytest.mark.parametrize("experiment", PRETRAINING)
def test_pretraining_checkpoints_are_periodic_and_kept_few_from_the_estimated_save_cost(experiment):
    """Not 1ep (never, within an epoch of C4) and not keep-all (a 70B run fills the disk)."""
    from omegaconf import OmegaConf

    from hpc_llm.config.compose import compose
    from hpc_llm.results.estimate import checkpoint_plan

    cfg = compose([f"+experiment={experiment}"])
    train = OmegaConf.to_container(cfg.train, resolve=True)
    e = estimate(train, nodes=8, gpus_per_node=8, peak_flops_per_gpu=cfg.cluster.peak_flops_per_gpu)
    plan = checkpoint_plan(e, train["global_train_batch_size"] * train["max_seq_len"])
    interval = int(str(cfg.checkpoint.interval).removesuffix("ba"))
    assert str(cfg.checkpoint.interval).endswith("ba")
    assert interval == pytest.approx(plan.interval_batches, rel=0.05)
    assert cfg.checkpoint.keep == plan.keep == 3


def test_young_interval_arithmetic():
    from hpc_llm.results.estimate import CHECKPOINT_BYTES_PER_PARAM, NODE_MTBF_DAYS, checkpoint_plan

    train = {
        "model": {
            "name": "mpt_causal_lm",
            "d_model": 8192,
            "n_heads": 64,
            "n_layers": 80,
            "expansion_ratio": 4,
            "max_seq_len": 2048,
            "vocab_size": 50368,
        },
        "max_seq_len": 2048,
        "global_train_batch_size": 1024,
    }
    e = estimate(train, nodes=8, gpus_per_node=8, peak_flops_per_gpu=989e12)
    plan = checkpoint_plan(e, 1024 * 2048)
    assert plan.bytes == e.n_params * CHECKPOINT_BYTES_PER_PARAM
    assert plan.save_s == pytest.approx(plan.bytes / (8 * 2e9))
    assert plan.mtbf_s == pytest.approx(NODE_MTBF_DAYS * 86400 / 8)
    assert plan.interval_s == pytest.approx((2 * plan.save_s * plan.mtbf_s) ** 0.5)
    # twice the nodes: half the save time and half the MTBF, so half the interval
    twice = checkpoint_plan(estimate(train, nodes=16, gpus_per_node=8, peak_flops_per_gpu=989e12), 1024 * 2048)
    assert twice.interval_s == pytest.approx(plan.interval_s / 2)


def test_code_column_names_the_commit_and_a_dirty_tree(tmp_path):
    s = tmp_path / "sweep"
    write_run(s, 0, nodes=1, wallclock_s=10.0, provenance={"git": {"commit": "0123456789abcdef", "dirty": True}})
    write_run(s, 1, nodes=2, wallclock_s=6.0, provenance={"git": {"commit": "fedcba9876543210", "dirty": False}})
    write_run(s, 2, nodes=4, wallclock_s=4.0)  # written before results carried provenance
    [g] = report.build(s)
    assert [row["Code"] for row in g.rows] == ["01234567+dirty", "fedcba98", "-"]


def test_gpu_hours_and_queue_wait_from_accounting_rows():
    """Two attempts of one job in sacct's own format (-X -D -P, FIELDS; the rows the dev
    cluster gave a 2-node GPU job preempted once): GPU-hours over both, queue waits of each."""
    from hpc_llm.slurm import accounting

    out = (
        "7|7|PREEMPTED|None|2026-11-23T08:00:00|2026-11-23T08:00:30|2026-11-23T08:10:30|600|n[1-2]|0:0|"
        "billing=16,cpu=16,gres/gpu=16,node=2\n"
        "7|7|COMPLETED|BeginTime|2026-11-23T08:10:31|2026-11-23T08:12:31|2026-11-23T08:42:31|1800|n[2-3]|0:0|"
        "billing=16,cpu=16,gres/gpu=16,node=2\n"
    )
    [(job, rows)] = accounting.parse(out).items()
    assert job == "7" and [r.state for r in rows] == ["PREEMPTED", "COMPLETED"]
    assert accounting.resource_hours(rows) == (16 * 2400 / 3600, "GPU-hours")
    assert [r.queue_wait_s for r in rows] == [30.0, 120.0]
    cpu_only = accounting.parse(out.replace("gres/gpu=16,", ""))["7"]
    assert accounting.resource_hours(cpu_only) == (16 * 2400 / 3600, "CPU-hours")
