"""Each rank's heartbeat: liveness and batch progress, read by its node's agent.

Three hops, each as cheap as it can be:

1. **rank -> agent, shared memory.** The node's agent (:mod:`hpc_llm.job.agent`)
   maps a :class:`Board` (anonymous shared memory) before it forks the ranks of
   a generation; each rank's heartbeat thread rewrites its own slot every
   ``fault.heartbeat_s`` (a sequence number, the last batch trained, the phase,
   its pid and generation) and the training loop only updates the batch in
   memory (:func:`progress`). No file, no syscall: a rank beats every second
   for free. A frozen process (SIGSTOP, stuck in the kernel) stops beating; a
   rank alive but stuck in a collective keeps beating the same batch.
2. **agent -> supervisor, the network** (:mod:`hpc_llm.job.wire`): every period
   the agent sends its ranks' beats with its own; the supervisor judges them by
   its own clock (:mod:`hpc_llm.job.supervisor.hang_watch`), so clocks on
   different nodes never need to agree.
3. **for people and tests, a file per node**: the agent also writes its ranks'
   beats to ``<run dir>/.hpc_llm/heartbeat/<node>`` (one JSON line per rank,
   padded to :data:`SLOT` bytes at ``local rank * SLOT``), opened once and
   rewritten in place (:class:`Writer`): one ``pwrite`` per rank per period on
   the shared filesystem, never an open, a truncate or a rename. Nothing
   decides on it.

The board also carries the agent's **fence** for the generation it runs (the
live generation and the lease the supervisor last renewed): a rank of an
ended generation finds out from it (:mod:`hpc_llm.job.rank.fence`).

Stdlib only: it runs before the training stack loads, and in the agent.
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import struct
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from hpc_llm import world
from hpc_llm.rundir.layout import RunDir

_state: dict[str, int | str] = {"batch": -1, "phase": "start", "asides": 0, "win": -1, "busy_us": -1, "wall_us": -1}
#: phases in which a rank is expected to finish batches (a stall is a hang only then)
TRAINING = "train"
#: the phases before training, in order (a rank's phase names where a start-up is stuck)
STARTUP_PHASES = {
    "start": "imports",
    "setup": "set-up (preflight, the run's record)",
    "data": "data preparation",
    "build": "model build and rendezvous",
}
#: phases of storage I/O (a checkpoint save, an upload): a stall there is the storage's, not a node's
STORAGE_PHASES = ("save", "upload")
#: bytes per rank in a node's file: eight ranks fill one 4 KiB page; room for a 253-byte host name
SLOT = 512
_thread: threading.Thread | None = None


def heartbeat_dir(run_dir: Path | str) -> Path:
    return RunDir(run_dir).heartbeats


def node_name() -> str:
    return world.environ().get("SLURMD_NODENAME") or world.hostname()


def progress(batch: int) -> None:
    """The batch this rank has just finished (cheap: memory only)."""
    _state["batch"] = int(batch)


def phase(name: str) -> None:
    """What the rank is doing: start, setup, data, build, train, eval, save, upload, post."""
    _state["phase"] = name
    if name != TRAINING:
        _state["asides"] = int(_state["asides"]) + 1


def asides() -> int:
    """How many times this rank has left training for another phase (an eval, a save): a batch's
    time that spans a change of it is not a training batch's (hpc_llm.job.rank.straggler)."""
    return int(_state["asides"])


def pace(window: int, busy_s: float, wall_s: float) -> None:
    """This rank's figures for its straggler window ``window`` (:mod:`hpc_llm.job.rank.straggler`):
    the median seconds per batch it was busy (not waiting inside a collective), and the median
    seconds per batch. Cheap: memory only; the heartbeat thread carries them."""
    _state["busy_us"], _state["wall_us"] = round(busy_s * 1e6), round(wall_s * 1e6)
    _state["win"] = int(window)  # last: a reader of win sees its figures (one process, the GIL)


def current_batch() -> int:
    """The last batch this rank finished in this process (-1 before the first)."""
    return int(_state["batch"])


def current_phase() -> str:
    return str(_state["phase"])


@dataclass(frozen=True)
class Beat:
    rank: int
    seq: int
    batch: int
    node: str
    pid: int
    phase: str = TRAINING
    #: the generation the rank belongs to (-1: unknown)
    gen: int = -1
    #: the rank's last straggler window (-1: none yet) and its median busy and batch seconds
    win: int = -1
    busy_s: float = -1.0
    wall_s: float = -1.0


# -- the node's shared-memory board: rank slots and the agent's fence ---------------------

#: header: live generation (int64), lease deadline on this node's monotonic clock (float64)
_HEADER = struct.Struct("<qd")
_HEADER_SIZE = 64
#: slot: version (seqlock: odd while written), generation, rank, seq, batch, pid, straggler
#: window, busy and batch microseconds (hpc_llm.job.rank.straggler), phase
_SLOT = struct.Struct("<qqqqqqqqq16s")
_SLOT_SIZE = 128
#: the fence's "no generation is live" value
NO_GENERATION = -1


#: where a rank's spawned children find its board: "<path>:<slot>:<generation>"
BOARD_ENV = "HPC_LLM_BOARD"


#: an agent's board file is ``<dir>/hpc_llm-board-<agent pid>`` (hpc_llm.job.agent.loop.board_file)
BOARD_PREFIX = "hpc_llm-board-"


def remove_stale_boards(directory: Path) -> list[Path]:
    """Remove the board files in ``directory`` whose agent is gone; the files removed.

    An agent removes its board when it ends, but one killed by SIGKILL (srun's abort after
    KillWait, a cancel, the kill of a test's node) leaves it in /dev/shm, memory the node keeps
    until a reboot: the dev machine had 35 after two days of tests. A board is its agent's
    while the process of that pid maps it (its ranks map it too, but die with it); a pid
    reused by another process does not. Another user's agent cannot be read: kept."""
    removed: list[Path] = []
    for path in sorted(directory.glob(BOARD_PREFIX + "*")):
        pid = path.name[len(BOARD_PREFIX) :]
        if not pid.isdigit():
            continue
        try:
            maps = Path(f"/proc/{pid}/maps").read_text(errors="replace")
        except FileNotFoundError:
            maps = ""  # no such process
        except OSError:
            continue  # not ours to judge
        if str(path) in maps:
            continue
        with contextlib.suppress(FileNotFoundError, PermissionError):
            path.unlink()
            removed.append(path)
    return removed


class Board:
    """A shared mapping the agent creates once and its forked ranks inherit.

    Each slot is written by one rank only and read by the agent; a slot is
    versioned like a seqlock (odd while being written), so a read never returns
    a half-written beat. The header is written by the agent only.

    ``path``: back the mapping by this file (the agent's, in /dev/shm) so that
    processes a rank *spawns* (Composer's upload workers: fresh interpreters that
    inherit no mapping) can map it too and check the fence before they write to a
    store (:func:`spawned_board`); without it, an anonymous mapping."""

    def __init__(self, slots: int, path: Path | None = None) -> None:
        self.slots = slots
        self.path = path
        size = _HEADER_SIZE + slots * _SLOT_SIZE
        if path is None:
            self.mm = mmap.mmap(-1, size)  # MAP_SHARED | MAP_ANONYMOUS
        else:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                os.ftruncate(fd, size)
                self.mm = mmap.mmap(fd, size)  # MAP_SHARED
            finally:
                os.close(fd)
        self.set_fence(NO_GENERATION, 0.0)

    @classmethod
    def open(cls, path: Path) -> Board:
        """Map an agent's board file (a spawned child's view of it)."""
        board = cls.__new__(cls)
        fd = os.open(path, os.O_RDWR)
        try:
            size = os.fstat(fd).st_size
            board.mm = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        board.slots, board.path = (size - _HEADER_SIZE) // _SLOT_SIZE, path
        return board

    def remove(self) -> None:
        """The agent is done with its board file."""
        if self.path is not None:
            with contextlib.suppress(OSError):
                self.path.unlink()

    # the agent's side
    def set_fence(self, live_gen: int, lease_until: float) -> None:
        self.mm[: _HEADER.size] = _HEADER.pack(int(live_gen), float(lease_until))

    def fence(self) -> tuple[int, float]:
        """(live generation, lease deadline on this node's monotonic clock)."""
        live, lease = _HEADER.unpack(self.mm[: _HEADER.size])
        return int(live), float(lease)

    def clear(self, slot: int) -> None:
        off = _HEADER_SIZE + slot * _SLOT_SIZE
        self.mm[off : off + _SLOT_SIZE] = bytes(_SLOT_SIZE)

    def read(self, slot: int) -> tuple[int, int, int, int, int, str, tuple[int, float, float]] | None:
        """(generation, rank, seq, batch, pid, phase, (straggler window, busy s, batch s)) of
        ``slot``; None while empty."""
        off = _HEADER_SIZE + slot * _SLOT_SIZE
        for _ in range(100):
            raw = self.mm[off : off + _SLOT.size]
            version, gen, rank, seq, batch, pid, win, busy, wall, ph = _SLOT.unpack(raw)
            if version % 2 == 0 and self.mm[off : off + 8] == raw[:8]:
                if version == 0:
                    return None
                pace = (win, busy / 1e6 if busy >= 0 else -1.0, wall / 1e6 if wall >= 0 else -1.0)
                return gen, rank, seq, batch, pid, ph.rstrip(b"\0").decode(errors="replace"), pace
        return None

    # a rank's side
    def write(
        self,
        slot: int,
        gen: int,
        rank: int,
        seq: int,
        batch: int,
        pid: int,
        ph: str,
        pace: tuple[int, int, int] = (-1, -1, -1),
    ) -> None:
        """``pace``: (straggler window, busy microseconds, batch microseconds)."""
        off = _HEADER_SIZE + slot * _SLOT_SIZE
        (version,) = struct.unpack_from("<q", self.mm, off)
        struct.pack_into("<q", self.mm, off, version + 1 if version % 2 == 0 else version)
        body = _SLOT.pack(0, gen, rank, seq, batch, pid, *pace, ph.encode()[:16])[8:]
        self.mm[off + 8 : off + _SLOT.size] = body
        struct.pack_into("<q", self.mm, off, (version | 1) + 1)


#: the board this process's rank beats into (set in the rank by the agent, after fork)
_board: tuple[Board, int, int] | None = None


def attach(board: Board, slot: int, gen: int) -> None:
    """This process is rank ``slot`` (its local rank) of generation ``gen`` on ``board``."""
    global _board
    _board = (board, slot, gen)


def board() -> tuple[Board, int, int] | None:
    return _board


def spawned_board() -> tuple[Board, int, int] | None:
    """The board of the rank that spawned this process, from :data:`BOARD_ENV` (None outside an
    agent's rank, or when the agent's file is gone: then the agent has ended the generation and
    killed the rank's process group, or is about to)."""
    global _spawned
    if _spawned is None:
        spec = os.environ.get(BOARD_ENV)
        if not spec:
            return None
        path, slot, gen = spec.rsplit(":", 2)
        try:
            _spawned = (Board.open(Path(path)), int(slot), int(gen))
        except OSError:
            return None
    return _spawned


_spawned: tuple[Board, int, int] | None = None


def start(rank: int, interval_s: float) -> None:
    """Start this rank's heartbeat thread (once per process), beating into its board slot."""
    global _thread
    if _thread is not None or _board is None:
        return
    brd, slot, gen = _board
    pid = os.getpid()

    def beat() -> None:
        seq = 0
        while True:
            seq += 1
            with contextlib.suppress(ValueError):  # the mapping closed at exit
                win, busy, wall = int(_state["win"]), int(_state["busy_us"]), int(_state["wall_us"])
                brd.write(slot, gen, rank, seq, int(_state["batch"]), pid, str(_state["phase"]), (win, busy, wall))
            time.sleep(interval_s)

    _thread = threading.Thread(target=beat, name="hpc_llm-heartbeat", daemon=True)
    _thread.start()


# -- the node file: the agent's beats, for people and tests ---------------------------------


def encode(beat: Beat) -> bytes:
    """A beat as its slot: a JSON line padded with spaces to exactly SLOT bytes."""
    fields = {"rank": beat.rank, "seq": beat.seq, "batch": beat.batch, "phase": beat.phase, "gen": beat.gen}
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
            int(data.get("gen", -1)),
        )
    except (ValueError, KeyError, TypeError):
        return None


class Writer:
    """The agent's file of its node's beats: opened once, then rewritten in place, all the
    node's slots in one ``pwrite`` a period."""

    def __init__(self, run_dir: Path | str, node: str) -> None:
        self.path = RunDir(run_dir).heartbeat_of_node(node)
        self.node = node
        self._fd: int | None = None

    def write(self, slots: list[Beat | None]) -> None:
        """Slot i: local rank i's beat (None: keep what the file has there)."""
        # a full or flaky filesystem must not stop the agent: nothing decides on this file
        with contextlib.suppress(OSError):
            if self._fd is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                # no O_TRUNC: a rank that has not beaten yet keeps its last beat
                self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                start = 0
                while start < len(slots):
                    if slots[start] is None:
                        start += 1
                        continue
                    end = start
                    while end < len(slots) and slots[end] is not None:
                        end += 1
                    data = b"".join(encode(b) for b in slots[start:end] if b is not None)
                    os.pwrite(self._fd, data, start * SLOT)
                    start = end
            except OSError:
                # a stale handle (NFS) stays stale: open again next period
                self.close()
                raise

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)


def read_all(run_dir: Path | str) -> dict[int, Beat]:
    """The latest heartbeat of every rank in the node files, by global rank: one open per
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
            if beat is not None and (beat.rank not in out or beat.gen >= out[beat.rank].gen):
                out[beat.rank] = beat
    return out


def clear(run_dir: Path | str) -> None:
    """Forget the node files of an earlier allocation (the supervisor, as it starts)."""
    folder = heartbeat_dir(run_dir)
    if folder.is_dir():
        for path in folder.iterdir():
            path.unlink(missing_ok=True)
