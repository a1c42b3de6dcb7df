"""The run ledger: every submission, its run dir, overrides, Slurm job ids and state.

An SQLite file (``$HPC_LLM_HOME/ledger.sqlite``, default ``~/.hpc_llm``), so
concurrent submissions from several shells are safe. Written on the login
node by the launchers; ``hpc-llm status`` refreshes states from squeue,
sacct and each run's results.json. Pure stdlib.

It is a cache of what the run's own files and Slurm accounting say, and it
never loses or invents a state: an update writes only the columns it
changes (two writers touching different columns both land), a state change
can be made conditional on the state the writer saw (compare-and-set), and a
final state (COMPLETED, FAILED, CANCELLED) is never replaced by a live one.
SQLite's locking is not reliable on NFS (its own FAQ); a home directory on
NFS is detected and named once (``HPC_LLM_HOME`` moves the ledger to a
node-local disk). It also keeps when Slurm last answered (:func:`seen`), so a
status that cannot ask it says how old its copy is.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from hpc_llm.paths import state_dir

#: states of a job that has left the queue (TIMEOUT / PREEMPTED: for now; Slurm may requeue it)
ENDED_STATES = frozenset({"COMPLETED", "FAILED", "CANCELLED", "DRY_RUN", "TIMEOUT", "PREEMPTED"})
#: states no later update may replace by a live one (TIMEOUT / PREEMPTED jobs may be requeued)
SETTLED_STATES = frozenset({"COMPLETED", "FAILED", "CANCELLED", "DRY_RUN"})
#: filesystems whose locking SQLite cannot trust
NETWORK_FS = ("nfs", "lustre", "gpfs", "cifs", "smb3", "smbfs", "beegfs", "fuse.sshfs", "ceph", "fuse.glusterfs")

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
#: when a source (Slurm) last answered a query of this ledger's runs
SEEN_SCHEMA = "CREATE TABLE IF NOT EXISTS seen (source TEXT PRIMARY KEY, at REAL NOT NULL)"


def home() -> Path:
    return state_dir()


def ledger_path() -> Path:
    return home() / "ledger.sqlite"


MOUNTS = Path("/proc/mounts")


def filesystem_type(path: Path, mounts_file: Path | None = None) -> str | None:
    """The type of the filesystem holding ``path`` (its longest mount point in /proc/mounts)."""
    try:
        mounts = (mounts_file or MOUNTS).read_text().splitlines()
    except OSError:
        return None
    target = str(path.absolute())
    best, kind = "", None
    for line in mounts:
        parts = line.split()
        if len(parts) >= 3:
            point = parts[1].replace("\\040", " ")
            if (target == point or target.startswith(point.rstrip("/") + "/")) and len(point) >= len(best):
                best, kind = point, parts[2]
    return kind


def _check_filesystem(path: Path) -> None:
    kind = filesystem_type(path.parent)
    if kind is not None and kind.startswith(NETWORK_FS):
        from hpc_llm.errors import warn_once

        warn_once(
            f"the run ledger {path} is on {kind}, where SQLite's locking is unreliable; set HPC_LLM_HOME "
            "to a node-local directory (e.g. /var/tmp/$USER/hpc_llm)"
        )


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
    _check_filesystem(path)
    conn = sqlite3.connect(str(path), timeout=60)
    conn.row_factory = sqlite3.Row
    try:
        conn.execute(SCHEMA)
        conn.execute(SEEN_SCHEMA)
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
    conn: sqlite3.Connection | None = None,
) -> Run:
    """Insert (or update) one run; ``conn``: a connection of :func:`connect` to record many
    runs in one transaction (one fsync for a 100-point sweep instead of 100)."""
    now = time.time()
    sweep_dir = str(Path(sweep_dir).resolve())
    with contextlib.nullcontext(conn) if conn is not None else connect() as conn:
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


_COLUMNS = ("job_ids", "state", "restarts", "error")


def update(run: Run, *, expect_state: str | None = None, **changes: object) -> Run:
    """Write ``changes`` (only those columns) and return the run as the ledger now has it.

    ``expect_state``: only if the ledger still says that state (compare-and-set; the
    caller read it and decided from it). A terminal state is never replaced by another
    state (a late squeue answer cannot undo what results.json or sacct said)."""
    unknown = set(changes) - set(_COLUMNS)
    if unknown:
        raise ValueError(f"ledger.update: unknown column(s) {sorted(unknown)}")
    values = {k: json.dumps(v) if k == "job_ids" else v for k, v in changes.items()}
    sets = ", ".join(f"{k}=?" for k in values) + (", " if values else "") + "updated_at=?"
    where, args = "id=?", list[object]([run.id])
    if expect_state is not None:
        where += " AND state=?"
        args.append(expect_state)
    if "state" in changes:
        terminal = sorted(SETTLED_STATES)
        where += f" AND (state NOT IN ({','.join('?' * len(terminal))}) OR state=?)"
        args += [*terminal, changes["state"]]
    with connect() as conn:
        conn.execute(f"UPDATE runs SET {sets} WHERE {where}", [*values.values(), time.time(), *args])
        row = conn.execute("SELECT * FROM runs WHERE id=?", (run.id,)).fetchone()
    return _row(row) if row is not None else run


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


def seen(source: str, at: float | None = None) -> None:
    """``source`` (Slurm) answered just now: what "last seen" says when it no longer does."""
    with connect() as conn:
        conn.execute(
            "INSERT INTO seen (source, at) VALUES (?, ?) ON CONFLICT(source) DO UPDATE SET at=excluded.at",
            (source, time.time() if at is None else at),
        )


def last_seen(source: str) -> float | None:
    with connect() as conn:
        row = conn.execute("SELECT at FROM seen WHERE source=?", (source,)).fetchone()
    return float(row["at"]) if row is not None else None
