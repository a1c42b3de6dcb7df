"""Heartbeats at the scale of a long run, without a cluster: what the shared filesystem sees.

64 nodes x 8 ranks beat every period for weeks. Each rank opens its node's
file once per process and rewrites only its slot; the supervisor opens one
file per node, at most once a period. These count the opens, in process
(writers stand in for ranks), and through the supervisor's own step loop.
"""

from __future__ import annotations

import builtins
import io
import os
import sys
import textwrap
import time
from pathlib import Path

import pytest

from hpc_llm.job import heartbeat
from hpc_llm.job.supervisor import loop as supervisor
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


def writers(run_dir: Path) -> list[heartbeat.Writer]:
    return [
        heartbeat.Writer(run_dir, node(n), local, n * PER_NODE + local, pid=1000 + n * PER_NODE + local)
        for n in range(NODES)
        for local in range(PER_NODE)
    ]


def test_512_ranks_open_their_node_file_once_and_the_reader_one_file_per_node(tmp_path, monkeypatch):
    ranks = writers(tmp_path)
    opens = Opens(monkeypatch, RunDir(tmp_path).heartbeats)
    writer_opens, reader_opens = [], []
    for period in range(5):
        for w in ranks:
            w.write(batch=period * 1000 + w.rank, phase=heartbeat.TRAINING)
        writer_opens += opens.take()
        beats = heartbeat.read_all(tmp_path)
        reader_opens.append(opens.take())
        assert sorted(beats) == list(range(NODES * PER_NODE))
        for rank, b in beats.items():
            assert (b.rank, b.seq, b.batch, b.phase) == (rank, period + 1, period * 1000 + rank, heartbeat.TRAINING)
            assert (b.node, b.pid) == (node(rank // PER_NODE), 1000 + rank)
    # once per writer in all, not once per beat; every open is of its own node's file
    assert len(writer_opens) == NODES * PER_NODE
    assert sorted(set(writer_opens)) == sorted(str(RunDir(tmp_path).heartbeat_of_node(node(n))) for n in range(NODES))
    assert all(len(read) <= NODES and len(set(read)) == len(read) for read in reader_opens)
    # the files are the slots and nothing else: one page per node of 8 ranks
    assert {p.stat().st_size for p in RunDir(tmp_path).heartbeats.iterdir()} == {PER_NODE * heartbeat.SLOT}
    heartbeat.clear(tmp_path)
    assert heartbeat.read_all(tmp_path) == {}


def test_a_torn_empty_or_garbage_slot_is_skipped_not_fatal(tmp_path):
    ranks = [heartbeat.Writer(tmp_path, "n1", local, 8 + local) for local in range(4)]
    for w in ranks:
        w.write(batch=7, phase="train")
    path = RunDir(tmp_path).heartbeat_of_node("n1")
    fd = os.open(path, os.O_RDWR)
    try:
        os.pwrite(fd, b"\xff\x00garbage{{" * 60, 1 * heartbeat.SLOT)  # binary junk over slot 1
        # a write caught halfway: the new beat's head (longer numbers) over the old beat's tail
        half = heartbeat.encode(heartbeat.Beat(10, 123456, 99999, "n1", 1))[: heartbeat.SLOT // 8]
        os.pwrite(fd, half, 2 * heartbeat.SLOT)
        os.pwrite(fd, b"\n".rjust(heartbeat.SLOT), 5 * heartbeat.SLOT)  # a blank slot past a hole
    finally:
        os.close(fd)
    (RunDir(tmp_path).heartbeats / "n2").write_bytes(b"not a heartbeat file")
    beats = heartbeat.read_all(tmp_path)
    assert sorted(beats) == [8, 11]
    assert beats[11].batch == 7 and beats[11].node == "n1"


def test_a_failed_open_is_tried_again_next_period_and_never_raises(tmp_path, monkeypatch):
    w = heartbeat.Writer(tmp_path, "n1", 3, 27)
    real_open = os.open

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "open", full)
    w.write(batch=1, phase="train")  # training goes on; the supervisor sees silence
    assert heartbeat.read_all(tmp_path) == {}
    monkeypatch.setattr(os, "open", real_open)
    w.write(batch=2, phase="train")
    [(rank, b)] = heartbeat.read_all(tmp_path).items()
    assert (rank, b.seq, b.batch) == (27, 2, 2)


def test_a_node_name_too_long_for_the_slot_is_read_from_the_file_name(tmp_path):
    name = "n" * 250  # the longest a host name may be (253) still makes a file name
    heartbeat.Writer(tmp_path, name, 0, 0).write(batch=3, phase="train")
    heartbeat.Writer(tmp_path, name, 1, 1).write(batch=3, phase="train")
    beats = heartbeat.read_all(tmp_path)
    assert {r: b.node for r, b in beats.items()} == {0: name, 1: name}


#: a step of 64 nodes x 8 ranks, all beating from one process; rank 13 freezes after a while
STEP = """
import sys, time
from hpc_llm.job import heartbeat
run_dir, period, freeze_after = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
ranks = [heartbeat.Writer(run_dir, f"gpu{{n:03d}}", local, n * {per_node} + local)
         for n in range({nodes}) for local in range({per_node})]
start = time.monotonic()
batch = 0
while time.monotonic() - start < float(sys.argv[4]):
    batch += 1
    for w in ranks:
        if w.rank != 13 or time.monotonic() - start < freeze_after:
            w.write(batch, heartbeat.TRAINING)
    time.sleep(period)
"""


def supervise(tmp_path, monkeypatch, period, hang_timeout_s, freeze_after, run_s):
    script = tmp_path / "step.py"
    script.write_text(textwrap.dedent(STEP.format(nodes=NODES, per_node=PER_NODE)))
    for k in ("SLURM_JOB_ID", "SLURM_NTASKS"):
        monkeypatch.delenv(k, raising=False)
    policy = supervisor.Policy(
        run_dir=tmp_path,
        nodes=NODES,
        stop_signal=None,
        signal_lead_s=60,
        heartbeat_s=period,
        hang_timeout_s=hang_timeout_s,
    )
    command = [sys.executable, str(script), str(tmp_path), str(period), str(freeze_after), str(run_s)]
    sup = supervisor.Supervisor(policy, command)
    reads: list[tuple[float, list[str]]] = []
    opens = Opens(monkeypatch, RunDir(tmp_path).heartbeats)
    real_read_all = heartbeat.read_all

    def read_all(run_dir):
        beats = real_read_all(run_dir)
        reads.append((time.monotonic(), opens.take()))
        return beats

    monkeypatch.setattr(heartbeat, "read_all", read_all)
    started = time.monotonic()
    end = sup.run_step()
    return end, reads, time.monotonic() - started


def test_the_supervisor_reads_each_node_file_at_most_once_a_period(tmp_path, monkeypatch):
    end, reads, elapsed = supervise(tmp_path, monkeypatch, period=1.0, hang_timeout_s=30, freeze_after=60, run_s=4.5)
    assert end.hang is None and end.returncode == 0
    assert 2 <= len(reads) <= elapsed / 1.0 + 1, (len(reads), elapsed)
    assert all(b[0] - a[0] >= 0.95 for a, b in zip(reads, reads[1:], strict=False))
    assert all(len(paths) <= NODES and len(set(paths)) == len(paths) for _t, paths in reads)
    assert max(len(paths) for _t, paths in reads) == NODES
    assert end.top_batch >= 3  # every rank's beats got through: the top batch moved with them


def test_a_frozen_rank_is_still_named_when_heartbeats_are_read_once_a_period(tmp_path, monkeypatch):
    """fault.hang_timeout_s >= 3 heartbeats: read once a period, a live rank is never called
    silent, and a frozen one is named within the timeout plus two periods."""
    end, reads, elapsed = supervise(tmp_path, monkeypatch, period=1.0, hang_timeout_s=3.0, freeze_after=1.5, run_s=30)
    assert end.hang is not None, end
    assert end.hang[0].startswith("rank(s) 13 on gpu001 silent"), end.hang
    assert end.hang[1] == ("gpu001",)
    assert elapsed < 1.5 + 3.0 + 2 * 1.0 + 5  # + start-up and the kill, on a loaded machine
