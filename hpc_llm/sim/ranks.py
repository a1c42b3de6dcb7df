"""The ranks in the simulation: a model of a training rank, forked by the real agent.

The agent's :class:`~hpc_llm.job.agent.ranks.RankRuntime` here is :class:`SimRanks`: warming
takes the virtual seconds an import takes, and a forked rank is a simulated process that does
what a training rank does as far as the control plane can tell:

* it beats into its slot of the agent's board (the real :class:`~hpc_llm.job.heartbeat.Board`)
  every heartbeat period: its generation, its batch, its phase;
* the generation's ranks meet at a rendezvous and then in a collective every batch: a batch
  completes only when every rank of the generation has reached it and their hosts reach one
  another (a dead, frozen or cut-off peer hangs the others, as NCCL and gloo do, until the
  collective timeout);
* it resumes from the newest checkpoint of the run, saves one every ``save_every`` batches (rank
  0 writes it, then moves the ``latest`` pointer), and stops at a batch boundary on the stop
  signal, every rank at the same batch (the flag is all-reduced), after a save;
* global rank 0 keeps the run's record through the real :class:`~hpc_llm.rundir.record.RunRecord`:
  the attempt opened, progress noted, closed stopped or completed;
* before every write (the record, a checkpoint, ``latest``) it checks its right to write: the
  generation's fence on the board, and the run's epoch (:func:`hpc_llm.job.epoch.check`).
"""

from __future__ import annotations

import contextlib
import json
import signal
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from hpc_llm.rundir.layout import RunDir
from hpc_llm.sim.hub import TIMEOUT, Wait
from hpc_llm.sim.world import Proc, Thread

if TYPE_CHECKING:
    from hpc_llm.job import heartbeat

#: the simulation (hpc_llm.sim.run.Sim, which imports this module)
Sim = Any

#: a collective that waits this long raises (gloo's and NCCL's timeouts are longer; shorter here
#: only makes a seed's run shorter, and the supervisor judges a hang long before)
COLLECTIVE_TIMEOUT_S = 600.0


@dataclass
class Training:
    """What the simulated run trains: its length and pace."""

    run_dir: Path
    max_batches: int = 60
    step_s: float = 0.5
    save_every: int = 10
    save_s: float = 0.4
    import_s: float = 2.0
    heartbeat_s: float = 1.0


class Group:
    """One generation's ranks meeting: its rendezvous (batch -1) and each batch's collective."""

    def __init__(self, sim: Sim, size: int) -> None:
        self.sim = sim
        self.size = size
        #: batch -> {rank: (host, stop requested)}
        self.arrived: dict[int, dict[int, tuple[Any, bool]]] = {}
        self.done: dict[int, bool] = {}
        self.waiters: dict[int, list[Wait]] = {}

    def meet(self, proc: Proc, rank: int, batch: int, stop: bool) -> bool | None:
        """Wait for every rank at ``batch``: True when they all stop after it (any asked), False
        to go on, None when the collective timed out."""
        hub = self.sim.hub
        self.arrived.setdefault(batch, {})[rank] = (proc.host, stop)
        deadline = hub.now + COLLECTIVE_TIMEOUT_S
        while batch not in self.done:
            self.check(batch)
            if batch in self.done:
                break
            left = deadline - hub.now
            if left <= 0:
                return None
            w = hub.waiter()
            self.waiters.setdefault(batch, []).append(w)
            if hub.suspend(w, left) is TIMEOUT and batch not in self.done:
                return None
        return self.done[batch]

    def check(self, batch: int) -> None:
        got = self.arrived.get(batch, {})
        if batch in self.done or len(got) < self.size:
            return
        hosts = {id(h): h for h, _ in got.values()}.values()
        net = self.sim.net
        if all(net.reaches(a, b) for a in hosts for b in hosts):
            self.done[batch] = any(stop for _, stop in got.values())
            for w in self.waiters.pop(batch, []):
                self.sim.hub.fire(w, True)

    def recheck(self) -> None:
        for batch in list(self.arrived):
            self.check(batch)


@dataclass
class RankArgs:
    board: heartbeat.Board
    gen: int
    rank: int
    local_rank: int
    payload: Training


class SimRanks:
    """The :class:`~hpc_llm.job.agent.ranks.RankRuntime` of the simulated world."""

    def __init__(self, sim: Sim, training: Training) -> None:
        self.sim = sim
        self.training = training
        self.groups: dict[tuple[str, ...], Group] = {}

    def warm(self, payload_path: Path) -> tuple[Any, float]:
        took = self.training.import_s
        self.sim.world.pause(took)
        return self.training, took

    def describe(self, payload: Any) -> str:
        return "a simulated training run"

    def check_node(self, payload: Any) -> Any:
        from hpc_llm.job.agent.node_check import NodeCheck

        return NodeCheck(gflops=100.0)

    def check_fork_safe(self) -> None:
        pass

    def scratch_dir(self, payload: Any, run_dir: Path, job_id: str | None, node_rank: int) -> Path | None:
        return None

    def fork_rank(
        self,
        *,
        payload: Any,
        payload_path: Path,
        board: heartbeat.Board,
        gen: int,
        rank: int,
        local_rank: int,
        env: dict[str, str],
        log_path: Path,
        close_fds: list[int],
    ) -> int:
        world = self.sim.world
        agent = world.me()
        from hpc_llm.job.env import SRUN_TASK_VARS

        board.clear(local_rank)
        # what a fork inherits, less the agent's own place in its srun step (the real forker's)
        full = {k: v for k, v in agent.env.items() if k not in SRUN_TASK_VARS}
        full.update(env)
        proc = world.spawn(["sim-rank"], full, agent.host, agent, f"rank{rank}@{agent.host.name}", new_session=True)
        proc.local["rank"] = RankArgs(board, gen, rank, local_rank, payload)
        return proc.pid

    def kill_group(self, pid: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.sim.world.killpg(pid, signal.SIGKILL)

    def remove_stale_boards(self, directory: Path) -> list[Path]:
        return []

    def group(self, env: dict[str, str]) -> Group:
        key = tuple(
            env.get(k, "")
            for k in ("SLURM_JOB_ID", "SLURM_RESTART_COUNT", "HPC_LLM_GENERATION", "MASTER_ADDR", "MASTER_PORT")
        )
        if key not in self.groups:
            self.groups[key] = Group(self.sim, int(env.get("WORLD_SIZE", "1")))
        return self.groups[key]


def _plan(world_size: int, nodes: int, run_dir: Path) -> Any:
    """What RunRecord reads of a job's plan (hpc_llm.config.plan.JobPlan) for results.json's
    skeleton: the simulated run's shape."""
    return SimpleNamespace(
        experiment="sim",
        full_nodes=nodes,
        tasks_per_node=max(1, world_size // max(1, nodes)),
        gpus_per_node=0,
        device="cpu",
        parallelism="ddp",
        world_size=world_size,
        run_dir=str(run_dir),
    )


def latest_checkpoint(run_dir: Path) -> int:
    try:
        return int((RunDir(run_dir).checkpoints / "latest").read_text())
    except (OSError, ValueError):
        return 0


def rank_main(proc: Proc, args: list[str]) -> None:
    """One rank of one generation (see the module docstring)."""
    from hpc_llm.job.env import JobEnv
    from hpc_llm.rundir import epoch
    from hpc_llm.rundir.epoch import Epoch
    from hpc_llm.rundir.record import RunRecord

    sim: Sim = proc.world.sim
    world = proc.world
    hub = sim.hub
    a: RankArgs = proc.local["rank"]
    t = a.payload
    env = JobEnv.current(proc.env)
    world_size = int(proc.env.get("WORLD_SIZE", "1"))
    group = sim.ranks.group(proc.env)
    state: dict[str, Any] = {"batch": -1, "phase": "build", "seq": 0, "stop": False}
    stop_signal = proc.env.get("HPC_LLM_STOP_SIGNAL", "USR2")

    def on_stop(sig: int, frame: Any) -> None:
        state["stop"] = True

    proc.handlers[getattr(signal, f"SIG{stop_signal}")] = on_stop

    def beat() -> None:
        while True:
            state["seq"] += 1
            a.board.write(a.local_rank, a.gen, a.rank, state["seq"], state["batch"], proc.pid, state["phase"])
            world.pause(t.heartbeat_s)

    Thread(world, proc, beat, "beats").start()

    # the rank's epoch, as the real rank holds it (hpc_llm.job.rank.fence.install): its generation's,
    # with the lease on its node's board; every write of the record checks it
    mine = Epoch.parse(env.epoch)
    epoch.install(
        epoch.Holder(
            t.run_dir if mine else None,
            env.job_id if mine else None,
            mine or Epoch(0, 0),
            "rank",
            lease=lambda: fence_state(a.board, a.gen, world),
        )
    )

    def may_write(what: str) -> None:
        """The run's epoch (its generation's lease on the board first): a rank of an ended
        generation writes nothing (it exits, as the real one does when fence.check raises)."""
        why = epoch.refusal(what)
        if why is not None:
            world.trace(proc, f"fenced, not doing {what}: {why}")
            raise SystemExit(1)

    if group_meet(group, proc, a.rank, -1, False) is None:
        raise SystemExit(1)  # the rendezvous timed out
    start = latest_checkpoint(t.run_dir)
    record = None
    if a.rank == 0:
        may_write("opening the attempt")
        nodes = env.nodes
        record = RunRecord.open(
            t.run_dir,
            _plan(world_size, len(nodes) or 1, t.run_dir),
            {},
            job_id=env.job_id,
            restart=env.restart,
            started_at=world.time(),
            generation=env.generation,
            nodes=list(nodes),
            alloc_started_at=env.alloc_start,
        )
        record.note(forked_at=env.forked_at, resumed_at_batch=start, last_batch=start, loaded_at=world.time())
    state["batch"], state["phase"] = start, "train"
    fit_start = world.time()
    noted = hub.now
    batch = start
    while batch < t.max_batches:
        world.pause(t.step_s)
        batch += 1
        stop = group_meet(group, proc, a.rank, batch, bool(state["stop"]))
        if stop is None:
            raise SystemExit(1)  # the collective timed out: a peer is gone
        state["batch"] = batch
        if batch % t.save_every == 0 or stop or batch == t.max_batches:
            state["phase"] = "save"
            may_write("a checkpoint save")
            world.pause(t.save_s)
            if a.rank == 0:
                may_write("linking a checkpoint")
                save_checkpoint(world, t.run_dir, batch)
                assert record is not None
                record.note(checkpoint_batch=batch, last_batch=batch)
                record.trained({"train_loss": loss(batch), "train_loss_history": [[batch, loss(batch)]]})
            state["phase"] = "train"
        if stop:
            if record is not None:
                may_write("the run's record")
                record.note(signal=f"SIG{stop_signal}", stopped_at_batch=batch, save_s=t.save_s)
                record.stopped({"batches_done": batch, "checkpoint": f"ba{batch}"}, batch=batch, cause=None)
            raise SystemExit(0)
        if record is not None and hub.now - noted >= 5.0:
            noted = hub.now
            may_write("the run's record")
            record.note(last_batch=batch, train_s=round(world.time() - fit_start, 3))
    if record is not None:
        state["phase"] = "post"
        may_write("the run's record")
        record.note(last_batch=batch, train_s=round(world.time() - fit_start, 3))
        record.completed({"batches_done": batch, "train_loss": loss(batch)}, batch=batch)


def group_meet(group: Group, proc: Proc, rank: int, batch: int, stop: bool) -> bool | None:
    return group.meet(proc, rank, batch, stop)


def loss(batch: int) -> float:
    return round(10.0 / (1.0 + batch), 6)


def save_checkpoint(world: Any, run_dir: Path, batch: int) -> None:
    """Rank 0 writes the checkpoint of ``batch`` and then points ``latest`` at it (a rename)."""
    folder = RunDir(run_dir).checkpoints
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"ba{batch}").write_text(json.dumps({"batch": batch}))
    tmp = folder / f"latest.tmp-{world.me().pid}"
    tmp.write_text(str(batch))
    world.replace(tmp, folder / "latest")


def fence_state(board: heartbeat.Board, gen: int, world: Any, wait_s: float = 3.0) -> str | None:
    """hpc_llm.job.rank.fence.state, for this simulated rank's board."""
    from hpc_llm.job.rank import fence

    return fence.state_of(board, gen, wait_s, clock=world.monotonic, sleep=world.pause)
