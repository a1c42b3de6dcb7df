"""The supervisor and its node agents for real, off Slurm: warm forks, restarts, dead and frozen nodes.

Each test runs the real supervisor (``python -m hpc_llm.job.supervisor``), which
starts real agents (``python -m hpc_llm.job.agent``) through tests/local_srun.py,
a stand-in for srun that gives each agent the variables of one node's task and
its own process group (so "a node" can be killed or frozen with one signal).
The ranks are forked by the agents and run tests/agent_tasks.py, a task that
trains numbered batches, beats its progress and writes through the fence.
Everything is real but Slurm itself: sockets, forks, signals, shared memory,
the supervisor's decisions. The same paths on a real cluster, with real
training, are in tests/test_faults.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from hydra import compose, initialize_config_dir

from hpc_llm.job import heartbeat
from hpc_llm.job.agent.loop import board_file
from hpc_llm.rundir.payload import shared_part, write_payload
from tests import agent_tasks
from tests.conftest import ROOT
from tests.jobs import wait_for

PY = sys.executable
#: fast liveness for tests: beats every 0.2 s, a node silent for 1 s is probed, 0.5 s to answer
FAST = [
    "--heartbeat-s", "0.2",
    "--node-timeout-s", "1",
    "--probe-timeout-s", "0.5",
    "--hang-floor-s", "2",
    "--hang-factor", "10",
    "--hang-timeout-s", "30",
    "--startup-timeout-s", "180",
]  # fmt: skip


def payload(run_dir: Path, task: Any, conf: Path, **cfg: Any) -> Path:
    """The job payload a launcher would write for ``task`` with config ``cfg`` (Hydra's own
    compose, hydra node included)."""
    conf.mkdir(parents=True, exist_ok=True)
    (conf / "task.yaml").write_text(json.dumps({"run_dir": str(run_dir), **cfg}))
    with initialize_config_dir(str(conf), version_base="1.3"):
        config = compose("task", return_hydra_config=True)
    return write_payload(run_dir, config, shared_part(task, None))


def agents_command(payload: Path, nodes: int) -> list[str]:
    """What comes after the supervisor's ``--``: srun's stand-in, one agent per node."""
    return [PY, "-m", "tests.local_srun", str(nodes), PY, "-u", "-m", "hpc_llm.job.agent", str(payload)]


def agents_env(logs: Path, warm: str = "") -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "HPC_LLM_"))}
    env.update(
        LOCAL_SRUN_LOGS=str(logs),
        HPC_LLM_AGENT_WARM=warm,
        HPC_LLM_STOP_SIGNAL="USR2",
        PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p),
    )
    return env


class LocalJob:
    """One run of ``task`` under the supervisor with ``nodes`` agents of ``per_node`` ranks each."""

    def __init__(self, tmp: Path, task: Any, *, nodes: int = 2, per_node: int = 1, warm: str = "", **cfg: Any) -> None:
        self.run_dir = tmp / "run"
        self.out = tmp / "out"
        self.logs = self.run_dir / "logs"
        for d in (self.out, self.logs):
            d.mkdir(parents=True, exist_ok=True)
        job = payload(self.run_dir, task, tmp / "conf", nodes=nodes, out=str(self.out), **cfg)
        command = [
            PY, "-u", "-m", "hpc_llm.job.supervisor", "--run-dir", str(self.run_dir),
            "--nodes", str(nodes), "--tasks-per-node", str(per_node),
            "--signal", "USR2", "--signal-lead-s", "60", *FAST,
            "--", *agents_command(job, nodes),
        ]  # fmt: skip
        self.log = open(self.logs / "supervisor.log", "wb")  # noqa: SIM115 - the supervisor's, for its life
        self.proc = subprocess.Popen(
            command, env=agents_env(self.logs, warm), stdout=self.log, stderr=subprocess.STDOUT, cwd=tmp
        )

    def wait(self, timeout: float = 180) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise AssertionError(f"the supervisor did not end in {timeout:g}s:\n{self.text()}") from None

    def text(self) -> str:
        return "\n".join(p.read_text(errors="replace")[-6000:] for p in sorted(self.logs.glob("*.log")))

    def attempts(self) -> list[dict[str, Any]]:
        path = self.run_dir / ".hpc_llm" / "attempts.json"
        try:
            return json.loads(path.read_text()) if path.exists() else []
        except ValueError:
            return []

    def node_pids(self) -> list[int]:
        """Each node's agent (the leader of the node's process group)."""
        path = self.logs / "pids"
        wait_for(path.exists, 30, "the agents to start")
        return [int(p) for p in path.read_text().split()]

    def batch(self, gen: int, rank: int) -> int:
        try:
            return int((self.out / f"g{gen}.r{rank}").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return -1

    def at(self, gen: int, rank: int, batch: int) -> None:
        wait_for(lambda: self.batch(gen, rank) >= batch, 120, f"rank {rank} of generation {gen} at batch {batch}")

    def beat(self, rank: int) -> heartbeat.Beat:
        return wait_for(lambda: heartbeat.read_all(self.run_dir).get(rank), 30, f"rank {rank}'s beat")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        for pid in self.node_pids() if (self.logs / "pids").exists() else []:
            for sig in (signal.SIGCONT, signal.SIGKILL):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, sig)
        self.log.close()


@pytest.fixture
def job(tmp_path: Path):
    made: list[LocalJob] = []

    def make(task: Any, **kw: Any) -> LocalJob:
        made.append(LocalJob(tmp_path, task, **kw))
        return made[-1]

    yield make
    for j in made:
        j.close()


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.stack
def test_ranks_forked_from_a_warm_agent_run_torch_threads_tokenizers_and_gloo(job):
    """The agents import torch, tokenizers and transformers before they fork (as they import the
    training stack for hpc_llm's task); the ranks then use OpenMP threads, the tokenizers thread
    pool and a gloo process group across two "nodes" without a deadlock."""
    # and a board file left by an agent SIGKILLed earlier on this node: the agents remove it
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = board_file().parent / f"{heartbeat.BOARD_PREFIX}{int(ended.stdout)}"
    stale.write_bytes(b"\0" * 64)
    j = job(agent_tasks.stack, nodes=2, per_node=1, warm="torch,torch.distributed,tokenizers,transformers")
    assert j.wait(300) == 0, j.text()
    assert not stale.exists()
    for rank in (0, 1):
        total, encoded, threads, _ = (j.out / f"stack.g0.r{rank}").read_text().split()
        assert (float(total), int(encoded), int(threads)) == (3.0, 2000, 2)
    assert "warm in" in (j.logs / "agent0.log").read_text()


def test_a_killed_rank_restarts_in_place_from_the_same_warm_agents(job):
    j = job(agent_tasks.train, nodes=2, per_node=2, batches=60, batch_s=0.05)
    agents = j.node_pids()
    j.at(0, 3, 10)
    victim = j.beat(3)
    os.kill(victim.pid, signal.SIGKILL)
    killed_at = time.time()
    assert j.wait() == 0, j.text()
    first, second = j.attempts()
    assert (first["cause"], first["action"], first["suspects"]) == ("failure", "restart", ["n2"])
    assert "killed by SIGKILL" in first["error"] and second["generation"] == 1 and second["state"] == "completed"
    assert j.batch(1, 3) == 60 and j.batch(1, 0) == 60
    # generation 1 was forked by the same agents, within a second of the kill
    assert all(alive(p) for p in agents) or j.proc.returncode == 0
    assert second["forked_at"] - killed_at < 1.0, (killed_at, second)
    assert first["detected_at"] - killed_at < 0.5 and first["stopped_at"] >= first["detected_at"]


def test_an_agent_killed_on_a_live_node_gets_new_agents_and_its_node_is_a_suspect_only(job):
    """Node 2's agent and ranks die at once (its process group killed), its host alive: the
    probe's connection is refused (the host answers that nothing listens), so the agent died and
    the node lives. Not a dead node (a dead or cut-off host answers nothing: the frozen test
    below, and the multi-host dev cluster's), never a hang: a failure with node 2 one blame point,
    new agents (a cold start) and training again, in place."""
    j = job(agent_tasks.train, nodes=2, per_node=1, batches=400, batch_s=0.05)
    n1, n2 = j.node_pids()
    j.at(0, 1, 10)
    os.killpg(n2, signal.SIGKILL)
    killed_at = time.time()
    assert j.wait() == 0, j.text()
    first, *_, last = j.attempts()
    assert (first["cause"], first["action"], first["suspects"]) == ("failure", "restart", ["n2"]), first
    # refused, or (the killed agent's listener not yet closed) accepted and closed unanswered
    assert "live node" in first["error"], first["error"]
    said = ("ECONNREFUSED", "ECONNRESET", "closed unanswered")
    assert any(w in first["error"] for w in said), first["error"]
    assert first["detected_at"] - killed_at < 2.0, (killed_at, first)
    assert last["state"] == "completed" and last["generation"] >= 1, last


def test_a_supervisor_frozen_past_its_agents_patience_blames_no_node(job):
    """SIGSTOP of the supervisor (its host frozen) for longer than its agents wait for a ping
    (10 pings of 0.2 s, 3 leases of 1.5 s: 4.5 s here). The agents give up on it and end their
    ranks; thawed, the supervisor finds every node gone. That is its own stall, not the nodes'
    deaths: nobody is blamed (before, every node was a node failure, excluded for a day), and
    the run restarts with new agents and completes."""
    j = job(agent_tasks.train, nodes=2, per_node=1, batches=150, batch_s=0.05)
    j.at(0, 1, 10)
    j.proc.send_signal(signal.SIGSTOP)
    try:
        wait_for(lambda: "silent for" in j.text(), 30, "the agents to give up on the supervisor")
        time.sleep(1.0)
    finally:
        j.proc.send_signal(signal.SIGCONT)
    assert j.wait() == 0, j.text()
    first, *_rest, done = j.attempts()
    assert (first["cause"], first["action"], first["suspects"]) == ("hang", "restart", []), first
    assert "supervisor's own loop stalled" in first["error"], first["error"]
    assert done["state"] == "completed" and j.batch(done["generation"], 1) == 150


def test_a_stalled_rank_is_a_hang_after_k_times_the_median_step(job):
    """The ranks' training threads stop at batch 20 for a minute while their heartbeats go on (a
    stuck collective looks like this): no batch for 10 x the median step (0.05 s here; the
    floor is 2 s) is a hang, found in seconds, not after fault.hang_timeout_s."""
    j = job(agent_tasks.train, nodes=2, per_node=1, batches=60, batch_s=0.05, stall=[20, 60])
    j.at(0, 0, 19)
    stalled_at = time.time()
    assert j.wait() == 0, j.text()
    first, second = j.attempts()
    assert (first["cause"], first["action"], first["suspects"]) == ("hang", "restart", [])
    assert "no batch trained for more than" in first["error"] and "median step" in first["error"]
    assert first["detected_at"] - stalled_at < 8, (stalled_at, first)
    assert second["state"] == "completed"


def test_the_stop_signal_reaches_every_rank_through_the_agents(job):
    j = job(agent_tasks.train, nodes=2, per_node=2, batches=100000, batch_s=0.05)
    j.at(0, 3, 5)
    sent = time.time()
    j.proc.send_signal(signal.SIGUSR2)
    j.wait()
    stops = [j.out / f"stopped.g0.r{r}" for r in range(4)]
    assert all(p.exists() for p in stops), j.text()
    assert max(p.stat().st_mtime for p in stops) - sent < 1.0
    [a] = j.attempts()
    # off Slurm nobody can say it was a preemption: a stop signal sent by hand
    assert (a["state"], a["cause"], a["signal"]) == ("stopped", "signal", "SIGUSR2"), a


@pytest.fixture
def on_a_board():
    """This process as local rank 1 of generation 5 on a board, with the record's writes guarded
    (what the agent and the rank's entry set up); undone afterwards."""
    from hpc_llm.job.rank import fence
    from hpc_llm.rundir import epoch

    board = heartbeat.Board(2)
    heartbeat.attach(board, 1, 5)
    fence.install()
    try:
        yield board
    finally:
        heartbeat._board = None
        epoch.install(None)


def test_the_fence_refuses_a_rank_of_an_ended_generation_and_waits_out_a_late_ping(on_a_board, tmp_path):
    import threading

    from hpc_llm.job.rank import fence
    from hpc_llm.rundir.record import write_results

    board = on_a_board
    board.set_fence(5, time.monotonic() + 10)
    fence.check("a save")
    write_results(tmp_path, {"status": "running"})  # allowed: the live generation, a fresh lease
    board.set_fence(6, time.monotonic() + 10)  # the supervisor moved on to generation 6
    with pytest.raises(fence.Fenced, match="generation 5 has ended"):
        fence.check("a save")
    with pytest.raises(fence.Fenced):
        write_results(tmp_path, {"status": "failed"})
    assert json.loads((tmp_path / "results.json").read_text())["status"] == "running"
    # a lease that ran out while the generation is still live: a late ping renews it in time...
    board.set_fence(5, time.monotonic() - 1)
    threading.Timer(0.3, lambda: board.set_fence(5, time.monotonic() + 10)).start()
    t0 = time.monotonic()
    fence.check("a save")
    assert 0.25 < time.monotonic() - t0 < 2
    # ...and none at all is refused after the wait
    board.set_fence(5, time.monotonic() - 1)
    with pytest.raises(fence.Fenced, match="not been heard from"):
        fence.check("a save")


@pytest.mark.train
def test_a_fenced_rank_never_reaches_composers_checkpoint_save(on_a_board):
    """The guard stands in front of Composer's own save_checkpoint (and between it and the link
    to `latest`): a rank of an ended generation is refused before Composer writes a byte."""
    from composer.utils import checkpoint

    from hpc_llm.job.rank import fence

    fence.guard_checkpoints()
    on_a_board.set_fence(6, time.monotonic() + 10)
    with pytest.raises(fence.Fenced, match="checkpoint save refused"):
        checkpoint.save_checkpoint(state=None, filename="never-written.pt")  # the real one would fail on None
    on_a_board.set_fence(5, time.monotonic() + 10)
    with pytest.raises(AttributeError):
        checkpoint.save_checkpoint(state=None, filename="x.pt")  # allowed through: Composer's own error


def test_a_generation_meets_on_a_port_outside_the_ephemeral_range():
    """A port from bind(0) is one any outgoing connection may take as its source port before the
    rank's store binds it, and a same-host rank retrying its connection can connect to itself
    (seen: a start-up stuck with both ranks in "build"). The agent's port is below the kernel's
    ephemeral range and free when handed out."""
    import socket

    from hpc_llm.job.agent.loop import free_port
    from hpc_llm.job.wire import ephemeral_ports

    lo, hi = ephemeral_ports()
    for _ in range(20):
        port = free_port()
        assert not lo <= port <= hi, (port, lo, hi)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("", port))
