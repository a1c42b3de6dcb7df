"""``hpc-llm doctor``'s rows shown: a table with a verdict line, or JSON."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict

from hpc_llm.doctor.row import FAIL, OK, WARN, Row

_STYLE = {OK: "green", WARN: "yellow", FAIL: "bold red"}


def render(rows: Sequence[Row], title: str, width: int = 120) -> str:
    """The rows as a table (rich, literal cells), then one line of the verdict."""
    from rich.text import Text

    from hpc_llm.results.format import literal, table, wide_console

    t = table(("check", "found", "", "what it means"), title=title)
    for r in rows:
        t.add_row(literal(r.check), literal(r.value), Text(r.status, style=_STYLE[r.status]), literal(r.detail))
    console = wide_console(width)
    with console.capture() as cap:
        console.print(t)
        console.print(literal(summary(rows), highlight=False))
    return cap.get()


def summary(rows: Sequence[Row]) -> str:
    fails = [r.check for r in rows if r.status == FAIL]
    warns = [r.check for r in rows if r.status == WARN]
    said = f"; {len(warns)} warning(s): {', '.join(warns)}" if warns else ""
    if fails:
        return f"{len(fails)} must-have(s) missing: {', '.join(fails)}{said}"
    return f"everything hpc_llm needs is here{said}"


def as_json(rows: Sequence[Row]) -> str:
    return json.dumps([asdict(r) for r in rows], indent=2)
