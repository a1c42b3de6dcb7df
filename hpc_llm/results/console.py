"""What a person sees while runs train and when they end: a live line, then a summary.

The full output of every rank stays in ``<run dir>/logs/rank<N>.log``; the
console shows one live progress line per run (batch / total, loss, tokens/s,
ETA, read from the run's progress file that rank 0 rewrites) and, when a run
ends, a short summary of its results.json. ``-v`` (or
``HPC_LLM_LOG_LEVEL=INFO``) streams rank 0's whole output instead. Login side:
rich only.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpc_llm.results.format import duration, table
from hpc_llm.rundir.record import read_progress

if TYPE_CHECKING:  # pragma: no cover
    # rich is imported where it is used: every submit imports this module, few show anything
    # with rich (~0.1 s of a submit's start)
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

LOG_LEVEL_ENV = "HPC_LLM_LOG_LEVEL"


def verbose() -> bool:
    """Stream the ranks' whole output (``-v`` or HPC_LLM_LOG_LEVEL=INFO/DEBUG)."""
    return os.environ.get(LOG_LEVEL_ENV, "").upper() in ("INFO", "DEBUG")


def progress_line(label: str, progress: dict[str, Any], started: float, state: str | None = None) -> Text:
    """``job 0 [train] batch 12/40  loss 5.21  1,234 tok/s  ETA 0m18s``."""
    from rich.text import Text

    if not progress:
        return Text(f"{label}: {state or 'starting'} ({duration(time.time() - started)})", style="dim")
    batch, total = progress.get("batch") or 0, progress.get("total_batches")
    parts = [f"{label} [{progress.get('phase', '?')}]", f"batch {batch}" + (f"/{total}" if total else "")]
    if progress.get("loss") is not None:
        parts.append(f"loss {progress['loss']:.4g}")
    if progress.get("tokens_per_sec"):
        parts.append(f"{progress['tokens_per_sec']:,.0f} tok/s")
    elapsed = (progress.get("time") or time.time()) - started
    if total and batch and progress.get("phase") == "train":
        parts.append(f"ETA {duration(elapsed / batch * (total - batch))}")
    if state:
        parts.append(state)
    return Text("  ".join(parts))


@contextmanager
def live_progress(
    runs: Callable[[], list[tuple[str, Path, str | None]]],
    console: Console | None = None,
    plain_every_s: float | None = None,
) -> Iterator[Callable[[str], None]]:
    """While the block runs, one refreshing line per run: ``runs()`` gives (label, run dir, state).
    Yields ``say``, which prints one line (literal text) above them.

    Without a terminal (a pipe, a log file, CI) a live display shows nothing; with
    ``plain_every_s`` the lines are printed there instead: every run's at the start, then the
    runs whose state or batch changed, looked at every ``plain_every_s`` seconds and at the end."""
    from rich.console import Console
    from rich.live import Live
    from rich.table import Table
    from rich.text import Text

    console = console or Console(stderr=True)
    started = time.time()

    def lines() -> list[tuple[tuple[object, ...], Text]]:
        out: list[tuple[tuple[object, ...], Text]] = []
        for label, run_dir, state in runs():
            progress = read_progress(run_dir)
            key = (label, state, progress.get("phase"), progress.get("batch"))
            out.append((key, progress_line(label, progress, started, state)))
        return out

    def say(text: str) -> None:
        console.print(Text(text), soft_wrap=True)

    if not console.is_terminal and plain_every_s is not None:
        with _plain_progress(lines, console, plain_every_s):
            yield say
        return

    def render() -> Table:
        grid = Table.grid()
        for _, line in lines():
            grid.add_row(line)
        return grid

    with (
        Live(render(), console=console, refresh_per_second=2, transient=True) as live,
        _every(0.5, lambda: live.update(render())),
    ):
        yield say


@contextmanager
def _plain_progress(
    lines: Callable[[], list[tuple[tuple[object, ...], Text]]], console: Console, every_s: float
) -> Iterator[None]:
    shown: dict[object, tuple[object, ...]] = {}

    def show() -> None:
        for key, line in lines():
            if shown.get(key[0]) != key:  # a log file gets news, not the same line again with a new clock
                shown[key[0]] = key
                console.print(line, soft_wrap=True)

    show()
    try:
        with _every(every_s, show):
            yield
    finally:
        show()


@contextmanager
def _every(period_s: float, action: Callable[[], None]) -> Iterator[None]:
    """``action`` every ``period_s`` on a thread of its own while the block runs."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(period_s):
            action()

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=2)


def _fmt(value: Any, spec: str = "") -> str:
    if value is None:
        return "-"
    return format(value, spec) if spec else str(value)


def summary(results: dict[str, Any], title: str | None = None) -> Table:
    """The end of a run in a few rows: loss, held-out metrics, throughput, where things are.
    Every value is literal text (an error, a path, a sample may hold brackets)."""
    from rich.table import Column

    ev = results.get("eval") or {}
    error = results.get("error")
    first, last = results.get("train_loss_first"), results.get("train_loss")
    mfu = results.get("mfu")
    wall = results.get("total_wallclock_s") or results.get("wallclock_s")
    restarts = results.get("restarts") or 0
    rows = [
        ("status", str(results.get("status")) + (f": {error}" if error else "")),
        ("train loss", f"{_fmt(first, '.4g')} -> {_fmt(last, '.4g')} ({_fmt(results.get('batches_done'))} batches)"),
    ]
    if ev:
        rows.append(
            ("held-out", f"loss {_fmt(ev.get('loss'), '.4g')}, token accuracy {_fmt(ev.get('token_accuracy'), '.3f')}")
        )
    rows.append(
        (
            "throughput",
            f"{_fmt(results.get('tokens_per_sec'), ',.0f')} tokens/s" + (f", MFU {mfu:.1%}" if mfu is not None else ""),
        )
    )
    rows.append(("wall clock", duration(wall) + (f", {restarts} restart(s)" if restarts else "")))
    if results.get("checkpoint"):
        rows.append(("checkpoint", str(results["checkpoint"])))
    if results.get("hf_model_dir"):
        rows.append(("HF model", str(results["hf_model_dir"])))
    if ev.get("inference_sample") is not None:
        rows.append(("inference", repr(ev["inference_sample"])))
    if results.get("run_dir"):
        rows.append(("run dir", str(results["run_dir"])))
    return table(
        (Column(style="bold"), Column()),
        rows,
        title=title,
        show_header=False,
        title_justify="left",
        box=None,
        pad_edge=False,
    )
