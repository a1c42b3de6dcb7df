"""Refresh the ledger from Slurm and the runs' own files; follow logs (login node)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from hpc_llm.results import ledger
from hpc_llm.rundir.layout import RunDir
from hpc_llm.rundir.record import SETTLED, read_results
from hpc_llm.slurm import accounting, query


def refresh(limit: int | None = None) -> list[ledger.Run]:
    """Bring every live run of the ledger up to date: squeue for what is queued, the run's
    results.json, and Slurm accounting for jobs that left the queue (the only witness of a
    job that died before writing anything). What cannot be known now (squeue or sacct
    failed, sacct not caught up) is left as it was: never called finished."""
    runs = ledger.runs(limit)
    live = [r for r in runs if r.state not in ledger.ENDED_STATES]
    slurm_ids = [j for r in live if r.launcher == "slurm" for j in r.job_ids]
    states = query.job_states(slurm_ids) if slurm_ids else {}
    if states is None:
        # squeue failed: what the queue holds is unknown, and no run may be called finished
        live = [r for r in live if r.launcher != "slurm"]
        states = {}
    gone = [r.job_ids[-1] for r in live if r.launcher == "slurm" and r.job_ids and r.job_ids[-1] not in states]
    acct = accounting.attempts(gone) if gone else {}
    if gone and acct is None and not accounting.available():
        accounting.say_without_accounting()
    for r in live:
        results = read_results(r.run_dir)
        restarts = int(results.get("restarts", 0)) if results else r.restarts
        in_queue = [states[j] for j in r.job_ids if j in states]
        if in_queue:
            ledger.update(r, expect_state=r.state, state=in_queue[-1], restarts=restarts)
        elif results is not None and results.get("status") == "completed":
            ledger.update(r, state="COMPLETED", restarts=restarts, error=None)
        elif r.launcher == "slurm" and r.job_ids:
            # left the queue without completing: Slurm's verdict (CANCELLED, TIMEOUT, a node
            # failure) over the run's own "failed", which may only say it was killed
            _from_accounting(r, acct, restarts, results)
        elif results is not None:
            ledger.update(r, expect_state=r.state, state=str(results["status"]).upper(), restarts=restarts)
    return ledger.runs(limit)


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
    """The last lines of the job's batch log (<run dir>/logs/slurm-<job id>.out)."""
    path = RunDir(run_dir).batch_log(job_id)
    if not path.is_file():
        return ""
    text = path.read_text(errors="replace").strip().splitlines()
    return " | ".join(ln.strip() for ln in text[-lines:] if ln.strip())


def attempts_of(run: ledger.Run) -> list[dict[str, object]]:
    """Every attempt of a run: Slurm accounting's rows (state, reason, times, nodes, exit code,
    allocation) beside what the run recorded of each (cause, action, batches)."""
    from hpc_llm.rundir.record import Attempts

    recorded = Attempts.load(run.run_dir).items if Path(run.run_dir).is_dir() else []
    acct = accounting.attempts(run.job_ids) if run.launcher == "slurm" else {}
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
                    "cause": rec.cause if rec else None,
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
                    "cause": x.cause,
                    "batches": f"{x.resumed_at_batch}->{x.last_batch}",
                }
            )
    return rows


def runs_of(ref: str) -> list[ledger.Run]:
    """The runs a reference names: a sweep dir (every run under it), a run dir, a ledger id or a job id."""
    from hpc_llm.errors import ConfigError

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


def wait(runs: list[ledger.Run], poll_s: float = 5.0) -> list[ledger.Run]:
    """Until every run has ended: one live line each (state, batch/total, loss, tokens/s)."""
    from hpc_llm.results import console

    ids = {r.id for r in runs}
    current = {r.id: r for r in runs}

    def rows() -> list[tuple[str, Path, str | None]]:
        return [
            (
                f"run {r.id} (job {r.job_num})",
                Path(r.run_dir),
                r.state + (f", {r.restarts} restart(s)" if r.restarts else ""),
            )
            for r in sorted(current.values(), key=lambda r: r.id)
        ]

    with console.live_progress(rows):
        while True:
            current = {r.id: r for r in refresh() if r.id in ids}
            if all(finished(r) for r in current.values()):
                return sorted(current.values(), key=lambda r: r.id)
            time.sleep(poll_s)


def follow_log(run: ledger.Run, rank: int = 0, follow: bool = False, poll_s: float = 1.0) -> int:
    path = RunDir(run.run_dir).rank_log(rank)
    pos = 0
    while True:
        if path.exists():
            with path.open("rb") as f:
                f.seek(pos)
                chunk = f.read()
                pos = f.tell()
            if chunk:
                sys.stdout.buffer.write(chunk)
                sys.stdout.flush()
        elif not follow:
            print(f"no log yet: {path}", file=sys.stderr)
            return 1
        if not follow:
            return 0
        current = refresh()
        state = next((r.state for r in current if r.id == run.id), run.state)
        if state in ledger.ENDED_STATES or state == "ENDED":
            follow = False  # one more read picks up the tail
            continue
        time.sleep(poll_s)
