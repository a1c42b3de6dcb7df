"""results.json files of a sweep -> the seeds' tables: Markdown, CSV, a scaling plot.

Per experiment, the Markdown (report.md) has the scaling table a person reads
first (:data:`MAIN`: nodes, wall clock, speedup, efficiency, tokens/s, MFU,
loss, status) and, under its own heading, the artifacts, accounting and
provenance of each run (:data:`DETAILS`); report.csv has every column
(:data:`COLUMNS`); scaling.png is drawn by :mod:`hpc_llm.results.plot`.

Login node: reads the run directories' results.json files (and their Hydra
configs for runs that wrote none yet), and Slurm accounting for every attempt
(resource-hours, queue wait, states) and for runs that died without saying how.
Rows that failed or have not finished yet are shown with their status, never
dropped. Runs of different experiments in one directory are grouped, each with
its own baseline.
"""

from __future__ import annotations

import csv
import io
import json
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpc_llm.errors import ConfigError
from hpc_llm.results.format import bytes_header, bytes_in, duration
from hpc_llm.rundir.layout import RESULTS, RunDir
from hpc_llm.rundir.record import SETTLED

#: columns of bytes say their (decimal) unit: "Peak memory / rank (GB)", "Checkpoint (GB)"
PEAK_MEMORY = bytes_header("Peak memory / rank")
CHECKPOINT = bytes_header("Checkpoint")

#: said once per experiment, in the line under its heading (each run's value is in report.csv)
DESCRIBE = ["Model", "Data", "Max duration", "Eval interval"]
#: the scaling table a person reads first, as in the seeds' Table 2
MAIN = [
    "Nodes",
    "GPUs / ranks",
    "Wallclock",
    "Speedup",
    "Ideal",
    "Efficiency",
    "Tokens/s",
    "MFU",
    "Eval loss",
    "Status",
]
#: the second table, under its own heading: artifacts, accounting and provenance of each run
DETAILS = [
    "Run",
    "Nodes",
    "Point",
    PEAK_MEMORY,
    CHECKPOINT,
    "Conversion, inference & eval OK?",
    "Eval accuracy",
    "Train loss",
    "Goodput",
    "Restarts",
    "Resource-hours",
    "Queue wait",
    "Attempts (Slurm)",
    "Code",
]
#: every column: report.csv and ``--format json``
COLUMNS = [
    *DESCRIBE,
    "Nodes",
    "GPUs / ranks",
    "Wallclock",
    "Wallclock (s)",
    *MAIN[3:],
    *(c for c in DETAILS if c not in MAIN),
]


def total_wallclock(results: dict[str, Any]) -> float | None:
    """Seconds from the first start to the end, over every attempt (queue waits between
    requeues included); a run that never restarted has just its own wall clock."""
    value = results.get("total_wallclock_s") or results.get("wallclock_s")
    return float(value) if value else None


def restarts_text(results: dict[str, Any]) -> str:
    """'3 (time_limit 2, preemption 1)'."""
    n = results.get("restarts", 0)
    causes = results.get("restarts_by_cause") or {}
    detail = ", ".join(f"{cause} {count}" for cause, count in sorted(causes.items()))
    return f"{n} ({detail})" if detail else str(n)


@dataclass
class Run:
    run_dir: Path
    results: dict[str, Any] = field(default_factory=dict)
    #: its Slurm job ids: results.json's, else the ledger's (a job that died before writing any)
    job_ids: list[str] = field(default_factory=list)
    #: how Slurm accounting says the job ended, when the run itself never said (set by build)
    slurm_end: str | None = None
    slurm_error: str | None = None

    @property
    def status(self) -> str:
        own = self.results.get("status")
        if own in SETTLED or self.slurm_end is None:
            return str(own or "running")
        return self.slurm_end

    @property
    def experiment(self) -> str:
        return str(self.results.get("experiment") or _experiment_from_hydra(self.run_dir) or "?")

    @property
    def nodes(self) -> int | None:
        n = self.results.get("nodes")
        return int(n) if n is not None else _nodes_from_hydra(self.run_dir)


def _hydra_cfg(run_dir: Path) -> dict[str, Any]:
    import yaml

    path = run_dir / ".hydra" / "config.yaml"
    return yaml.safe_load(path.read_text()) if path.is_file() else {}


def _experiment_from_hydra(run_dir: Path) -> str | None:
    return _hydra_cfg(run_dir).get("experiment")


def _nodes_from_hydra(run_dir: Path) -> int | None:
    return (_hydra_cfg(run_dir).get("resources") or {}).get("nodes")


def find_runs(sweep_dir: Path) -> list[Run]:
    """Every run directory under ``sweep_dir``: one with results.json or a Hydra config."""
    sweep_dir = Path(sweep_dir)
    dirs = {p.parent for p in sweep_dir.rglob(RESULTS)}
    dirs |= {p.parent.parent for p in sweep_dir.rglob(".hydra/config.yaml")}
    runs = []
    for d in sorted(dirs, key=lambda p: (str(p.parent), int(p.name) if p.name.isdigit() else 0, p.name)):
        res = RunDir(d).results
        results = json.loads(res.read_text()) if res.is_file() else {}
        runs.append(Run(d, results, [str(j) for j in results.get("slurm_job_ids") or []]))
    return runs


def _yn(value: Any) -> str:
    return "-" if value is None else ("Y" if value else "N")


@dataclass
class Group:
    experiment: str
    runs: list[Run]
    baseline_nodes: int | None
    rows: list[dict[str, Any]] = field(default_factory=list)


def _accounting(runs: list[Run]) -> dict[str, list[Any]]:
    """Slurm accounting's attempts of every run's job(s), in one sacct call (empty without
    accounting: the report then has what the runs recorded). A run with no job ids of its own
    (it died before writing results.json) gets the ledger's."""
    from hpc_llm.results import ledger
    from hpc_llm.slurm import accounting

    if any(not r.job_ids for r in runs) and ledger.ledger_path().is_file():
        known = {x.run_dir: x.job_ids for x in ledger.runs() if x.launcher == "slurm"}
        for r in runs:
            # the launchers record os.path.abspath (no symlinks resolved)
            mine = known.get(str(r.run_dir.absolute())) or known.get(str(r.run_dir.resolve()))
            r.job_ids = r.job_ids or list(mine or [])
    ids = sorted({j for r in runs for j in r.job_ids})
    if not ids or not accounting.available():
        return {}
    acct = accounting.attempts(ids) or {}
    _slurm_ends(runs, acct)
    return acct


def _slurm_ends(runs: list[Run], acct: dict[str, list[Any]]) -> None:
    """A run whose results.json does not say how it ended (a bad setup line, a node lost, a
    scancel): Slurm accounting does, once the job has left the queue. A requeued attempt may
    reach accounting only when it becomes eligible, so squeue is asked too; if it cannot be
    asked, nothing is called ended."""
    from hpc_llm.slurm import accounting, query

    ended = [
        r
        for r in runs
        if r.results.get("status") not in SETTLED
        and r.job_ids
        and acct.get(r.job_ids[-1])
        and acct[r.job_ids[-1]][-1].state in accounting.ENDED
    ]
    queued = query.job_states([r.job_ids[-1] for r in ended]) if ended else {}
    if queued is None:
        return
    for r in ended:
        if r.job_ids[-1] in queued:
            continue
        last = acct[r.job_ids[-1]][-1]
        r.slurm_end, r.slurm_error = last.state.lower(), last.verdict


def _varying(runs: list[Run]) -> dict[Path, str]:
    """Each run's overrides that differ across the sweep (an lr sweep's lr), from .hydra/."""
    import yaml

    over: dict[Path, list[str]] = {}
    for r in runs:
        path = r.run_dir / ".hydra" / "overrides.yaml"
        try:
            over[r.run_dir] = [str(o) for o in (yaml.safe_load(path.read_text()) or [])]
        except (OSError, yaml.YAMLError):
            over[r.run_dir] = []
    common = set.intersection(*(set(o) for o in over.values())) if over else set()
    return {d: " ".join(o for o in overs if o not in common) for d, overs in over.items()}


def build(sweep_dir: Path, baseline_nodes: int | None = None) -> list[Group]:
    runs = find_runs(sweep_dir)
    if not runs:
        raise ConfigError(
            f"no runs under {sweep_dir} (no {RESULTS} and no .hydra/config.yaml); is it a sweep directory?"
        )
    acct = _accounting(runs)
    varying = _varying(runs)
    by_exp: dict[str, list[Run]] = defaultdict(list)
    for r in runs:
        by_exp[r.experiment].append(r)
    groups = []
    for exp, members in sorted(by_exp.items()):
        done = [r for r in members if r.status == "completed" and total_wallclock(r.results)]
        node_counts = sorted({r.nodes for r in done if r.nodes is not None})
        if baseline_nodes is not None and node_counts and baseline_nodes not in node_counts:
            raise ConfigError(
                f"--baseline-nodes={baseline_nodes} is not in this sweep ({exp}); completed node counts: "
                + ", ".join(str(n) for n in node_counts)
            )
        base_n = baseline_nodes if baseline_nodes is not None else (node_counts[0] if node_counts else None)
        base = next((r for r in done if r.nodes == base_n), None)
        g = Group(exp, members, base_n)
        for r in sorted(members, key=lambda r: (r.nodes or 0, str(r.run_dir))):
            g.rows.append(_row(r, base, acct, varying.get(r.run_dir, ""), _relative(r.run_dir, sweep_dir)))
        groups.append(g)
    return groups


def _relative(run_dir: Path, sweep_dir: Path) -> str:
    try:
        return str(run_dir.relative_to(Path(sweep_dir)))
    except ValueError:
        return str(run_dir)


def _row(
    r: Run, base: Run | None, acct: dict[str, list[Any]] | None = None, point: str = "", run: str = ""
) -> dict[str, Any]:
    from hpc_llm.rundir.provenance import short
    from hpc_llm.slurm.accounting import resource_hours

    res = r.results
    attempts = [a for j in dict.fromkeys(r.job_ids) for a in (acct or {}).get(j, [])]
    hours, unit = resource_hours(attempts) if attempts else (None, "")
    waits = [a.queue_wait_s for a in attempts if a.queue_wait_s is not None]
    wall = total_wallclock(res) if r.status == "completed" else None
    base_wall = total_wallclock(base.results) if base is not None else None
    speedup = ideal = eff = None
    if wall and base_wall and base is not None and r.nodes and base.nodes:
        speedup = base_wall / wall
        ideal = r.nodes / base.nodes
        eff = speedup / ideal
    ev = res.get("eval") or {}
    tasks = res.get("tasks_per_node")
    return {
        "Model": res.get("model") or r.experiment,
        "Data": res.get("data") or "-",
        "Max duration": res.get("max_duration") or "-",
        "Eval interval": res.get("eval_interval") or "-",
        "Nodes": r.nodes if r.nodes is not None else "-",
        "GPUs / ranks": res.get("world_size") or (r.nodes * tasks if r.nodes and tasks else "-"),
        "Wallclock": duration(wall, decimals=3),
        "Wallclock (s)": round(float(wall), 1) if wall else None,
        "Speedup": round(speedup, 2) if speedup is not None else None,
        "Ideal": round(ideal, 2) if ideal is not None else None,
        "Efficiency": round(eff, 3) if eff is not None else None,
        "Tokens/s": round(float(res["tokens_per_sec"])) if res.get("tokens_per_sec") else None,
        "MFU": round(float(res["mfu"]), 3) if res.get("mfu") is not None else None,
        PEAK_MEMORY: bytes_in(res.get("peak_memory_bytes") or None),
        CHECKPOINT: bytes_in(res.get("checkpoint_bytes") or None),
        "Conversion, inference & eval OK?": "/".join(
            (
                _yn(res.get("conversion_ok")),
                _yn(res.get("inference_ok")),
                _yn(bool(ev) if r.status == "completed" else None),
            )
        ),
        "Eval loss": round(float(ev["loss"]), 3) if "loss" in ev else None,
        "Eval accuracy": round(float(ev["token_accuracy"]), 3) if "token_accuracy" in ev else None,
        "Train loss": round(float(res["train_loss"]), 3) if res.get("train_loss") is not None else None,
        "Goodput": round(float(res["goodput"]), 3) if res.get("goodput") is not None else None,
        "Restarts": restarts_text(res) if res else "-",
        "Resource-hours": f"{hours:.3g} {unit}" if hours is not None else None,
        "Queue wait": duration(sum(waits), decimals=3) if waits else None,
        "Attempts (Slurm)": " > ".join(a.state for a in attempts) or None,
        "Code": short(res.get("provenance")) if res else "-",
        "Run": run or r.run_dir.name,
        "Point": point or None,
        "Status": r.status
        + (
            f" ({r.slurm_error})"
            if r.slurm_error
            else f" ({res['error']})"
            if res.get("error") and r.status == "failed"
            else ""
        ),
    }


def _fmt(v: Any, col: str) -> str:
    if v is None:
        return "-"
    if col == "Speedup" or col == "Ideal":
        return f"{v:.2f}x"
    if col == "Tokens/s":
        return f"{v:,}"
    return str(v)


def main_columns(g: Group) -> list[str]:
    """The scaling table's columns; with "Point" when the runs differ in more than their
    node count (an lr sweep), since nothing else would tell its rows apart."""
    points = {str(row["Point"] or "") for row in g.rows}
    if any(o and not o.startswith("resources.nodes=") for p in points for o in p.split()):
        return [*MAIN[:2], "Point", *MAIN[2:]]
    return MAIN


def describe(g: Group) -> str:
    """The line under an experiment's heading: what every run of it trained (the completed
    runs' values; several when they differ)."""
    done = [row for row in g.rows if row["Status"] == "completed"] or g.rows
    parts = []
    for col, label in zip(DESCRIBE, ("model", "data", "max duration", "eval interval"), strict=True):
        values = list(dict.fromkeys(str(row[col]) for row in done if row[col] not in (None, "-")))
        parts.append(f"{label} {', '.join(values) if values else '-'}")
    text = "; ".join(parts)
    return text[:1].upper() + text[1:] + "."


def _table(columns: list[str], rows: list[dict[str, Any]]) -> list[str]:
    out = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    out += ["| " + " | ".join(_fmt(row[c], c).replace("|", "/") for c in columns) + " |" for row in rows]
    return out


def to_markdown(groups: list[Group]) -> str:
    out = []
    if len(groups) > 1:
        out.append(
            f"Note: this directory holds {len(groups)} experiments ({', '.join(g.experiment for g in groups)}); "
            "each has its own table and baseline.\n"
        )
    for g in groups:
        base = f"{g.baseline_nodes} node(s)" if g.baseline_nodes is not None else "none completed"
        out += [f"### {g.experiment} (speedup vs {base})", "", describe(g), ""]
        out += [*_table(main_columns(g), g.rows), ""]
        out += [f"#### {g.experiment}: artifacts, accounting and provenance", ""]
        out += [*_table(DETAILS, g.rows), ""]
    out.append("Every column of every run: report.csv, beside this file.\n")
    return "\n".join(out)


def to_csv(groups: list[Group]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["Experiment", *COLUMNS])
    for g in groups:
        for row in g.rows:
            w.writerow([g.experiment, *("" if row[c] is None else row[c] for c in COLUMNS)])
    return buf.getvalue()


def to_json(groups: list[Group]) -> str:
    return json.dumps(
        [{"experiment": g.experiment, "baseline_nodes": g.baseline_nodes, "rows": g.rows} for g in groups], indent=2
    )


def plot(groups: list[Group], path: Path) -> Path:
    from hpc_llm.results import plot as scaling

    return scaling.save(groups, path)


def write_report(sweep_dir: Path, baseline_nodes: int | None = None) -> tuple[list[Group], dict[str, Path]]:
    groups = build(sweep_dir, baseline_nodes)
    sweep_dir = Path(sweep_dir)
    paths = {"md": sweep_dir / "report.md", "csv": sweep_dir / "report.csv", "png": sweep_dir / "scaling.png"}
    paths["md"].write_text(to_markdown(groups))
    paths["csv"].write_text(to_csv(groups))
    plot(groups, paths["png"])
    return groups, paths
