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
