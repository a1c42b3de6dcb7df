"""Each rank's heartbeat: liveness and batch progress, read by the job's supervisor.

A daemon thread in every rank rewrites its own slot of its node's heartbeat
file, ``<run dir>/.hpc_llm/heartbeat/<node>``, every ``fault.heartbeat_s``
seconds: one JSON line (global rank, a sequence number, the last batch
trained, the phase, the node, the pid) padded with spaces to :data:`SLOT`
bytes, at ``local rank * SLOT``. The training loop only updates the batch in
memory (:func:`progress`). A frozen process (SIGSTOP, a process stuck in the
kernel) stops writing, so the supervisor can name it; a rank alive but stuck
in a collective keeps writing the same batch, which shows as no progress. The
supervisor judges both by its own clock (:mod:`hpc_llm.job.supervisor.hang_watch`), so
clocks on different nodes never need to agree.

Why one file per node, opened once: at 64 nodes x 8 ranks for weeks, a file
per rank reopened on every beat and read back one by one is hundreds of
opens a period on the shared filesystem's metadata server. Here each rank
opens its node's file once per process and only ``pwrite``\\ s its slot after
that (no open, no truncate, no rename), and the supervisor opens one file per
node, at most once a period (:func:`read_all`). Ranks never share a slot, so
they need no lock; a read that catches a slot mid-write sees a torn slot and
skips it, as it skips empty or unparsable ones. A full or flaky filesystem
must not kill training: a failed write is dropped (the supervisor sees
silence) and a failed open is tried again next period. Stdlib only: it runs
before the training stack loads, and in the supervisor on the batch host.
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
#: bytes per rank in a node's file: eight ranks fill one 4 KiB page; room for a 253-byte host name
SLOT = 512
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


@dataclass(frozen=True)
class Beat:
    rank: int
    seq: int
    batch: int
    node: str
    pid: int
    phase: str = TRAINING


def encode(beat: Beat) -> bytes:
    """A beat as its slot: a JSON line padded with spaces to exactly SLOT bytes."""
    fields = {"rank": beat.rank, "seq": beat.seq, "batch": beat.batch, "phase": beat.phase}
    line = json.dumps({**fields, "node": beat.node, "pid": beat.pid}).encode()
    if len(line) >= SLOT:
        # the file's name says the node too: a name too long for the slot is left to it
        line = json.dumps({**fields, "pid": beat.pid}).encode()
    return line.ljust(SLOT - 1) + b"\n"


def decode(slot: bytes, node: str) -> Beat | None:
    """The beat in one slot of ``node``'s file; None for an empty, torn or unparsable slot."""
    if len(slot) != SLOT or not slot.endswith(b"\n"):
        return None
    try:
        data = json.loads(slot)
        return Beat(
            int(data["rank"]),
            int(data["seq"]),
            int(data["batch"]),
            str(data.get("node") or node),
            int(data["pid"]),
            str(data.get("phase", TRAINING)),
        )
    except (ValueError, KeyError, TypeError):
        return None


class Writer:
    """One rank's slot in its node's heartbeat file: opened once, then rewritten in place."""

    def __init__(self, run_dir: Path | str, node: str, local_rank: int, rank: int, pid: int | None = None) -> None:
        self.path = RunDir(run_dir).heartbeat_of_node(node)
        self.offset = local_rank * SLOT
        self.node, self.rank = node, rank
        self.pid = os.getpid() if pid is None else pid
        self.seq = 0
        self._fd: int | None = None

    def write(self, batch: int, phase: str) -> None:
        self.seq += 1
        slot = encode(Beat(self.rank, self.seq, batch, self.node, self.pid, phase))
        # a full or flaky filesystem must not kill training; the supervisor sees silence
        with contextlib.suppress(OSError):
            if self._fd is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                # no O_TRUNC: the other ranks of this node keep their slots
                self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                os.pwrite(self._fd, slot, self.offset)
            except OSError:
                # a stale handle (NFS) stays stale: open again next period
                self.close()
                raise

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)


def start(run_dir: Path | str, rank: int, local_rank: int, interval_s: float) -> None:
    """Start this rank's heartbeat thread (once per process)."""
    global _thread
    if _thread is not None:
        return
    writer = Writer(run_dir, node_name(), local_rank, rank)
    stop = threading.Event()

    def beat() -> None:
        while not stop.is_set():
            writer.write(int(_state["batch"]), str(_state["phase"]))
            stop.wait(interval_s)

    _thread = threading.Thread(target=beat, name="hpc_llm-heartbeat", daemon=True)
    _thread.start()


def read_all(run_dir: Path | str) -> dict[int, Beat]:
    """The latest heartbeat of every rank that has written one, by global rank: one open per
    node's file (a torn, empty or unparsable slot is skipped)."""
    out: dict[int, Beat] = {}
    try:
        entries = list(os.scandir(heartbeat_dir(run_dir)))
    except OSError:
        return out
    for entry in entries:
        try:
            with open(entry.path, "rb") as f:
                data = f.read()
        except OSError:
            continue
        for offset in range(0, len(data), SLOT):
            beat = decode(data[offset : offset + SLOT], entry.name)
            if beat is not None:
                out[beat.rank] = beat
    return out


def clear(run_dir: Path | str) -> None:
    """Forget the heartbeats of an earlier step (the supervisor, before it starts one)."""
    folder = heartbeat_dir(run_dir)
    if folder.is_dir():
        for path in folder.iterdir():
            path.unlink(missing_ok=True)
