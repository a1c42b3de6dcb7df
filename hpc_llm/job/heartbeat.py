"""Each rank's heartbeat: liveness and batch progress, read by the job's supervisor.

A daemon thread in every rank rewrites ``<run dir>/.hpc_llm/heartbeat/<rank>``
every ``fault.heartbeat_s`` seconds with one JSON line: a sequence number,
the last batch trained, the node and the pid. The training loop only updates
the batch in memory (:func:`progress`). A frozen process (SIGSTOP, a process
stuck in the kernel) stops writing, so the supervisor can name it; a rank
alive but stuck in a collective keeps writing the same batch, which shows as
no progress. The supervisor judges both by its own clock (when it last saw a
rank's sequence number or batch change), so clocks on different nodes never
need to agree. One small in-place write per rank per interval is all the
shared filesystem sees. Stdlib only: it runs before the training stack loads.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
from dataclasses import dataclass
from pathlib import Path

from hpc_llm.rundir.layout import RunDir

_state: dict[str, int | str] = {"batch": -1, "phase": "start"}
#: phases in which a rank is expected to finish batches (a stall is a hang only then)
TRAINING = "train"
#: the phases before training, in order (a rank's phase names where a start-up is stuck)
STARTUP_PHASES = {
    "start": "imports",
    "setup": "set-up (preflight, the run's record)",
    "data": "data preparation",
    "build": "model build and rendezvous",
}
_thread: threading.Thread | None = None


def heartbeat_dir(run_dir: Path | str) -> Path:
    return RunDir(run_dir).heartbeats


def node_name() -> str:
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


def progress(batch: int) -> None:
    """The batch this rank has just finished (cheap: memory only)."""
    _state["batch"] = int(batch)


def phase(name: str) -> None:
    """What the rank is doing: start, train, eval, post (after training)."""
    _state["phase"] = name


def current_batch() -> int:
    """The last batch this rank finished in this process (-1 before the first)."""
    return int(_state["batch"])


def start(run_dir: Path | str, rank: int, interval_s: float) -> None:
    """Start this rank's heartbeat thread (once per process)."""
    global _thread
    if _thread is not None:
        return
    path = RunDir(run_dir).heartbeat(rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    node, pid = node_name(), os.getpid()
    stop = threading.Event()

    def beat() -> None:
        seq = 0
        while not stop.is_set():
            seq += 1
            # a full or flaky filesystem must not kill training; the supervisor sees silence
            with contextlib.suppress(OSError):
                path.write_text(json.dumps({"seq": seq, **_state, "node": node, "pid": pid}) + "\n")
            stop.wait(interval_s)

    _thread = threading.Thread(target=beat, name="hpc_llm-heartbeat", daemon=True)
    _thread.start()


@dataclass(frozen=True)
class Beat:
    rank: int
    seq: int
    batch: int
    node: str
    pid: int
    phase: str = TRAINING


def read_all(run_dir: Path | str) -> dict[int, Beat]:
    """The latest heartbeat of every rank that has written one (a torn read is skipped)."""
    out: dict[int, Beat] = {}
    folder = heartbeat_dir(run_dir)
    if not folder.is_dir():
        return out
    for path in folder.iterdir():
        if not path.name.isdigit():
            continue
        try:
            data = json.loads(path.read_text())
            out[int(path.name)] = Beat(
                int(path.name),
                int(data["seq"]),
                int(data["batch"]),
                str(data["node"]),
                int(data["pid"]),
                str(data.get("phase", TRAINING)),
            )
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return out


def clear(run_dir: Path | str) -> None:
    """Forget the heartbeats of an earlier step (the supervisor, before it starts one)."""
    folder = heartbeat_dir(run_dir)
    if folder.is_dir():
        for path in folder.iterdir():
            path.unlink(missing_ok=True)
