"""Heartbeats at the scale of a long run, without a cluster: what the shared filesystem and the
supervisor see.

2,048 nodes x 8 ranks beat every second for weeks. A rank beats into its agent's
shared memory (no syscall at all); an agent sends its ranks' beats to the
supervisor over its connection, and writes them to its node's file in the run
dir in one ``pwrite`` a period, for people and tests. These count the opens and
writes of the node files, check a board's slots are never read torn while a
forked rank writes them, and run a fleet of 2,048 agent connections against the
supervisor's I/O thread.
"""

from __future__ import annotations

import builtins
import contextlib
import io
import os
import socket
import threading
import time
from pathlib import Path

import pytest

from hpc_llm.job import heartbeat, messages
from hpc_llm.job.supervisor.fleet import Dead, Fleet, FleetEvent, Joined, Suspect
from hpc_llm.rundir.layout import RunDir

NODES, PER_NODE = 64, 8


class Opens:
    """Every file open in this process (os.open, open, io.open) whose path is under ``folder``."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, folder: Path) -> None:
        self.folder = str(folder)
        self.paths: list[str] = []
        for owner, name in ((os, "open"), (builtins, "open"), (io, "open")):
            monkeypatch.setattr(owner, name, self._counting(getattr(owner, name)))

    def _counting(self, real):
        def wrapper(file, *args, **kwargs):
            if isinstance(file, (str, bytes, os.PathLike)) and os.fsdecode(file).startswith(self.folder):
                self.paths.append(os.fsdecode(file))
            return real(file, *args, **kwargs)

        return wrapper

    def take(self) -> list[str]:
        taken, self.paths = self.paths, []
        return taken


def node(n: int) -> str:
    return f"gpu{n:03d}"


def beats_of(n: int, period: int) -> list[heartbeat.Beat | None]:
    return [
        heartbeat.Beat(n * PER_NODE + local, period + 1, period * 1000 + local, node(n), 1000 + n * PER_NODE + local)
        for local in range(PER_NODE)
    ]


def test_64_agents_write_their_node_file_in_one_pwrite_a_period_opened_once(tmp_path, monkeypatch):
    agents = [heartbeat.Writer(tmp_path, node(n)) for n in range(NODES)]
    opens = Opens(monkeypatch, RunDir(tmp_path).heartbeats)
    writes: list[int] = []
    real_pwrite = os.pwrite
    monkeypatch.setattr(os, "pwrite", lambda fd, data, off: writes.append(len(data)) or real_pwrite(fd, data, off))
    writer_opens = []
    for period in range(5):
        for n, w in enumerate(agents):
            w.write(beats_of(n, period))
        writer_opens += opens.take()
        beats = heartbeat.read_all(tmp_path)
        assert len(opens.take()) == NODES  # a reader: one open per node's file
        assert sorted(beats) == list(range(NODES * PER_NODE))
        for rank, b in beats.items():
            assert (b.rank, b.seq, b.batch) == (rank, period + 1, period * 1000 + rank % PER_NODE)
            assert (b.node, b.pid) == (node(rank // PER_NODE), 1000 + rank)
    # once per agent in all; one write of the whole page per node per period
    assert len(writer_opens) == NODES
    assert writes == [PER_NODE * heartbeat.SLOT] * (NODES * 5)
    assert {p.stat().st_size for p in RunDir(tmp_path).heartbeats.iterdir()} == {PER_NODE * heartbeat.SLOT}
    heartbeat.clear(tmp_path)
    assert heartbeat.read_all(tmp_path) == {}


def test_a_rank_that_has_not_beaten_keeps_its_slot_and_a_torn_or_garbage_slot_is_skipped(tmp_path):
    w = heartbeat.Writer(tmp_path, "n1")
    w.write(beats_of(0, 0))
    w.write([None, *beats_of(0, 1)[1:]])  # local rank 0 not beaten this period: its last beat stays
    beats = heartbeat.read_all(tmp_path)
    assert beats[0].seq == 1 and beats[1].seq == 2
    path = RunDir(tmp_path).heartbeat_of_node("n1")
    fd = os.open(path, os.O_RDWR)
    try:
        os.pwrite(fd, b"\xff\x00garbage{{" * 60, 1 * heartbeat.SLOT)  # binary junk over slot 1
        half = heartbeat.encode(heartbeat.Beat(2, 123456, 99999, "n1", 1))[: heartbeat.SLOT // 8]
        os.pwrite(fd, half, 2 * heartbeat.SLOT)  # a write caught halfway
    finally:
        os.close(fd)
    (RunDir(tmp_path).heartbeats / "n2").write_bytes(b"not a heartbeat file")
    assert sorted(heartbeat.read_all(tmp_path)) == [0, 3, 4, 5, 6, 7]


def test_a_failed_open_is_tried_again_next_period_and_never_raises(tmp_path, monkeypatch):
    w = heartbeat.Writer(tmp_path, "n1")
    real_open = os.open

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "open", full)
    w.write(beats_of(0, 0))  # the agent goes on; nothing decides on this file
    assert heartbeat.read_all(tmp_path) == {}
    monkeypatch.setattr(os, "open", real_open)
    w.write(beats_of(0, 1))
    assert heartbeat.read_all(tmp_path)[3].seq == 2


def test_a_node_name_too_long_for_the_slot_is_read_from_the_file_name(tmp_path):
    name = "n" * 250  # the longest a host name may be (253) still makes a file name
    heartbeat.Writer(tmp_path, name).write([heartbeat.Beat(r, 1, 3, name, 9) for r in range(2)])
    assert {r: b.node for r, b in heartbeat.read_all(tmp_path).items()} == {0: name, 1: name}


def test_a_board_slot_is_never_read_half_written_while_a_forked_rank_beats():
    """The agent reads a slot while the rank (a forked child, sharing the mapping) rewrites it as
    fast as it can: every read is one whole beat (seq and batch written together), never a mix."""
    board = heartbeat.Board(2)
    pid = os.fork()
    if pid == 0:  # the rank
        end = time.monotonic() + 1.5
        seq = 0
        while time.monotonic() < end:
            seq += 1
            board.write(
                1, 3, 9, seq, seq * 7, os.getpid(), "train" if seq % 2 else "save", (seq, seq * 1000, seq * 3000)
            )
        os._exit(0)
    seen = 0
    try:
        while True:
            got = board.read(1)
            if got is not None:
                gen, rank, seq, batch, _pid, phase, pace = got
                assert (gen, rank, batch, phase) == (3, 9, seq * 7, "train" if seq % 2 else "save"), got
                assert pace[0] == seq and pace[1:] == pytest.approx((seq / 1000, seq * 3 / 1000)), got
                seen += 1
            done, _ = os.waitpid(pid, os.WNOHANG)
            if done:
                break
    finally:
        if not seen:
            os.waitpid(pid, 0)
    assert seen > 1000 and board.read(0) is None
    board.set_fence(7, 123.5)
    assert board.fence() == (7, 123.5)


def _fence_in_a_spawned_child(spec: str, queue) -> None:
    os.environ[heartbeat.BOARD_ENV] = spec
    from hpc_llm.job.rank import fence

    queue.put(fence.state(wait_s=0))


def test_a_process_a_rank_spawns_sees_the_fence_through_the_board_file(tmp_path):
    """Composer's upload workers are spawned (fresh interpreters, no inherited mapping): they map
    the agent's board file named in HPC_LLM_BOARD and are fenced like the rank: free to write while
    its generation is live and leased, refused once it has ended, and refused when the file is gone."""
    import multiprocessing

    path = tmp_path / "board"
    board = heartbeat.Board(2, path)
    spec = f"{path}:1:4"
    ctx = multiprocessing.get_context("spawn")

    def child_says() -> str | None:
        q = ctx.Queue()
        p = ctx.Process(target=_fence_in_a_spawned_child, args=(spec, q))
        p.start()
        got = q.get(timeout=60)
        p.join(30)
        return got

    board.set_fence(4, time.monotonic() + 60)
    assert child_says() is None
    board.set_fence(5, time.monotonic() + 60)
    assert "generation 4 has ended (the live one is 5)" in (child_says() or "")
    board.remove()
    assert not path.exists()
    assert "agent has ended" in (child_says() or "")


def test_board_files_of_agents_gone_are_removed_and_a_live_agents_kept(tmp_path):
    """A SIGKILLed agent leaves its board file in /dev/shm; the next agent on the node removes
    it. A board is live while the process of its pid maps it: this process's is kept, a dead
    pid's goes, and so does one whose pid now belongs to a process that does not map it."""
    import subprocess
    import sys

    live = heartbeat.Board(1, tmp_path / f"{heartbeat.BOARD_PREFIX}{os.getpid()}")
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = tmp_path / f"{heartbeat.BOARD_PREFIX}{int(ended.stdout)}"
    dead.write_bytes(b"\0" * 64)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        reused = tmp_path / f"{heartbeat.BOARD_PREFIX}{other.pid}"
        reused.write_bytes(b"\0" * 64)
        unrelated = tmp_path / "hpc_llm-board-notapid"
        unrelated.write_bytes(b"")
        assert sorted(heartbeat.remove_stale_boards(tmp_path)) == sorted([dead, reused])
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted([live.path.name, unrelated.name])
    finally:
        other.kill()
        other.wait()
        live.remove()


def _fleet_of_agents(port: int, agents: int, periods: int, report: int, hold: int) -> None:
    """The agents' side, in a process of its own (as on a cluster): connect, say hello, beat every
    second for ``periods`` periods while reading the pings; write the longest period it took to
    ``report``; keep the connections until ``hold`` closes."""
    socks = []
    for n in range(agents):
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(
            messages.encode(messages.Hello("tok", node(n), n, n, "127.0.0.1", 1)) + messages.encode(messages.Warm())
        )
        socks.append(s)
    stop = threading.Event()

    def drain() -> None:  # the agents read the pings (a full buffer would stall the fleet)
        for s in socks:
            s.setblocking(False)
        while not stop.is_set():
            for s in socks:
                with contextlib.suppress(BlockingIOError, OSError):
                    s.recv(65536)
            time.sleep(0.05)

    threading.Thread(target=drain, daemon=True).start()
    longest = 0.0
    for period in range(periods):
        t0 = time.monotonic()
        for n, s in enumerate(socks):
            ranks = tuple(messages.RankBeat(n * 8 + r, period + 1, period, "train", r, 0) for r in range(8))
            with contextlib.suppress(BlockingIOError):
                s.setblocking(True)
                s.sendall(messages.encode(messages.Beat(period + 1, ranks)))
                s.setblocking(False)
        took = time.monotonic() - t0
        longest = max(longest, took)
        time.sleep(max(0.0, 1.0 - took))
    os.write(report, f"{longest:.3f}".encode())
    os.read(hold, 1)  # until the test has looked
    stop.set()


def test_a_fleet_of_2048_agents_beating_every_second_raises_no_false_suspicion(tmp_path):
    """Llama 3's scale, one connection per node: 2,048 agents say hello and beat every second
    for 5 s (8 ranks each); the supervisor's I/O thread keeps every one live (no suspect, no
    probe), has every rank's latest beat, and pings each agent every period. The agents run in a
    process of their own, as on a cluster (in the test's process they took the fleet's GIL: a
    false suspicion at a load of 12 on 2 cores); if that process itself cannot send a period's
    beats within the 3 s node timeout, the machine cannot simulate the fleet and the test says so."""
    agents, periods = 2048, 5
    fleet = Fleet("tok", beat_s=1.0, node_timeout_s=3.0, probe_timeout_s=1.5, lease_s=4.5, host="127.0.0.1")
    fleet.start()
    report_r, report_w = os.pipe()
    hold_r, hold_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(report_r)
            os.close(hold_w)
            _fleet_of_agents(fleet.port, agents, periods, report_w, hold_r)
        finally:
            os._exit(0)
    os.close(report_w)
    os.close(hold_r)
    try:
        longest = float(os.read(report_r, 64).decode() or "nan")
        time.sleep(0.5)
        events = fleet.events()
        if not longest < 2.0:
            pytest.skip(f"this machine could not send 2,048 agents' beats in time (a period took {longest:.1f} s)")
        assert not [e for e in events if isinstance(e, Suspect | Dead)], [
            e for e in events if not isinstance(e, Joined)
        ][:5]
        assert sum(isinstance(e, Joined) for e in events) == agents
        beats = fleet.beats()
        assert len(beats) == agents * 8 and {b.seq for b in beats.values()} == {periods}
        assert all(a.state == "warm" and a.last_ping > 0 for a in fleet.view().values())
    finally:
        os.close(hold_w)
        os.waitpid(pid, 0)
        fleet.close()
        os.close(report_r)


def test_an_agent_that_says_hello_and_goes_at_once_is_probed_and_the_fleet_serves_on():
    """Beside 2,048 agents on a busy machine the agents' process died right after their hellos:
    the I/O thread registered an already-closed socket, raised, and ended, so no agent would
    ever get a ping again. Now such an agent is a dropped one (suspect, probed: its probe port
    refuses, dead), and the next agent is greeted as usual."""
    fleet = Fleet("tok", beat_s=1.0, node_timeout_s=3.0, probe_timeout_s=1.5, lease_s=4.5, host="127.0.0.1")
    fleet.start()
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    refusing = closed.getsockname()[1]  # bound, never listening: connections to it are refused
    try:
        for n in range(20):  # hello, warm, then gone before the fleet reads a byte
            s = socket.create_connection(("127.0.0.1", fleet.port))
            hello = messages.Hello("tok", node(n), n, n, "127.0.0.1", refusing)
            s.sendall(messages.encode(hello) + messages.encode(messages.Warm()))
            s.close()
        late = socket.create_connection(("127.0.0.1", fleet.port))
        late.sendall(messages.encode(messages.Hello("tok", "late", 99, 1, "127.0.0.1", 1)))
        deadline = time.monotonic() + 10
        events: list[FleetEvent] = []
        while time.monotonic() < deadline and (
            sum(isinstance(e, Dead) for e in events) < 20 or not fleet.view().get("late")
        ):
            events += fleet.events()
            time.sleep(0.05)
        assert fleet._thread.is_alive()
        assert {e.node for e in events if isinstance(e, Dead)} == {node(n) for n in range(20)}, events[:5]
        assert fleet.view()["late"].alive and "late" not in {e.node for e in events if isinstance(e, Suspect | Dead)}
        late.close()
    finally:
        fleet.close()
        closed.close()


def test_a_probe_tells_an_agent_gone_on_a_live_host_from_a_host_that_does_not_answer():
    """The probe's answer says what failed. Two agents go silent: one's probe port refuses (its
    host's kernel answers that nothing listens: the agent died, the node lives); the other's
    accepts the connection and never answers (a frozen host: its kernel answers for it, so the
    link to it works and the fault is the node's, ``reached``). Only the second is a dead node."""
    fleet = Fleet("tok", beat_s=0.2, node_timeout_s=0.6, probe_timeout_s=0.6, lease_s=1.2, host="127.0.0.1")
    fleet.start()
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))  # bound, never listening: connections to it are refused
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(4)  # the kernel accepts; nobody ever reads or answers
    conns = []
    try:
        for name, port in (("alive-host", closed.getsockname()[1]), ("no-answer", silent.getsockname()[1])):
            s = socket.create_connection(("127.0.0.1", fleet.port))
            s.sendall(messages.encode(messages.Hello("tok", name, 1, 1, "127.0.0.1", port)))
            s.sendall(messages.encode(messages.Warm()))
            conns.append(s)  # kept open and silent: suspect after node_timeout_s, then probed
        deadline, dead = time.monotonic() + 20, {}
        while time.monotonic() < deadline and len(dead) < 2:
            dead.update({e.node: e for e in fleet.events(timeout=0.1) if isinstance(e, Dead)})
        assert set(dead) == {"alive-host", "no-answer"}, dead
        assert dead["alive-host"].host_answers and "ECONNREFUSED" in dead["alive-host"].why
        assert dead["alive-host"].reached is False
        assert not dead["no-answer"].host_answers and dead["no-answer"].reached
        assert "accepted the probe's connection and nothing answered it" in dead["no-answer"].why
    finally:
        for s in conns:
            s.close()
        fleet.close()
        closed.close()
        silent.close()


def test_a_reset_is_the_host_answering_too():
    """An agent that dies with the probe's connection queued on its port: its host's kernel
    resets it (ECONNRESET, seen under load in tests/test_agents.py), the same answer as a refusal
    a moment later: the node lives. No answer at all is the other kind."""
    import errno

    from hpc_llm.job.supervisor import fleet

    for err in (errno.ECONNREFUSED, errno.ECONNRESET):
        assert err in fleet.HOST_ANSWERED and "refused" in fleet.probe_failed(err)
    for err in (errno.EHOSTUNREACH, errno.ENETUNREACH, errno.ETIMEDOUT):
        assert err not in fleet.HOST_ANSWERED and "no answer from the host" in fleet.probe_failed(err)
