"""One truth for a run's state (login node): its own record for what is final, Slurm for
what is live.

A run's record (results.json and its attempts, :mod:`hpc_llm.rundir.record`) is written by
the job itself: once it says completed or failed, with so many restarts and why, that is
final whatever Slurm can or cannot say. Slurm says what is queued or running now, and how a
job that left the queue without a word ended. The ledger caches both. ``status``, ``wait``
and ``logs`` show a run as its record tells it where the record is final, else as Slurm
answers, else as the ledger last saw it, and then say in one line that Slurm could not be
asked and when it last answered.
"""

from __future__ import annotations

import re
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from hpc_llm.errors import ConfigError
from hpc_llm.results import ledger
from hpc_llm.results.failure import one_prefix
from hpc_llm.rundir.layout import RunDir
from hpc_llm.rundir.record import SETTLED, read_results
from hpc_llm.slurm import accounting, commands, query

#: the ledger's name for Slurm's answers ("last seen")
SLURM = "slurm"
#: Slurm's verdicts on a job that ended without completing: more telling than the record's "failed"
SLURM_VERDICTS = ledger.ENDED_STATES - {"COMPLETED", "DRY_RUN"}
#: states of a job Slurm still holds (squeue's, and HELD for a held pending one: hpc_llm.slurm.parse.held)
QUEUED = frozenset(
    {"PENDING", "HELD", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED"}
    | {"RESIZING", "SIGNALING", "STAGE_OUT", "SUSPENDED"}
)
#: what a reference to a Slurm job looks like (an array task: <array>_<task>)
JOB_ID = re.compile(r"\d+(_\d+)?")


def when(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(ts))


@dataclass
class Snapshot:
    """Runs as they stand now, and whether Slurm could be asked about them."""

    runs: list[ledger.Run]
    #: why Slurm could not be asked (None: it answered, or nothing needed asking)
    unreachable: str | None = None
    #: when Slurm last answered this ledger
    last_seen: float | None = None

    def slurm_line(self, meaning: str) -> str | None:
        """One line saying Slurm could not be asked, and what is shown instead (``meaning``)."""
        if self.unreachable is None:
            return None
        seen = when(self.last_seen) if self.last_seen else "never"
        return f"Slurm unreachable; last seen {seen} ({self.unreachable}): {meaning}"


def record_of(run_dir: str | Path) -> dict[str, Any] | None:
    """The run's results.json; None before it has one (or when it cannot be read: a person may
    have edited it, and status must still show the rest)."""
    try:
        return read_results(run_dir)
    except (OSError, ValueError):
        return None


def is_final(results: dict[str, Any] | None) -> bool:
    return results is not None and str(results.get("status")) in SETTLED


def is_completed(results: dict[str, Any] | None) -> bool:
    return results is not None and results.get("status") == "completed"


def as_recorded(run: ledger.Run, results: dict[str, Any] | None) -> ledger.Run:
    """The run as its record tells it: state, error and restarts once the record is final. A
    "failed" record keeps Slurm's verdict where the ledger has one (CANCELLED, TIMEOUT...); a
    record still in flight may not have heard of a requeue sacct has seen."""
    if results is None:
        return run
    if run.state in QUEUED:
        # Slurm still holds the job (queued, held, running: requeued by Slurm while the record
        # said failed): no record of it is final yet, and the run is what Slurm says
        return run
    changes: dict[str, Any] = {}
    if results.get("restarts") is not None:
        recorded = int(results["restarts"])
        changes["restarts"] = recorded if is_final(results) else max(recorded, run.restarts)
    if not run.job_ids and results.get("slurm_job_ids"):
        changes["job_ids"] = [str(j) for j in results["slurm_job_ids"]]
    status = str(results.get("status"))
    if status == "completed":
        changes.update(state="COMPLETED", error=None)
    elif status in SETTLED:
        changes.update(
            state=run.state if run.state in SLURM_VERDICTS else status.upper(),
            error=run.error or results.get("error"),
        )
    return replace(run, **changes)


def refresh(limit: int | None = None, ids: set[int] | None = None) -> Snapshot:
    """Bring the ledger's runs (the last ``limit``, or those of ``ids``) up to date: each run's
    record first, then squeue for what is queued, and Slurm accounting for jobs that left the
    queue without a final record (the only witness of a job that died before writing
    anything). What cannot be known now (squeue or sacct failed, sacct not caught up) is left
    as it was, never called finished, and a failed squeue is named in the snapshot."""
    runs = _runs(limit, ids)
    records = {r.id: record_of(r.run_dir) for r in runs}
    live = [r for r in runs if r.state not in ledger.ENDED_STATES]
    slurm_ids = [j for r in live if r.launcher == "slurm" for j in r.job_ids]
    states: dict[str, str] | None = {}
    reasons: dict[str, str] = {}
    unreachable = None
    if slurm_ids:
        try:
            queued = query.queue_reasons(slurm_ids)
        except commands.SlurmUnreachable as exc:
            states, unreachable = None, commands.unreachable_why(exc)
        else:
            ledger.seen(SLURM)
            states = {j: state for j, (state, _why) in queued.items()}
            reasons = {j: why for j, (state, why) in queued.items() if state == "HELD"}
    gone = [
        r.job_ids[-1]
        for r in live
        if states is not None
        and r.launcher == "slurm"
        and r.job_ids
        and r.job_ids[-1] not in states
        and not is_completed(records[r.id])
    ]
    acct = accounting.attempts(gone) if gone else {}
    if gone and acct is None and not accounting.available():
        accounting.say_without_accounting()
    for r in runs:
        _settle(r, records[r.id], states, acct, reasons)
    return Snapshot(
        [as_recorded(r, records.get(r.id)) for r in _runs(limit, ids)],
        unreachable,
        ledger.last_seen(SLURM) if unreachable else None,
    )


def _runs(limit: int | None, ids: set[int] | None) -> list[ledger.Run]:
    if ids is None:
        return ledger.runs(limit)
    return [r for r in ledger.runs() if r.id in ids]


def _settle(
    r: ledger.Run,
    results: dict[str, Any] | None,
    states: dict[str, str] | None,
    acct: dict[str, list[accounting.AttemptRow]] | None,
    held: dict[str, str] | None = None,
) -> None:
    """Write what is now known of one run into the ledger (``states``: None when squeue failed;
    ``held``: Slurm's reason for each held job)."""
    restarts = int(results.get("restarts") or 0) if results else r.restarts
    if r.state in ledger.ENDED_STATES:
        # ended before its record had its last word (a launcher's wait, a TIMEOUT later requeued)
        if is_completed(results) and r.state != "COMPLETED":
            ledger.update(r, state="COMPLETED", restarts=restarts, error=None)
        elif restarts != r.restarts:
            ledger.update(r, restarts=restarts)
        return
    if is_completed(results):
        ledger.update(r, state="COMPLETED", restarts=restarts, error=None)  # final, whatever Slurm says
    elif r.launcher == "slurm" and r.job_ids:
        if states is None:  # Slurm could not be asked: the state stays as last seen
            if restarts != r.restarts:
                ledger.update(r, restarts=restarts)
            return
        in_queue = [j for j in r.job_ids if j in states]
        if in_queue:
            job = in_queue[-1]
            why = (held or {}).get(job)
            extra = {"error": f"held by Slurm ({why}): it starts only once released (scontrol release {job})"}
            ledger.update(r, expect_state=r.state, state=states[job], restarts=restarts, **(extra if why else {}))
        else:
            # left the queue without completing: Slurm's verdict (CANCELLED, TIMEOUT, a node
            # failure) over the run's own "failed", which may only say it was killed
            _from_accounting(r, acct, restarts, results)
    elif results is not None:
        ledger.update(r, expect_state=r.state, state=str(results["status"]).upper(), restarts=restarts)


def _from_accounting(
    r: ledger.Run,
    acct: dict[str, list[accounting.AttemptRow]] | None,
    restarts: int,
    results: dict[str, object] | None,
) -> None:
    """A job that left the queue without completing: sacct says how it ended."""
    rows = (acct or {}).get(r.job_ids[-1])
    if not rows or rows[-1].state not in accounting.ENDED:
        if results is not None and str(results.get("status")) in SETTLED:
            ledger.update(r, state=str(results["status"]).upper(), restarts=restarts, error=results.get("error"))
        elif acct is None and not accounting.available():  # no witness at all: it ended, how is unknown
            ledger.update(r, expect_state=r.state, state="ENDED", restarts=restarts)
        return  # sacct failed or not caught up: unknown for now, asked again next time
    last = rows[-1]
    state = last.state if last.state in ledger.ENDED_STATES else "FAILED"  # NODE_FAIL, OUT_OF_MEMORY, ...
    why = last.verdict
    own = results.get("error") if results else None
    tail = "" if own else batch_log_tail(r.run_dir, r.job_ids[-1])
    ledger.update(
        r,
        expect_state=r.state,
        state=state,
        restarts=max(restarts, len(rows) - 1),
        error=why + (f"; {own}" if own else "") + (f"; batch log: {tail}" if tail else ""),
    )


def batch_log_tail(run_dir: str, job_id: str, lines: int = 3) -> str:
    """The last lines of the job's last batch log (its last attempt's, else Slurm's own file)."""
    rd = RunDir(run_dir)
    path = ([p for p in rd.attempt_logs(job_id) if p.stat().st_size] or [rd.batch_log(job_id)])[-1]
    if not path.is_file():
        return ""
    text = path.read_text(errors="replace").strip().splitlines()
    return " | ".join(ln.strip() for ln in text[-lines:] if ln.strip())


def attempts_of(run: ledger.Run, ask_slurm: bool = True) -> list[dict[str, object]]:
    """Every attempt of a run: Slurm accounting's rows (state, reason, times, nodes, exit code,
    allocation) beside what the run recorded of each (cause, action, batches); only the record's
    when Slurm is not to be asked (it did not answer a moment ago: sacct would retry for seconds)."""
    from hpc_llm.rundir.record import Attempts

    recorded = Attempts.load(run.run_dir).items if Path(run.run_dir).is_dir() else []
    acct = accounting.attempts(run.job_ids) if run.launcher == "slurm" and ask_slurm else {}
    rows: list[dict[str, object]] = []
    for jid in run.job_ids:
        for i, a in enumerate((acct or {}).get(jid, [])):
            # one job per run (a requeue keeps the id; SLURM_RESTART_COUNT numbers its attempts);
            # an array task records its own numeric SLURM_JOB_ID, not <array>_<task>
            mine = recorded if len(run.job_ids) == 1 else [x for x in recorded if str(x.job_id) == jid]
            same = [x for x in mine if x.restart == i]
            rec = same[-1] if same else None
            rows.append(
                {
                    "job": jid,
                    "attempt": i + 1,
                    "slurm state": a.state,
                    "reason": a.reason,
                    "queued (s)": round(a.queue_wait_s) if a.queue_wait_s is not None else None,
                    "elapsed (s)": a.elapsed_s,
                    "nodes": a.nodelist,
                    "exit": a.exit_code,
                    "alloc": ",".join(f"{k}={v}" for k, v in a.tres.items() if k in ("node", "cpu", "gres/gpu")),
                    "cause": (rec.cause or short(rec.error)) if rec else None,
                    "batches": (f"{rec.resumed_at_batch}->{rec.last_batch}" if rec else None),
                }
            )
    if not rows:  # no accounting: what the run recorded
        for i, x in enumerate(recorded):
            rows.append(
                {
                    "job": x.job_id,
                    "attempt": i + 1,
                    "slurm state": None,
                    "state": x.state,
                    "cause": x.cause or short(x.error),
                    "batches": f"{x.resumed_at_batch}->{x.last_batch}",
                }
            )
    return rows


def short(error: str | None, width: int = 80) -> str | None:
    """An error as a table cell: its first line, cut to ``width``."""
    if not error:
        return None
    line = " ".join(str(error).split())
    return line if len(line) <= width else line[: width - 3] + "..."


def runs_of(ref: str) -> list[ledger.Run]:
    """The runs a reference names: a sweep dir (every run under it), a run dir, a ledger id or a job id."""
    path = Path(ref).expanduser()
    if path.is_dir():
        root = str(path.resolve())
        found = [
            r for r in ledger.runs() if r.sweep_dir == root or r.run_dir == root or r.run_dir.startswith(root + "/")
        ]
        if found:
            return found
    run = ledger.find(ref)
    if run is None:
        raise ConfigError(f"no run or sweep '{ref}' in the ledger ({ledger.ledger_path()}); see `hpc-llm status`")
    return [run]


def counts(runs: list[ledger.Run]) -> str:
    """'95 COMPLETED, 3 RUNNING, 2 FAILED' (most first)."""
    tally: dict[str, int] = {}
    for r in runs:
        tally[r.state] = tally.get(r.state, 0) + 1
    return ", ".join(f"{n} {state}" for state, n in sorted(tally.items(), key=lambda kv: (-kv[1], kv[0])))


def finished(run: ledger.Run) -> bool:
    return run.state in ledger.ENDED_STATES or run.state == "ENDED"


def causes(run: ledger.Run) -> str:
    """Why the run restarted, from its record: 'time_limit 2, preemption 1' ('' if it never did)."""
    by_cause = (record_of(run.run_dir) or {}).get("restarts_by_cause") or {}
    return ", ".join(f"{c} {n}" for c, n in sorted(by_cause.items(), key=lambda kv: (-int(kv[1]), kv[0])))


#: what status shows when Slurm could not be asked
SHOWN_WITHOUT_SLURM = "final states and restarts are the runs' own records, live ones as last seen"
#: what wait does when Slurm could not be asked
WAITING_WITHOUT_SLURM = "waiting on the runs' own records (results.json) alone"
#: what logs -f does when Slurm could not be asked
FOLLOWING_WITHOUT_SLURM = "following until the run's own record (results.json) is final"


def wait(runs: list[ledger.Run], poll_s: float = 5.0, plain_every_s: float = 30.0) -> list[ledger.Run]:
    """Until every run has ended (its record is final, or Slurm says how it ended): one line each
    (state, batch/total, loss, tokens/s), live on a terminal, every ``plain_every_s`` at most
    elsewhere; one more line whenever Slurm stops answering, since only the records count then."""
    from hpc_llm.results import console

    ids = {r.id for r in runs}
    snap = refresh(ids=ids)

    def rows() -> list[tuple[str, Path, str | None]]:
        return [
            (
                f"run {r.id} (job {r.job_num})",
                Path(r.run_dir),
                r.state + (f", {r.restarts} restart(s)" if r.restarts else ""),
            )
            for r in snap.runs
        ]

    said = False
    with console.live_progress(rows, plain_every_s=plain_every_s) as say:
        while not all(finished(r) for r in snap.runs):
            line = snap.slurm_line(WAITING_WITHOUT_SLURM)
            if line and not said:
                say(line)
            said = line is not None
            time.sleep(poll_s)
            snap = refresh(ids=ids)
    return snap.runs


@dataclass(frozen=True)
class LogSource:
    """Where ``hpc-llm logs`` reads: a run dir, its ledger entry if it has one, its Slurm job ids."""

    run_dir: Path
    run: ledger.Run | None = None
    job_ids: tuple[str, ...] = ()

    def ended(self) -> tuple[bool, str | None]:
        """Whether the run is over (by the ledger refreshed, else by its record or squeue), and
        the line to say when Slurm could not be asked."""
        if self.run is not None:
            snap = refresh(ids={self.run.id})
            return all(finished(r) for r in snap.runs), snap.slurm_line(FOLLOWING_WITHOUT_SLURM)
        if is_final(record_of(self.run_dir)):
            return True, None
        try:
            return bool(self.job_ids) and not query.queue(list(self.job_ids)), None
        except commands.SlurmUnreachable as exc:  # unknown: keep following
            snap = Snapshot([], commands.unreachable_why(exc), ledger.last_seen(SLURM))
            return False, snap.slurm_line(FOLLOWING_WITHOUT_SLURM)


def _looks_like_run_dir(path: Path) -> bool:
    rd = RunDir(path)
    return rd.logs.is_dir() or rd.results.is_file() or rd.attempts.is_file()


def log_source(ref: str) -> LogSource:
    """What ``ref`` names for ``hpc-llm logs``: a run dir (in the ledger or not), a ledger id or
    job id of the ledger, or a Slurm job id the ledger has never seen (Slurm says where it ran)."""
    path = Path(ref).expanduser()
    if path.is_dir() and _looks_like_run_dir(path):
        root = path.resolve()
        run = next((r for r in ledger.runs() if r.run_dir == str(root)), None)
        return LogSource(root, run, tuple(run.job_ids) if run else ())
    run = ledger.find(ref)
    if run is not None:
        return LogSource(Path(run.run_dir), run, tuple(run.job_ids))
    if path.is_dir():
        return LogSource(path.resolve())  # a run dir with no logs yet: "no log yet" names the file
    if JOB_ID.fullmatch(ref):
        return LogSource(run_dir_of_job(ref), None, (ref,))
    raise ConfigError(
        f"no run '{ref}' in the ledger ({ledger.ledger_path()}), and it is neither a directory nor a Slurm "
        "job id; allowed: a run dir, a ledger id, a Slurm job id"
    )


def run_dir_of_job(job_id: str) -> Path:
    """The run dir of a Slurm job the ledger has never seen, from what Slurm says of the job
    (``scontrol show job``'s StdOut, Command and WorkDir, else sacct's WorkDir)."""
    why = None
    try:
        fields = query.show_job(job_id)
    except commands.SlurmUnreachable as exc:
        fields, why = None, commands.unreachable_why(exc)
    refs = [job_id]
    if fields:
        places = [fields.get(k) for k in ("StdOut", "StdErr", "Command", "WorkDir")]
        if fields.get("ArrayJobId") and fields.get("ArrayTaskId"):  # a task's batch log has <array>_<task>
            refs.append(f"{fields['ArrayJobId']}_{fields['ArrayTaskId']}")
    else:
        places = [accounting.work_dir(job_id)]
    found = run_dir_among(refs, [Path(p) for p in places if p and p != "(null)"])
    if found is not None:
        return found
    if why is not None:
        raise ConfigError(
            f"job {job_id} is not in the ledger ({ledger.ledger_path()}) and Slurm is unreachable ({why}); "
            f"give its run dir instead: hpc-llm logs <run dir>"
        )
    if fields is None and not any(places):
        raise ConfigError(f"neither the ledger nor Slurm knows job {job_id}; give its run dir: hpc-llm logs <run dir>")
    raise ConfigError(
        f"job {job_id} is not in the ledger and no run dir of it is where Slurm says it ran "
        f"({', '.join(str(p) for p in places if p)}); give its run dir: hpc-llm logs <run dir>"
    )


def run_dir_among(refs: list[str], places: list[Path], up: int = 3) -> Path | None:
    """The run dir whose batch log belongs to one of ``refs``: one of ``places`` (a batch log, a
    script, a directory), one of their ``up`` parents, or a run dir inside those (an array task's
    StdOut lies in its sweep dir; its run dir's batch log is the task's own)."""
    for place in places:
        for d in [place, *list(place.parents)[:up]]:
            for c in [d, *_subdirs(d)]:
                logs = [log for ref in refs for log in (RunDir(c).batch_log(ref), *RunDir(c).attempt_logs(ref))]
                if any(log == place or log.is_file() for log in logs):
                    return c
    return None


def _subdirs(d: Path) -> list[Path]:
    try:
        return sorted(c for c in d.iterdir() if c.is_dir())
    except OSError:  # not a directory, or not ours to read
        return []


def follow_log(source: LogSource, rank: int = 0, follow: bool = False, poll_s: float = 1.0) -> int:
    """Print a rank's log of the run; with ``follow``, what is added until the run is over."""
    path = RunDir(source.run_dir).rank_log(rank)
    pos = 0
    said = False
    while True:
        if path.exists():
            with path.open("rb") as f:
                f.seek(pos)
                chunk = f.read()
                pos = f.tell()
            if chunk:
                # whole lines only (the rest waits for the next read), each rank prefix once
                cut = chunk.rfind(b"\n") + 1 if follow else len(chunk)
                pos -= len(chunk) - cut
                sys.stdout.buffer.write(one_prefix(chunk[:cut].decode(errors="replace")).encode())
                sys.stdout.flush()
        elif not follow:
            print(f"no log yet: {path}", file=sys.stderr)
            return 1
        if not follow:
            return 0
        over, line = source.ended()
        if line and not said:
            print(line, file=sys.stderr)
        said = line is not None
        if over:
            follow = False  # one more read picks up the tail
            continue
        time.sleep(poll_s)
