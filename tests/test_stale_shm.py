"""hpc_llm.job.rank.stale_shm against real Streaming (docs/upstream-fixes.md, upstream fix 8): a killed
rank's registration is removed, a live one is kept, and no peer is needed to do it."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

# a mark, not pytest.importorskip: importing Streaming (torch, torchvision, transformers) at
# collection cost every pytest worker ~3 s, in runs that deselect these tests too
pytestmark = [
    pytest.mark.stack,
    pytest.mark.skipif(importlib.util.find_spec("streaming") is None, reason="needs mosaicml-streaming"),
]

#: a rank's loader: a StreamingDataset of a remote (the "reused local directory" check applies
#: only to a stream with one), its shm prefix printed, then it waits to be killed
HOLDER = textwrap.dedent(
    """
    import json, sys, time
    from streaming import StreamingDataset
    ds = StreamingDataset(remote=sys.argv[1], local=sys.argv[2], batch_size=4)
    print(json.dumps({"prefix": f"{ds._shm_prefix_int:06}"}), flush=True)
    time.sleep(600)
    """
)


def shards(root: Path) -> Path:
    from streaming import MDSWriter

    with MDSWriter(out=str(root), columns={"x": "int"}) as out:
        for i in range(16):
            out.write({"x": i})
    return root


def holder(remote: Path, local: Path) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(remote), str(local)],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,  # a process group of its own, as a forked rank has
    )
    line = proc.stdout.readline() if proc.stdout else ""
    assert line, f"the holder exited {proc.wait()}"
    return proc, json.loads(line)["prefix"]


def registered(prefix: str) -> list[str]:
    return sorted(p.name for p in Path("/dev/shm").glob(f"{prefix}_*"))


def start(remote: Path, local: Path) -> subprocess.CompletedProcess:
    """A successor's loader on ``local``, in a process of its own (this one never maps a
    registration: Streaming keeps every one it reads mapped until its process exits)."""
    code = HOLDER.replace("time.sleep(600)", "print(len(ds))")
    return subprocess.run([sys.executable, "-c", code, str(remote), str(local)], capture_output=True, text=True)


def test_a_killed_ranks_registration_is_removed_and_a_live_ones_is_kept(tmp_path):
    from hpc_llm.job.rank import stale_shm

    remote = shards(tmp_path / "remote")
    own = tmp_path / "scratch" / "hpc_llm-7" / "node0"  # this job's scratch on this node
    # a rank of this job, then another job's live loader (it reads the first registration while
    # looking for a free prefix: mapped by it from then on), then a dead job's loader elsewhere
    ours, ours_prefix = holder(remote, own / "cache")
    other, other_prefix = holder(remote, tmp_path / "other-job")
    gone, gone_prefix = holder(remote, tmp_path / "gone-job")
    try:
        # killed as an agent kills a rank, the whole process group (Python's resource tracker,
        # which would unlink what its dead parent left, included): nothing unregisters
        for proc in (ours, gone):
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        assert registered(ours_prefix) and registered(other_prefix) and registered(gone_prefix)
        assert set(registered(ours_prefix)) <= stale_shm.mapped()  # by the other job's loader
        refused = start(remote, own / "cache")
        assert refused.returncode != 0 and "Reused local directory" in refused.stderr, refused.stderr[-2000:]

        kept = registered(other_prefix)
        removed = stale_shm.clean(own=own.resolve())
        assert registered(ours_prefix) == [], removed  # ours, though another process maps it
        assert registered(other_prefix) == kept and not set(kept) & set(removed)  # live, not ours
        # a dead one of another job goes once nobody maps it (a loader started meanwhile on
        # this machine, by a test beside this one, may have read it: then it stays)
        assert registered(gone_prefix) == [] or set(registered(gone_prefix)) & stale_shm.mapped()

        started = start(remote, own / "cache")
        assert started.returncode == 0 and started.stdout.split()[-1] == "16", started.stderr[-2000:]
    finally:
        os.killpg(other.pid, signal.SIGKILL)
        other.wait()


def test_the_cleanup_needs_no_peer(tmp_path):
    """Streaming's clean_stale_shared_memory() starts torch.distributed itself: as rank 0 of 2
    it waits for rank 1 (then races LLM Foundry's own rendezvous on the same port). hpc_llm's
    returns at once, the process group never started."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(
        os.environ,
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        WORLD_SIZE="2",
        RANK="0",
        LOCAL_RANK="0",
        LOCAL_WORLD_SIZE="1",
    )
    code = (
        "import torch.distributed as dist; from hpc_llm.job.rank import stale_shm; "
        "stale_shm.clean(); print(dist.is_initialized())"
    )
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["False"]
