"""What ``hpc-llm status`` prints: the ledger as a table (a sweep is one line), or one run's
attempts, each run as its own record tells it where that is final (:mod:`hpc_llm.results.status`),
under one line when Slurm could not be asked. Every cell is literal text
(:mod:`hpc_llm.results.format`): overrides, run dirs, experiment names and errors are shown as
they are, never read as console markup."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator

from rich.console import Console, RenderableType
from rich.table import Table

from hpc_llm.results import ledger
from hpc_llm.results.format import add_row, literal, table, wide_console
from hpc_llm.results.status import SHOWN_WITHOUT_SLURM, attempts_of, causes, counts, refresh, runs_of, short
from hpc_llm.rundir import spare_record
from hpc_llm.rundir.record import Attempts, read_results

COLUMNS = ("id", "state", "cause", "experiment", "job ids", "restarts", "submitted", "overrides", "run dir")


def cause(run: ledger.Run) -> str:
    """Why a run did not complete, in a cell: its error (the first rank's exception), else '-'."""
    if run.state in ("COMPLETED", "RUNNING", "PENDING", "SUBMITTED", "DRY_RUN") or not run.error:
        return "-"
    error = re.sub(r"^job \d+ (\(Slurm job \S+\) )?failed: ", "", str(run.error)).split("; log: ")[0]
    return short(error, 60) or "-"


AttemptsOf = Callable[[ledger.Run], list[dict[str, object]]]


def _when(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(ts))


def runs_table(runs: list[ledger.Run], every_run: bool = False) -> Table:
    """One line per run; a sweep of several runs is one line of its counts unless ``every_run``."""
    t = table(COLUMNS, title="hpc_llm runs")
    by_sweep: dict[str, list[ledger.Run]] = {}
    for r in runs:
        by_sweep.setdefault(r.sweep_dir, []).append(r)
    for r in runs:
        sweep = by_sweep[r.sweep_dir]
        if len(sweep) > 1 and not every_run:
            if r is not sweep[0]:
                continue  # a sweep is one line: its counts
            add_row(
                t,
                (
                    f"{sweep[0].id}-{sweep[-1].id}",
                    counts(sweep),
                    next((c for c in map(cause, sweep) if c != "-"), "-"),
                    r.experiment or "-",
                    f"{len(sweep)} runs",
                    str(sum(x.restarts for x in sweep)),
                    _when(r.submitted_at),
                    "(a sweep)",
                    r.sweep_dir,
                ),
            )
            continue
        add_row(
            t,
            (
                str(r.id),
                r.state,
                cause(r),
                r.experiment or "-",
                ",".join(r.job_ids) or "-",
                str(r.restarts),
                _when(r.submitted_at),
                " ".join(r.overrides) or "-",
                r.run_dir,
            ),
        )
    return t


def run_details(runs: list[ledger.Run], attempts: AttemptsOf = attempts_of) -> Iterator[RenderableType]:
    """``hpc-llm status <run>``: each run's state and restarts (why, from its record), and every
    attempt Slurm accounting knows (or the run recorded)."""
    for run in runs:
        why = causes(run)
        yield literal(
            f"run {run.id}: {run.state}, {run.restarts} restart(s)"
            + (f" ({why})" if why else "")
            + f", job(s) {', '.join(run.job_ids) or '-'}"
        )
        yield literal(f"  run dir {run.run_dir}")
        held = spare_record.read(run.run_dir)
        if held is not None:
            yield literal(f"  spare nodes: {spare_record.describe(held)}")
        slow = slow_nodes(run.run_dir)
        if slow:
            yield literal(f"  slow nodes: {slow}")
        sizes = size_changes(run.run_dir)
        if sizes:
            yield literal(f"  size changes: {sizes}")
        saved = given_back(run.run_dir)
        if saved:
            yield literal(f"  given back after swaps: {saved}")
        if run.error:
            yield literal(f"  error: {run.error}")
        rows = attempts(run)
        if rows:
            yield table(list(rows[0]), (tuple(row.values()) for row in rows), title=f"attempts of run {run.id}")


#: what a straggler verdict's action did, in status's words
_SLOW_ACTIONS = {"swap": "swapped for a spare", "exclude": "left out at the next requeue", "warn": "warned"}


def slow_nodes(run_dir: str) -> str | None:
    """The run's straggler verdicts (attempts.json), one clause each; None without any."""
    try:
        verdicts = [v for a in Attempts.load(run_dir).items for v in a.stragglers]
    except (OSError, ValueError, TypeError):
        return None
    return (
        "; ".join(
            f"{v.get('node')} ({float(v.get('ratio') or 0):.1f}x the other nodes' busy time per batch at batch "
            f"{v.get('batch')}: {_SLOW_ACTIONS.get(str(v.get('action')), v.get('action'))})"
            for v in verdicts
        )
        or None
    )


def size_changes(run_dir: str) -> str | None:
    """Each change of the number of nodes the run trained on (resources.min_nodes), one clause
    each; None without any."""
    try:
        changes = Attempts.load(run_dir).summary()["size_changes"]
    except (OSError, ValueError, TypeError, KeyError):
        return None
    return (
        "; ".join(
            f"{c['from_nodes']} -> {c['to_nodes']} nodes at {_when(float(c['at']))}"
            + (f" (after: {str(c['why'])[:120]})" if c.get("why") else "")
            for c in changes
        )
        or None
    )


def given_back(run_dir: str) -> str | None:
    """The nodes the job gave back to Slurm after swaps and the node-hours (GPU-hours) it did not
    hold for it; None when it gave none back."""
    try:
        summary = Attempts.load(run_dir).summary()
    except (OSError, ValueError, TypeError):
        return None
    node_s = float(summary.get("given_back_node_s") or 0.0)
    if not node_s:
        return None
    gpus = int((read_results(run_dir) or {}).get("gpus_per_node") or 0)
    hours = f"{node_s / 3600:.2f} node-hours" + (f" ({node_s * gpus / 3600:.1f} GPU-hours)" if gpus else "")
    return f"{', '.join(summary['given_back_nodes'])}: {hours} not held"


def show(
    limit: int | None = None,
    ref: str | None = None,
    every_run: bool = False,
    out: Console | None = None,
    dry_runs: bool = False,
) -> int:
    """Refresh the ledger and print it (or, with ``ref``, those runs' attempts); dry runs only
    with ``dry_runs`` (or named by ``ref``): they never ran, and a day of checking fills the table."""
    out = out or wide_console()
    snap = refresh(ids={r.id for r in runs_of(ref)}) if ref else refresh(limit=limit)
    line = snap.slurm_line(SHOWN_WITHOUT_SLURM)
    if line:
        out.print(literal(line, highlight=False), soft_wrap=True)
    if ref:
        asked = snap.unreachable is None
        for renderable in run_details(snap.runs, lambda run: attempts_of(run, ask_slurm=asked)):
            out.print(renderable)
        return 0
    shown = [r for r in snap.runs if dry_runs or r.state != "DRY_RUN"]
    out.print(runs_table(shown, every_run=every_run))
    hidden = len(snap.runs) - len(shown)
    if hidden:
        out.print(literal(f"{hidden} dry run(s) not shown (hpc-llm status --dry-runs)", highlight=False))
    return 0
