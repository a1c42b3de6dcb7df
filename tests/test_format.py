"""One formatter each for bytes, durations and tables; user text in rich tables is literal.

An override such as ``container.binds=[/usr,/var/tmp/x]`` kept in the run ledger once made
every ``hpc-llm status`` fail with ``rich.errors.MarkupError`` (rich read it as a closing
tag): the status table now shows it as it is.
"""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest
from rich.console import Console
from rich.errors import MarkupError
from rich.table import Table
from rich.text import Text

from hpc_llm.results import format as fmt
from hpc_llm.results import ledger, report
from hpc_llm.results.status_table import COLUMNS, run_details, runs_table, show
from tests.conftest import explain, run_cli

BINDS = "container.binds=[/usr,/var/tmp/x]"
SETUP = "hydra.launcher.setup=[/usr/bin/true]"
#: more text rich would read as markup (or emoji) if it were not kept literal
TRICKY = ["[bold]not bold[/bold]", "[/]", "ends in a backslash\\", ":thumbs_up:", "[link=x]y"]


def render(renderable: object, width: int = 400) -> str:
    out = io.StringIO()
    Console(file=out, width=width, color_system=None).print(renderable)
    return out.getvalue()


# -- bytes ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (None, "-"),
        (0, "0 B"),
        (1, "1 B"),
        (999, "999 B"),
        (999.6, "1.0 kB"),
        (1000, "1.0 kB"),
        (1500, "1.5 kB"),
        (24.9e9, "24.9 GB"),
        (80 * (1 << 30), "85.9 GB"),  # 80 GiB, in decimal units
        (999.96e9, "1.0 TB"),  # rounds up into the next unit, never "1000.0 GB"
        (2.6e12, "2.6 TB"),
        (1.5e18, "1.5 EB"),
        (1e30, "1,000,000,000,000.0 EB"),  # beyond the largest unit: still that unit
        (-1500, "-1.5 kB"),
        (float("nan"), "-"),
        (float("inf"), "-"),
        ("not a size", "-"),
    ],
)
def test_human_bytes_is_decimal_and_names_its_unit(n, text):
    assert fmt.human_bytes(n) == text


def test_bytes_in_a_column_unit():
    assert fmt.BYTES_UNIT == "GB" and fmt.GB == 1e9
    assert fmt.bytes_in(None) is None and fmt.bytes_in(float("nan")) is None
    assert fmt.bytes_in(0) == 0.0
    assert fmt.bytes_in(24.9e9) == 24.9
    assert fmt.bytes_in(80 * (1 << 30)) == 85.9
    assert fmt.bytes_in(80 * (1 << 30), digits=4) == 85.8993
    assert fmt.bytes_in(1.5e12, unit="TB") == 1.5
    assert fmt.bytes_in(1e30) == 1e21
    assert fmt.bytes_in(1.7 * (1 << 20)) == 0.0018  # a toy checkpoint is not 0.0 GB
    assert fmt.bytes_in(123_456) == 0.00012
    assert fmt.bytes_header("Checkpoint") == "Checkpoint (GB)"
    assert fmt.bytes_header("Peak memory / rank") == "Peak memory / rank (GB)"


def test_every_byte_column_of_the_report_says_its_unit(tmp_path, monkeypatch):
    monkeypatch.setenv("HPC_LLM_HOME", str(tmp_path / "hpc_llm_home"))  # the report reads the ledger
    assert "Checkpoint (GB)" in report.COLUMNS and "Peak memory / rank (GB)" in report.COLUMNS
    assert "Checkpoint" not in report.COLUMNS
    d = tmp_path / "sweep" / "0"
    d.mkdir(parents=True)
    (d / "results.json").write_text(
        '{"experiment": "x", "status": "completed", "nodes": 1, "wallclock_s": 4708.121,'
        ' "peak_memory_bytes": 24.9e9, "checkpoint_bytes": 85899345920}'
    )
    [g] = report.build(tmp_path / "sweep")
    [row] = g.rows
    assert row["Checkpoint (GB)"] == 85.9 and row["Peak memory / rank (GB)"] == 24.9
    assert row["Wallclock"] == "1h18m28.121s"


# -- durations -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("seconds", "decimals", "text"),
    [
        (None, 0, "-"),
        (-1, 0, "-"),
        (float("nan"), 0, "-"),
        (float("inf"), 0, "-"),
        (0, 0, "0m00s"),
        (0, 3, "0m00.000s"),
        (5, 0, "0m05s"),
        (59.4, 0, "0m59s"),
        (59.6, 0, "1m00s"),  # rounded before it is split: never "0m60s"
        (3599.9996, 3, "1h00m00.000s"),
        (1764.485, 3, "29m24.485s"),
        (4708.121, 3, "1h18m28.121s"),
        (3725, 0, "1h02m05s"),
        (12.34, 1, "0m12.3s"),
        (86399.4, 0, "23h59m59s"),
        (86400, 0, "1.0 days"),
        (1.5 * 86400, 3, "1.5 days"),
        (13.9 * 86400, 0, "13.9 days"),
        (14 * 86400, 0, "2.0 weeks (14.0 days)"),
        (24.6 * 86400, 0, "3.5 weeks (24.6 days)"),
        (1e12, 0, "1,653,439.2 weeks (11,574,074.1 days)"),
    ],
)
def test_duration(seconds, decimals, text):
    assert fmt.duration(seconds, decimals=decimals) == text


def test_the_old_duration_formatters_are_gone():
    from hpc_llm.results import console, estimate

    assert not hasattr(report, "hms") and not hasattr(report, "human_bytes")
    assert estimate.duration is fmt.duration and estimate.human_bytes is fmt.human_bytes
    assert not hasattr(console, "_duration")


# -- tables --------------------------------------------------------------------------------------


def test_a_plain_rich_table_breaks_on_such_overrides():
    """What the status table did before: user text as a markup string."""
    for text in (BINDS, SETUP):
        t = Table()
        t.add_column("overrides")
        t.add_row(text)
        with pytest.raises(MarkupError):
            render(t)


@pytest.mark.parametrize("text", [BINDS, SETUP, *TRICKY])
def test_table_cells_titles_and_headers_are_literal(text):
    t = fmt.table(["name", text], [(text, None, 3)], title=text)
    shown = render(t)
    assert shown.count(text) == 3  # title, header, cell
    assert " - " in shown  # None


def test_literal_keeps_text_that_is_styled_on_purpose():
    styled = Text("COLLISION", style="bold red")
    assert fmt.literal(styled) is styled
    assert fmt.literal(None).plain == "-" and fmt.literal(1.5).plain == "1.5"
    assert fmt.literal("[b]x[/b]").plain == "[b]x[/b]"


def test_run_summary_shows_user_text_literally():
    from hpc_llm.results.console import summary

    results = {
        "status": "failed",
        "error": f"bad bind {BINDS}",
        "wallclock_s": 3725,
        "run_dir": "/runs/[/usr/bin/true]/0",
        "eval": {"inference_sample": "[/x] hello"},
    }
    shown = render(summary(results, title="job [/0]"))
    for text in (f"bad bind {BINDS}", "/runs/[/usr/bin/true]/0", "'[/x] hello'", "job [/0]", "1h02m05s"):
        assert text in shown


# -- hpc-llm status over a ledger holding such overrides ---------------------------------------


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A ledger of its own (never ~/.hpc_llm): one run with each override, a sweep of two."""
    path = tmp_path / "hpc_llm_home"
    monkeypatch.setenv("HPC_LLM_HOME", str(path))
    runs = tmp_path / "runs"
    one = ledger.record(str(runs / "a" / "0"), str(runs / "a"), 0, "exp[/x]", "local", [BINDS], [], "COMPLETED")
    ledger.update(one, error="Slurm: FAILED [/usr/bin/true]")
    ledger.record(str(runs / "b" / "0"), str(runs / "b"), 0, "mpt_tiny", "local", [SETUP], [], "FAILED")
    for i in range(2):
        ledger.record(
            str(runs / "c" / str(i)), str(runs / "c"), i, "sweep", "local", [f"x={i}", BINDS], [], "COMPLETED"
        )
    assert os.path.isfile(path / "ledger.sqlite")
    return path


def test_the_status_table_shows_such_overrides_literally(home):
    runs = ledger.runs()
    every = render(runs_table(runs, every_run=True))
    assert every.count(BINDS) == 3 and every.count(SETUP) == 1 and "exp[/x]" in every
    assert all(col in every for col in COLUMNS)
    folded = render(runs_table(runs))
    assert "2 runs" in folded and "(a sweep)" in folded and "2 COMPLETED" in folded and "3-4" in folded
    assert folded.count(BINDS) == 1 and folded.count(SETUP) == 1
    # the same rows as a plain rich Table of markup strings: the old failure
    plain = Table()
    plain.add_column("overrides")
    for r in runs:
        plain.add_row(" ".join(r.overrides))
    with pytest.raises(MarkupError):
        render(plain)


def test_status_of_one_run_shows_its_error_literally(home):
    [first] = [r for r in ledger.runs() if r.id == 1]
    rendered = (render(x, width=60) for x in run_details([first], lambda run: [{"job": "7", "reason": "[/usr]"}]))
    shown = " ".join("".join(rendered).split())  # a narrow table folds its title
    assert "run 1: COMPLETED" in shown and "error: Slurm: FAILED [/usr/bin/true]" in shown
    assert "attempts of run 1" in shown and "[/usr]" in shown
    out = io.StringIO()
    assert show(ref="1", out=Console(file=out, width=300)) == 0
    assert "run dir " in out.getvalue() and "[/usr/bin/true]" in out.getvalue()


def test_status_of_one_run_says_how_many_spares_are_left_literally(home):
    """With spares, the run's own account (.hpc_llm/spares.json) is a line of `status <run>`."""
    from hpc_llm.rundir import spare_record

    [first] = [r for r in ledger.runs() if r.id == 1]
    Path(first.run_dir, ".hpc_llm").mkdir(parents=True, exist_ok=True)
    spare_record.write(Path(first.run_dir), 2, ["n4"], {"n3": "its agent ended: [/oops]"}, ["n3"])
    shown = " ".join("".join(render(x, width=300) for x in run_details([first], lambda run: [])).split())
    assert "spare nodes: 1 of 2 left; lost n3 (its agent ended: [/oops]); given back to Slurm: n3" in shown


def test_status_of_one_run_names_its_slow_nodes_literally(home):
    """Straggler verdicts (attempts.json) are a line of `status <run>`, with what was done."""
    from hpc_llm.rundir.record import Attempt, Attempts

    [first] = [r for r in ledger.runs() if r.id == 1]
    Path(first.run_dir, ".hpc_llm").mkdir(parents=True, exist_ok=True)
    a = Attempt(job_id="7", restart=0, started_at=1.0)
    a.stragglers = [{"node": "n[2]", "ratio": 3.46, "batch": 40, "action": "swap", "busy_s": {"n[2]": 0.3}}]
    attempts = Attempts.load(first.run_dir)
    attempts.items.append(a)
    attempts.save()
    shown = " ".join("".join(render(x, width=300) for x in run_details([first], lambda run: [])).split())
    assert "slow nodes: n[2] (3.5x the other nodes' busy time per batch at batch 40: swapped for a spare)" in shown
    # the swapped-out node given back to Slurm at 40 s of an allocation that ran to 7,240 s
    a.decided_at, a.ended_at, a.given_back, a.state = 40.0, 40.0, ["n[2]"], "stopped"
    b = Attempt(job_id="7", restart=0, started_at=41.0, generation=1)
    b.ended_at, b.state = 7240.0, "completed"
    attempts.items.append(b)
    attempts.save()
    shown = " ".join("".join(render(x, width=300) for x in run_details([first], lambda run: [])).split())
    assert "given back after swaps: n[2]: 2.00 node-hours not held" in shown


def test_hpc_llm_status_with_such_overrides(home):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "HYDRA_"))}
    env["HPC_LLM_HOME"] = str(home)
    for args in (["status"], ["status", "--all"], ["status", "1"]):
        proc = run_cli(args, env)
        assert proc.returncode == 0 and "MarkupError" not in proc.stderr, explain(proc)
        assert "[/usr/bin/true]" in proc.stdout, explain(proc)
