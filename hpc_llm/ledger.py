"""The run ledger: every submission, its run dir, overrides, Slurm job ids and state.

An SQLite file (``$HPC_LLM_HOME/ledger.sqlite``, default ``~/.hpc_llm``), so
concurrent submissions from several shells are safe. Written on the login
node by the launchers; ``hpc-llm status`` refreshes states from squeue,
sacct and each run's results.json. Pure stdlib.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

FINAL_STATES = frozenset({"COMPLETED", "FAILED", "CANCELLED", "DRY_RUN", "TIMEOUT", "PREEMPTED"})

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    run_dir TEXT NOT NULL UNIQUE,
    sweep_dir TEXT NOT NULL,
    job_num INTEGER NOT NULL,
    experiment TEXT,
    launcher TEXT NOT NULL,
    overrides TEXT NOT NULL,
    job_ids TEXT NOT NULL DEFAULT '[]',
    state TEXT NOT NULL,
    restarts INTEGER NOT NULL DEFAULT 0,
    error TEXT,
    submitted_at REAL NOT NULL,
    updated_at REAL NOT NULL
)
"""


def home() -> Path:
    return Path(os.environ.get("HPC_LLM_HOME") or Path.home() / ".hpc_llm").expanduser()


def ledger_path() -> Path:
    return home() / "ledger.sqlite"


@dataclass
class Run:
    id: int
    run_dir: str
    sweep_dir: str
    job_num: int
    experiment: str | None
    launcher: str
    overrides: list[str]
    job_ids: list[str] = field(default_factory=list)
    state: str = "SUBMITTED"
    restarts: int = 0
    error: str | None = None
    submitted_at: float = 0.0
    updated_at: float = 0.0


@contextmanager
def connect(path: Path | None = None) -> Iterator[sqlite3.Connection]:
    path = path or ledger_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(str(path), timeout=30)
    conn.row_factory = sqlite3.Row
    try:
        conn.execute(SCHEMA)
        yield conn
        conn.commit()
    finally:
        conn.close()


def _row(r: sqlite3.Row) -> Run:
    return Run(
        id=r["id"],
        run_dir=r["run_dir"],
        sweep_dir=r["sweep_dir"],
        job_num=r["job_num"],
        experiment=r["experiment"],
        launcher=r["launcher"],
        overrides=json.loads(r["overrides"]),
        job_ids=json.loads(r["job_ids"]),
        state=r["state"],
        restarts=r["restarts"],
        error=r["error"],
        submitted_at=r["submitted_at"],
        updated_at=r["updated_at"],
    )


def record(
    run_dir: str,
    sweep_dir: str,
    job_num: int,
    experiment: str | None,
    launcher: str,
    overrides: list[str],
    job_ids: list[str],
    state: str,
) -> Run:
    now = time.time()
    sweep_dir = str(Path(sweep_dir).resolve())
    with connect() as conn:
        conn.execute(
            "INSERT INTO runs (run_dir, sweep_dir, job_num, experiment, launcher, overrides, job_ids, state,"
            " submitted_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
            " ON CONFLICT(run_dir) DO UPDATE SET job_ids=excluded.job_ids, state=excluded.state,"
            " updated_at=excluded.updated_at",
            (
                run_dir,
                sweep_dir,
                job_num,
                experiment,
                launcher,
                json.dumps(overrides),
                json.dumps(job_ids),
                state,
                now,
                now,
            ),
        )
        row = conn.execute("SELECT * FROM runs WHERE run_dir = ?", (run_dir,)).fetchone()
    return _row(row)


def update(run: Run, **changes: object) -> Run:
    for key, value in changes.items():
        setattr(run, key, value)
    run.updated_at = time.time()
    with connect() as conn:
        conn.execute(
            "UPDATE runs SET job_ids=?, state=?, restarts=?, error=?, updated_at=? WHERE id=?",
            (json.dumps(run.job_ids), run.state, run.restarts, run.error, run.updated_at, run.id),
        )
    return run


def runs(limit: int | None = None) -> list[Run]:
    with connect() as conn:
        q = "SELECT * FROM runs ORDER BY id DESC" + (f" LIMIT {int(limit)}" if limit else "")
        return [_row(r) for r in conn.execute(q).fetchall()][::-1]


def find(ref: str) -> Run | None:
    """A run by ledger id, Slurm job id, or (a prefix of) its run directory."""
    all_runs = runs()
    path = str(Path(ref).expanduser().resolve()) if ("/" in ref or Path(ref).exists()) else None
    for r in reversed(all_runs):
        if ref == str(r.id) or ref in r.job_ids or (path and (r.run_dir == path or r.run_dir.startswith(path + "/"))):
            return r
    return None
