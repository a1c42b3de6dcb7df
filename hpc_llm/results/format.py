"""One formatter each for bytes, durations and tables (login side: rich only).

* Bytes are in **decimal** (SI) units: 1 GB = 10^9 bytes, as GPU memory figures,
  nccl-tests' GB/s and disk throughput are quoted. A column that holds bytes
  says its unit in its header (:func:`bytes_header`: ``"Checkpoint (GB)"``);
  a free-standing figure carries its own (:func:`human_bytes`: ``"85.9 GB"``).
* Durations: ``29m24.485s``, ``1h18m28s`` under a day; ``3.2 days`` and
  ``3.5 weeks (24.6 days)`` beyond (:func:`duration`).
* Tables: :func:`table` builds a rich Table whose every cell is a literal
  :class:`rich.text.Text`, so user text (an override such as
  ``container.binds=[/usr,/var/tmp/x]``, a run dir, an error) is shown as it
  is and never read as console markup (which it may break) or emoji codes.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # rich is imported by the table helpers only: bytes and durations are stdlib
    from rich.console import Console, OverflowMethod
    from rich.highlighter import ReprHighlighter
    from rich.table import Column, Table
    from rich.text import Text

#: the unit byte columns are given in, and its size
BYTES_UNIT = "GB"
GB = 1e9
#: decimal (SI) units, smallest first
_UNITS = (("B", 1.0), ("kB", 1e3), ("MB", 1e6), ("GB", 1e9), ("TB", 1e12), ("PB", 1e15), ("EB", 1e18))
_SCALE = dict(_UNITS)

DAY = 86400.0
WEEK = 7 * DAY


@functools.cache
def _highlighter() -> ReprHighlighter:
    from rich.highlighter import ReprHighlighter

    return ReprHighlighter()


def _number(value: Any) -> float | None:
    """``value`` as a finite float, else None (None, NaN, infinity, not a number)."""
    if value is None or isinstance(value, bool):
        return None
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


# -- bytes ---------------------------------------------------------------------------------------


def bytes_header(name: str, unit: str = BYTES_UNIT) -> str:
    """A column header that says its unit: ``bytes_header("Checkpoint")`` -> ``"Checkpoint (GB)"``."""
    return f"{name} ({unit})"


def bytes_in(n: Any, unit: str = BYTES_UNIT, digits: int = 2) -> float | None:
    """``n`` bytes in ``unit`` (decimal), rounded: the value of a column :func:`bytes_header`
    names. None for a missing (or non-finite) size. A size below one unit keeps ``digits``
    significant digits (a CPU toy model's 1.8 MB checkpoint is 0.0018 GB, not 0.0)."""
    x = _number(n)
    if x is None:
        return None
    value = x / _SCALE[unit]
    if value == 0 or abs(value) >= 1:
        return round(value, digits)
    return float(f"{value:.{digits}g}")


def human_bytes(n: Any, digits: int = 1) -> str:
    """A size with its decimal unit: ``0 B``, ``999 B``, ``1.5 kB``, ``85.9 GB``, ``1.2 TB``;
    ``-`` for a missing one. The largest unit of which it is at least one (a size that would
    round to 1000 of a unit is given in the next: ``1.0 TB``, never ``1,000.0 GB``)."""
    x = _number(n)
    if x is None:
        return "-"
    sign, x = ("-" if x < 0 else ""), abs(x)
    i = max((i for i, (_, scale) in enumerate(_UNITS) if x >= scale), default=0)
    if i + 1 < len(_UNITS) and round(x / _UNITS[i][1], digits if i else 0) >= 1000:
        i += 1
    unit, scale = _UNITS[i]
    return f"{sign}{x / scale:,.{digits}f} {unit}" if i else f"{sign}{x:.0f} B"


# -- durations -----------------------------------------------------------------------------------


def duration(seconds: Any, decimals: int = 0) -> str:
    """A length of time, readable at its scale: ``0m05s``, ``29m24.485s`` (``decimals=3``),
    ``1h18m28s`` under a day; ``1.5 days`` from a day, ``3.5 weeks (24.6 days)`` from two
    weeks on; ``-`` for a missing, negative or non-finite one."""
    x = _number(seconds)
    if x is None or x < 0:
        return "-"
    x = round(x, decimals)
    if x >= DAY:
        days = x / DAY
        return f"{days / 7:,.1f} weeks ({days:,.1f} days)" if x >= 2 * WEEK else f"{days:.1f} days"
    m, s = divmod(x, 60)
    h, m = divmod(int(m), 60)
    width = 2 + (decimals + 1 if decimals > 0 else 0)
    secs = f"{s:0{width}.{decimals}f}s"
    return f"{h}h{m:02d}m{secs}" if h else f"{m}m{secs}"


# -- tables --------------------------------------------------------------------------------------


def literal(value: Any, highlight: bool = True, style: str = "") -> Text:
    """``value`` as text shown exactly as it is (no markup, no emoji codes); ``None`` is ``-``.
    Highlighted (numbers, paths) as rich highlights a plain string."""
    from rich.text import Text

    if isinstance(value, Text):
        return value
    text = Text("-" if value is None else str(value), style=style)
    return _highlighter()(text) if highlight else text


def table(
    columns: Sequence[str | Column],
    rows: Iterable[Sequence[Any]] = (),
    *,
    title: str | Text | None = None,
    overflow: OverflowMethod = "fold",
    **options: Any,
) -> Table:
    """A rich Table whose cells (and title, and headers) are literal: user text cannot be read
    as markup. A column is a header (its cells fold at ``overflow``) or a rich Column; a cell
    may be a :class:`~rich.text.Text` already (styled on purpose); ``None`` shows ``-``.
    ``options`` go to :class:`rich.table.Table`; more rows with :func:`add_row`."""
    from rich.table import Column, Table
    from rich.text import Text

    if isinstance(title, str):
        title = Text(title, style=options.get("title_style") or "table.title")
    t = Table(title=title, **options)
    for col in columns:
        if isinstance(col, Column):
            t.columns.append(dataclasses.replace(col, _index=len(t.columns)))
        else:
            t.add_column(literal(col, highlight=False), overflow=overflow)
    for row in rows:
        add_row(t, row)
    return t


def add_row(t: Table, row: Sequence[Any]) -> None:
    """One row of literal cells (see :func:`literal`)."""
    t.add_row(*(literal(v) for v in row))


def wide_console(min_width: int = 160) -> Console:
    """A console at least ``min_width`` columns wide (a table folds, not truncates, in a pipe)."""
    from rich.console import Console

    return Console(width=max(min_width, Console().width))
