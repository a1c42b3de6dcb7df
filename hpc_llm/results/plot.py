"""The sweep's scaling figure (``scaling.png``): speedup, throughput and MFU against nodes.

Drawn as a scaling study is read: the node counts themselves are the ticks of a
log-2 axis (1, 2, 4, 8 evenly apart, never 1.2 or 1.4), the ideal (linear from
the baseline node count; flat for MFU) is dashed beside what was measured, and
every value axis starts at zero, so a 0.7% difference looks like 0.7% and not
like a collapse. Login side: matplotlib's object API only (no pyplot state, no
backend to switch).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure


class Group(Protocol):
    """What the figure reads of one experiment of the report (hpc_llm.results.report.Group)."""

    experiment: str
    baseline_nodes: int | None
    rows: list[dict[str, Any]]


#: headroom above the highest value or ideal on a value axis
HEADROOM = 1.1
#: the ideal is straight on linear axes but bends on a log-2 one: drawn through this many points
IDEAL_POINTS = 64


@dataclass(frozen=True)
class Panel:
    column: str
    title: str
    ylabel: str
    #: how the ideal grows with nodes: value at the baseline x (nodes / baseline nodes) ** exponent
    exponent: int


PANELS = (
    Panel("Speedup", "Speedup", "speedup vs baseline (x)", 1),
    Panel("Tokens/s", "Throughput", "tokens/s", 1),
    Panel("MFU", "MFU", "model FLOPs utilisation", 0),
)


def points(group: Group, column: str) -> list[tuple[int, float]]:
    """(nodes, value) of the group's completed runs that have ``column``, by node count."""
    return sorted(
        (int(r["Nodes"]), float(r[column]))
        for r in group.rows
        if r["Status"] == "completed" and isinstance(r["Nodes"], int) and r[column] is not None
    )


def ideal(group: Group, panel: Panel, xs: Sequence[float]) -> list[float] | None:
    """The ideal curve over ``xs``, from the baseline run's own value; None without one."""
    base_n = group.baseline_nodes
    at_base = [v for n, v in points(group, panel.column) if n == base_n]
    if not base_n or not at_base:
        return None
    return [at_base[0] * (x / base_n) ** panel.exponent for x in xs]


def node_ticks(groups: Sequence[Group]) -> list[int]:
    """Every node count the figure shows a value at."""
    return sorted({n for g in groups for p in PANELS for n, _ in points(g, p.column)})


def figure(groups: Sequence[Group]) -> Figure:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(5 * len(PANELS), 4.2), layout="constrained")
    axes = fig.subplots(1, len(PANELS))
    ticks = node_ticks(groups)
    for ax, panel in zip(axes, PANELS, strict=True):
        _draw(ax, panel, groups, ticks)
    names = ", ".join(g.experiment for g in groups)
    fig.suptitle(f"Scaling of {names}: completed runs; dashed: ideal from the baseline node count")
    return fig


def _draw(ax: Axes, panel: Panel, groups: Sequence[Group], ticks: list[int]) -> None:
    from matplotlib.ticker import FuncFormatter, NullLocator, PercentFormatter

    top = 0.0
    span = (ticks[0], ticks[-1]) if ticks else (1, 1)
    xs = [span[0] * (span[1] / span[0]) ** (i / (IDEAL_POINTS - 1)) for i in range(IDEAL_POINTS)]
    for g in groups:
        pts = points(g, panel.column)
        if not pts:
            continue
        (line,) = ax.plot([n for n, _ in pts], [v for _, v in pts], "o-", label=g.experiment)
        top = max(top, *(v for _, v in pts))
        curve = ideal(g, panel, xs)
        if curve is not None:
            label = "ideal" if len(groups) == 1 else f"ideal ({g.experiment})"
            ax.plot(xs, curve, "--", color=line.get_color(), alpha=0.7, label=label)
            top = max(top, *curve)
    ax.set_xscale("log", base=2)
    if ticks:
        ax.set_xticks(ticks, labels=[str(n) for n in ticks])
        ax.set_xlim(ticks[0] / 2**0.3, ticks[-1] * 2**0.3)
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_ylim(0, top * HEADROOM if top > 0 else 1.0)
    if panel.column == "MFU":
        ax.yaxis.set_major_formatter(PercentFormatter(xmax=1.0))
    elif panel.column == "Tokens/s":
        ax.yaxis.set_major_formatter(FuncFormatter(_thousands))
    if top > 0:
        ax.legend(loc="lower right")
    else:
        why = "not measured (no GPU peak FLOP/s)" if panel.column == "MFU" else "no completed run"
        ax.text(0.5, 0.5, why, transform=ax.transAxes, ha="center", va="center", color="gray")
    ax.set_xlabel("nodes")
    ax.set_ylabel(panel.ylabel)
    ax.set_title(panel.title)
    ax.grid(True, alpha=0.3)


def _thousands(value: float, _pos: Any) -> str:
    return f"{value:,.0f}"


def save(groups: Sequence[Group], path: Path) -> Path:
    figure(groups).savefig(path, dpi=100)
    return path
