"""What a seed's run must have kept, whatever its faults: the checker, after Jepsen.

After each seed, :func:`violations` reads what happened (the history of Slurm mutations and
record writes, Slurm's own state, the run's record, the trace) and names every promise broken:

a. **only the holder acted**: every Slurm mutation and every write of the run's record came
   from a process with the right to it at that moment (its allocation the job's current one,
   no supervisor having taken over from it, its generation the live one);
b. **the record never contradicts Slurm**: never ``completed`` for a run that did not finish,
   never ``failed`` while Slurm went on running the job, and at the end the record's state and
   Slurm's agree;
c. **no healthy node blamed**: no node that no fault touched is in any attempt's suspects, left
   out of the job, excluded from it or given back;
d. **the run completed**, or ended with a cause Slurm agrees with, when enough nodes were left
   to run it;
e. **no job ended where it could have gone on** (FAILED, CANCELLED unfinished);
f. **a RUNNING job always has an owner**: never more than :data:`ORPHAN_BOUND_S` RUNNING with no
   supervisor or agent of its current allocation alive;

and no thread of the control plane crashed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hpc_llm.rundir.layout import RunDir

#: the simulation judged (hpc_llm.sim.run.Sim, which imports this module)
Sim = Any

#: a RUNNING job with nothing of its run alive is ended by then (Slurm's own verdict on a lost
#: host, the agents' patience, a requeue's wait)
ORPHAN_BOUND_S = 240.0


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def violations(sim: Sim) -> list[str]:
    out: list[str] = []
    h = sim.history
    job = sim.job
    s = sim.scenario
    rd = RunDir(sim.run_dir)
    results = read_json(rd.results) or {}
    attempts = read_json(rd.attempts) or []
    status = results.get("status")
    # crashes
    for t, who, tb in h.crashes:
        out.append(f"crash at {t:.1f}s in {who}: {tb.strip().splitlines()[-1]}")
    # (a) only the holder acted
    for m in h.mutations:
        if m.stale:
            out.append(f"(a) {m.proc} did '{m.what}' at {m.t:.1f}s with no right to: {m.stale}")
    # (b) the record never contradicts Slurm
    final = job.state if job is not None else None
    ended = final in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL")
    trained = results.get("batches_done")
    if status == "completed" and trained is not None and trained < s.max_batches:
        out.append(f"(b) results.json says completed after {trained} of {s.max_batches} batches")
    if ended and final == "FAILED" and status not in ("failed",):
        out.append(f"(b) Slurm ended the job FAILED; results.json says {status}")
    if ended and final == "COMPLETED" and status != "completed":
        out.append(f"(b) Slurm ended the job COMPLETED; results.json says {status}")
    if not ended and status in ("completed", "failed"):
        out.append(f"(b) results.json says {status} while Slurm still holds the job ({final})")
    for i, (t, st, who) in enumerate(h.statuses):
        later = [x for x in h.statuses[i + 1 :] if x[1] not in ("failed",)]
        if st == "failed" and later:
            went_on = f"{later[0][1]} at {later[0][0]:.1f}s"
            out.append(f"(b) results.json said failed at {t:.1f}s ({who}) and the run went on ({went_on})")
            break
    # (c) no healthy node blamed or left out
    healthy = {n for n in sim.slurm.nodes if n not in sim.touched}
    for a in attempts:
        for key in ("suspects", "left_out", "given_back"):
            bad = sorted(set(a.get(key) or []) & healthy)
            if bad:
                which = f"attempt {a.get('restart')}.{a.get('generation')}"
                out.append(f"(c) {which} {key} healthy node(s) {','.join(bad)}: {a.get('error')}")
    if job is not None:
        bad = sorted(set(job.exc) & healthy)
        if bad:
            out.append(f"(c) the job excludes healthy node(s) {','.join(bad)}")
    # (d) and (e): the run completed, where it could
    lost_for_good = sim.lost_for_good
    left = len(sim.slurm.nodes) - len(lost_for_good)
    could = left >= (s.min_nodes or s.nodes)
    if job is not None and job.state == "PENDING" and job.num_nodes > left:
        # Slurm requeued the job itself (a node failure, a rebooted batch host) at the size it was
        # submitted with, which the nodes left cannot hold: it waits for resources, as Slurm says
        # (Reason=Resources); no process of hpc_llm is left to resize it (docs/design/simulation.md).
        # Or hpc_llm requeued it and a node was lost for good after. Not when hpc_llm requeued it
        # for more nodes than were left then: sized for nodes it had found gone, it pends for good
        # by hpc_llm's doing (the simulator's seeds 1308, 3507, 4828)
        could = could and job.alive_at_requeue is not None and job.num_nodes > job.alive_at_requeue
    if could and status != "completed":
        out.append(f"(d) the run did not complete (results.json: {status}, Slurm: {final}) with {left} node(s) left")
    if could and final in ("FAILED", "CANCELLED", "NODE_FAIL", "TIMEOUT") and status != "completed":
        out.append(f"(e) Slurm ended the job {final} where it could have gone on")
    # (f) a RUNNING job always has an owner
    if h.orphaned_for > ORPHAN_BOUND_S or (h.orphaned_since is not None and final == "RUNNING"):
        out.append(f"(f) the job was RUNNING with no supervisor or agent of it alive for {h.orphaned_for:.0f}s")
    return out
