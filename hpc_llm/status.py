"""Refresh the ledger from Slurm and the runs' own files; follow logs (login node)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from hpc_llm import ledger
from hpc_llm.record import read_results
from hpc_llm.slurm import query


def refresh(limit: int | None = None) -> list[ledger.Run]:
    runs = ledger.runs(limit)
    live = [r for r in runs if r.state not in ledger.FINAL_STATES]
    slurm_ids = [j for r in live if r.launcher == "slurm" for j in r.job_ids]
    states = query.job_states(slurm_ids) if slurm_ids else {}
    if states is None:
        # squeue failed: what the queue holds is unknown, and no run may be called finished
        live = [r for r in live if r.launcher != "slurm"]
        states = {}
    for r in live:
        results = read_results(r.run_dir)
        restarts = int(results.get("restarts", 0)) if results else r.restarts
        in_queue = [states[j] for j in r.job_ids if j in states]
        if in_queue:
            ledger.update(r, state=in_queue[-1], restarts=restarts)
        elif results is not None:
            ledger.update(r, state=str(results["status"]).upper(), restarts=restarts, error=results.get("error"))
        elif r.launcher == "slurm":
            acct = query.accounting_states(r.job_ids)
            ledger.update(r, state=acct.get(r.job_ids[-1], "ENDED") if r.job_ids else "ENDED")
    return ledger.runs(limit)


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
    return run.state in ledger.FINAL_STATES or run.state == "ENDED"


def wait(runs: list[ledger.Run], poll_s: float = 5.0) -> list[ledger.Run]:
    """Until every run has ended: one live line each (state, batch/total, loss, tokens/s)."""
    from hpc_llm import console

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
    path = Path(run.run_dir) / "logs" / f"rank{rank}.log"
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
        if state in ledger.FINAL_STATES or state == "ENDED":
            follow = False  # one more read picks up the tail
            continue
        time.sleep(poll_s)
