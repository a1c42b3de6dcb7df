"""The node's agent: connect, warm up, then start, signal, watch and end generations of ranks.

One ``selectors`` loop, one thread (forking from it is then safe): the
connection to the supervisor, the probe listener (a request/response check
the supervisor makes on a connection of its own before it calls a node dead:
a frozen process's kernel still accepts a TCP connection, but nobody answers
on it), a self-pipe for SIGCHLD and the stop signals, and a timer for the
beats. Every period the agent sends its ranks' heartbeats from the board and
writes them to the node's heartbeat file.

The fence (:mod:`hpc_llm.job.rank.fence`): every ping from the supervisor
renews the live generation's lease on the board for ``lease_s``. If the loop
itself stalled longer than that (the node was frozen, or starved), the agent
ends its generation before it reads anything (the pings waiting in its socket
buffer are stale) and tells the supervisor. When the connection to the
supervisor is lost, the agent kills its ranks and ends: a rank never runs
unsupervised.

Environment (set by the supervisor for the agent step: :mod:`hpc_llm.job.wire` names it all); the
node's name and index come from Slurm (JobEnv). A lost supervisor: :mod:`~hpc_llm.job.agent.orphan`.
"""

from __future__ import annotations

import contextlib
import logging
import selectors
import shutil
import signal
import sys
import traceback
from pathlib import Path
from typing import Any

from hpc_llm import world
from hpc_llm.job import heartbeat, messages, wire
from hpc_llm.job.agent import orphan
from hpc_llm.job.agent.forker import RankProc, describe_status
from hpc_llm.job.agent.node import board_file, free_port, own_output, rank_env
from hpc_llm.job.agent.ranks import Forked, RankRuntime
from hpc_llm.job.env import EPOCH, FORKED_AT, JobEnv
from hpc_llm.rundir.layout import RunDir

log = logging.getLogger("hpc_llm.agent")

#: how long the agent keeps trying to reach the supervisor at start
CONNECT_S = 60.0
#: a generation's ranks that do not die of SIGKILL within this long are reported stopped anyway
KILL_WAIT_S = 30.0


class Agent:
    def __init__(self, payload_path: Path, supervisor: str, token: str, beat_s: float, lease_s: float) -> None:
        self.payload_path = payload_path
        self.run_dir = RunDir.of_payload(payload_path).root
        self.supervisor = supervisor
        self.token = token
        self.beat_s = beat_s
        self.lease_s = lease_s
        job = JobEnv.current()
        self.node = heartbeat.node_name()
        self.node_id = job.node_id
        self.job_id = job.job_id
        self.job_ref = job.ref
        self.restart = job.restart
        #: (nodes the run needs, nodes submitted with, ranks per node) when the job was submitted
        #: with spares; None: never requeue on the supervisor's loss
        self.requeue_on_loss = wire.requeue_on_loss(world.environ().get(wire.REQUEUE_ON_LOSS))
        #: the supervisor's connection was lost without an ``end`` (``silent``: it stayed open, unused)
        self.orphaned = False
        self.silent = False
        self.heard = world.monotonic()  # the supervisor's last message
        #: the supervisor tells its patience (bounded by SlurmdTimeout); else the default
        told = world.environ().get(wire.SILENT_S)
        self.silent_s = float(told) if told else wire.supervisor_silent_s(beat_s, lease_s)
        self.lost_at = 0.0  # when the supervisor was found gone (wall clock)
        self.payload: Any = None
        self.board: heartbeat.Board | None = None
        self.ranks: dict[int, RankProc] = {}  # pid -> rank
        self.gen: int | None = None  # the generation this node runs (or ran last)
        #: the run's epoch of that generation, as the supervisor told it (hpc_llm.rundir.epoch); at
        #: first the one the agent step was started in
        self.epoch: str | None = job.epoch
        self.live: int | None = None  # the generation whose lease pings renew (None once killed)
        self.killing: dict[int, float] = {}  # generation -> when the kill began
        self.scratch: set[Path] = set()
        #: the ranks: forked from this warm process (the simulator's world models them)
        self.rt: RankRuntime = world.ranks() or Forked()
        self.sel = world.selector()
        self.conn: wire.Conn | None = None
        self.probes: dict[int, tuple[wire.Conn, float]] = {}
        self.done = False
        self.stalled = False
        self.file = heartbeat.Writer(self.run_dir, self.node)
        self._seq = 0
        self._signals: list[int] = []

    # -- start-up ----------------------------------------------------------------
    def run(self) -> int:
        self._install_signals()
        self.listener = wire.listener()
        self.sel.register(self.listener, selectors.EVENT_READ, "listener")
        self.sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        conn = self._connect()
        self.conn = conn
        self.sel.register(self.conn, selectors.EVENT_READ, "supervisor")
        self.conn.send(
            messages.Hello(
                token=self.token,
                node=self.node,
                node_id=self.node_id,
                pid=world.pid(),
                addr=self.conn.sock.getsockname()[0],
                probe_port=self.listener.getsockname()[1],
            )
        )
        self.payload, took = self.rt.warm(self.payload_path)
        log.info("hpc_llm agent on %s: warm in %.1f s (%s)", self.node, took, self.rt.describe(self.payload))
        if stale := self.rt.remove_stale_boards(board_file().parent):
            log.info("hpc_llm agent on %s: removed %d board file(s) of agents gone", self.node, len(stale))
        checked = self.rt.check_node(self.payload)
        log.info("hpc_llm agent on %s: node check %s", self.node, checked)
        self.conn.send(messages.Warm(import_s=round(took, 3), gflops=checked.gflops, failed=checked.failed))
        self.heard = world.monotonic()
        return self._loop()

    def _connect(self) -> wire.Conn:
        deadline = world.monotonic() + CONNECT_S
        while True:
            try:
                return wire.Conn(wire.connect(self.supervisor, timeout_s=5.0))
            except OSError as exc:
                if world.monotonic() > deadline:
                    raise RuntimeError(f"cannot reach the supervisor at {self.supervisor}: {exc}") from exc
                world.sleep(0.5)

    def _install_signals(self) -> None:
        # a signal turns this readable, so the loop's select wakes for it
        self._wake_r, self._drain_wake = world.signal_wakeup()

        def note(signum: int, frame: Any) -> None:
            self._signals.append(signum)

        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, signal.SIGUSR2):
            world.on_signal(sig, note)

    # -- the loop ----------------------------------------------------------------
    def _loop(self) -> int:
        next_beat = world.monotonic()
        last_tick = world.monotonic()
        while not self.done:
            wait = max(0.0, min(next_beat - world.monotonic(), 0.5))
            events = self.sel.select(wait)
            now = world.monotonic()
            if now - last_tick > self.lease_s:
                self._stalled(now - last_tick)
            last_tick = now
            for key, _mask in events:
                self._ready(key)
            self._handle_signals()
            self._reap()
            self._check_kills(now)
            self._expire_probes(now)
            if now >= next_beat:
                self._beat()
                next_beat = now + self.beat_s
            if self.conn is not None and self.conn.wants_write:
                self.conn.flush()
                if self.conn.closed:
                    self._supervisor_lost()
            if self.conn is not None and now - self.heard > self.silent_s:
                self.silent = True
                self._supervisor_lost()
        self._cleanup()
        if self.orphaned and self.requeue_on_loss and not self.stalled and self.job_id and self.job_ref:
            orphan.requeue_orphaned(
                orphan.Orphan(
                    node=self.node,
                    node_id=self.node_id,
                    job_id=self.job_id,
                    job_ref=self.job_ref,
                    restart=self.restart,
                    run_dir=self.run_dir,
                    supervisor=self.supervisor,
                    silent=self.silent,
                    lost_at=self.lost_at,
                    requeue_on_loss=self.requeue_on_loss,
                    epoch=self.epoch,
                )
            )
        return 0

    def _ready(self, key: selectors.SelectorKey) -> None:
        what = key.data
        if what == "supervisor" and self.conn is not None:
            self.heard = world.monotonic()
            for msg in self.conn.receive():
                self._command(msg)
            # a command may have ended this agent's connection (an `end`: self.conn is None then)
            if self.conn is not None and self.conn.closed:
                self._supervisor_lost()
        elif what == "listener":
            with contextlib.suppress(BlockingIOError, OSError):
                sock, _ = self.listener.accept()
                c = wire.Conn(sock)
                self.probes[c.fileno()] = (c, world.monotonic() + 10.0)
                self.sel.register(c, selectors.EVENT_READ, "probe")
        elif what == "probe":
            found = self.probes.get(key.fd)
            if found is None:
                return
            probe = found[0]
            msgs = probe.receive()
            for msg in msgs:
                if isinstance(msg, messages.Probe) and msg.token == self.token:
                    probe.send(messages.Pong(self.node, self.gen))
            if msgs or probe.closed:
                self._drop_probe(key.fd)
        elif what == "wake":
            self._drain_wake()

    def _drop_probe(self, fd: int) -> None:
        c, _ = self.probes.pop(fd, (None, 0.0))
        if c is not None:
            with contextlib.suppress(KeyError, ValueError):
                self.sel.unregister(c)
            c.close()

    def _expire_probes(self, now: float) -> None:
        for fd, (_c, deadline) in list(self.probes.items()):
            if now > deadline:
                self._drop_probe(fd)

    # -- commands from the supervisor ------------------------------------------------
    def _command(self, msg: messages.Message) -> None:
        match msg:
            case messages.Ping():
                self._renew()
            case messages.FindPort(gen=gen):
                self._send(messages.PortFound(gen, free_port()))
            case messages.Start():
                self._start(msg)
            case messages.Signal(gen=gen, signal=name):
                self._signal(gen, name)
            case messages.Kill(gen=gen):
                self._kill(gen)
            case messages.End():
                self._end()

    def _renew(self) -> None:
        if self.board is not None and self.live is not None:
            self.board.set_fence(self.live, world.monotonic() + self.lease_s)

    def _start(self, msg: messages.Start) -> None:
        gen, node_rank, per_node = msg.gen, msg.node_rank, msg.tasks_per_node
        self.rt.check_fork_safe()
        if self.board is None or self.board.slots < per_node:
            if self.board is not None:
                self.board.remove()
            self.board = heartbeat.Board(per_node, board_file())
        self.gen = self.live = gen
        self.epoch = msg.env.get(EPOCH) or self.epoch
        self.stalled = False
        self.board.set_fence(gen, world.monotonic() + self.lease_s)
        base = dict(msg.env)
        scratch = self.rt.scratch_dir(self.payload, self.run_dir, self.job_id, node_rank)
        if scratch is not None:
            self.scratch.add(scratch)
        close = [self._wake_r, self.listener.fileno()]
        close += [c.fileno() for c, _ in self.probes.values()]
        if self.conn is not None:
            close.append(self.conn.fileno())
        started = world.time()
        for local in range(per_node):
            rank = node_rank * per_node + local
            env = {**base, **rank_env(msg, rank, local), FORKED_AT: f"{started:.6f}"}
            pid = self.rt.fork_rank(
                payload=self.payload,
                payload_path=self.payload_path,
                board=self.board,
                gen=gen,
                rank=rank,
                local_rank=local,
                env=env,
                log_path=RunDir(self.run_dir).rank_log(rank),
                close_fds=close,
            )
            self.ranks[pid] = RankProc(gen, rank, local, pid)
        self._send(messages.Started(gen, {p.rank: p.pid for p in self._of(gen)}))

    def _of(self, gen: int) -> list[RankProc]:
        return [p for p in self.ranks.values() if p.gen == gen]

    def _signal(self, gen: int, name: str) -> None:
        sig = signal.Signals[name if name.startswith("SIG") else f"SIG{name}"]
        for p in self._of(gen):
            if p.alive:
                with contextlib.suppress(ProcessLookupError):
                    world.kill(p.pid, sig)

    def _kill(self, gen: int) -> None:
        if self.board is not None and self.live == gen:
            self.live = None
            self.board.set_fence(heartbeat.NO_GENERATION, 0.0)
        for p in self._of(gen):
            if p.alive:
                p.killed = True
                self.rt.kill_group(p.pid)
        self.killing.setdefault(gen, world.monotonic())
        self._check_kills(world.monotonic())

    def _check_kills(self, now: float) -> None:
        for gen, began in list(self.killing.items()):
            alive = [p for p in self._of(gen) if p.alive]
            if not alive or now - began > KILL_WAIT_S:
                del self.killing[gen]
                self._send(messages.Stopped(gen, tuple(p.rank for p in alive)))

    def _end(self) -> None:
        for gen in {p.gen for p in self.ranks.values() if p.alive}:
            self._kill(gen)
        self._send(messages.Bye("ended"))
        self.done = True

    # -- what happens on its own ---------------------------------------------------
    def _handle_signals(self) -> None:
        while self._signals:
            sig = self._signals.pop(0)
            if sig == signal.SIGUSR2 and self.gen is not None:
                # scancel --signal=USR2 without --batch: every step's tasks get it; pass it on
                self._signal(self.gen, "USR2")
            elif sig in (signal.SIGTERM, signal.SIGINT):
                log.warning("hpc_llm agent on %s: %s: ending the ranks", self.node, signal.Signals(sig).name)
                for p in self.ranks.values():
                    if p.alive:
                        p.killed = True
                        self.rt.kill_group(p.pid)
                self._send(messages.Bye(signal.Signals(sig).name))
                self.done = True

    def _reap(self) -> None:
        for pid, code in world.reap():
            p = self.ranks.get(pid)
            if p is None:
                continue
            p.status = code
            self.rt.kill_group(pid)  # whatever the rank started dies with it
            if self.board is not None and p.gen == self.gen:
                self.board.clear(p.local_rank)  # an ended rank beats no more
            self._send(messages.Exit(p.gen, p.rank, self.node, code, describe_status(code), p.killed))

    def _stalled(self, gap: float) -> None:
        """The loop did not run for ``gap`` s, longer than the lease: the node was frozen or starved,
        and the supervisor may have given up on it. End the generation before reading anything."""
        log.error(
            "hpc_llm agent on %s: stalled for %.1f s (longer than the %.1f s lease)", self.node, gap, self.lease_s
        )
        self.stalled = True  # the node's file is left as it was: another generation may run elsewhere
        if self.gen is not None:
            self._kill(self.gen)
            self._send(messages.Stalled(self.gen, round(gap, 3)))

    def _supervisor_lost(self) -> None:
        if self.conn is None:
            return
        how = "silent for %.0f s" % (world.monotonic() - self.heard) if self.silent else "gone"
        log.error("hpc_llm agent on %s: the supervisor's connection is %s: ending the ranks", self.node, how)
        self.lost_at = world.time()
        with contextlib.suppress(KeyError, ValueError):
            self.sel.unregister(self.conn)
        self.conn = None
        self.live = None
        self.orphaned = True
        if self.board is not None:
            self.board.set_fence(heartbeat.NO_GENERATION, 0.0)
        for p in self.ranks.values():
            if p.alive:
                p.killed = True
                self.rt.kill_group(p.pid)
        self.done = True

    def _beat(self) -> None:
        self._seq += 1
        beats: list[messages.RankBeat] = []
        slots: list[heartbeat.Beat | None] = []
        if self.board is not None:
            for local in range(self.board.slots):
                got = self.board.read(local)
                if got is None:
                    slots.append(None)
                    continue
                gen, rank, seq, batch, pid, ph, (win, busy, wall) = got
                slots.append(heartbeat.Beat(rank, seq, batch, self.node, pid, ph, gen))
                beats.append(messages.RankBeat(rank, seq, batch, ph, pid, gen, win, busy, wall))
        if any(slots) and not self.stalled:
            self.file.write(slots)
        self._send(messages.Beat(self._seq, tuple(beats)))

    def _send(self, msg: messages.Message) -> None:
        if self.conn is not None:
            self.conn.send(msg)
            if self.conn.closed:
                # the write found the connection gone: forget it now, before its file descriptor
                # number is handed to the next accepted socket
                self._supervisor_lost()

    def _cleanup(self) -> None:
        deadline = world.monotonic() + KILL_WAIT_S
        while any(p.alive for p in self.ranks.values()) and world.monotonic() < deadline:
            self._reap()
            world.sleep(0.05)
        if self.conn is not None:
            self.conn.flush()
            self.conn.close()
        self.file.close()
        if self.board is not None:
            self.board.remove()
        for path in self.scratch:
            shutil.rmtree(path, ignore_errors=True)
            with contextlib.suppress(OSError):
                path.parent.rmdir()  # hpc_llm-<job>/, once no node dir is left in it


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if len(args) == 1 and JobEnv.current().on_slurm:
        own_output(Path(args[0]))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s: %(message)s")
    if len(args) != 1:
        raise SystemExit("usage: python -m hpc_llm.job.agent <payload.pkl>")
    env = world.environ()
    if wire.SUPERVISOR not in env or wire.TOKEN not in env:
        raise SystemExit(f"hpc_llm.job.agent: {wire.SUPERVISOR} and {wire.TOKEN} are set by the job's supervisor")
    agent = Agent(
        Path(args[0]),
        env[wire.SUPERVISOR],
        env[wire.TOKEN],
        beat_s=float(env.get("HPC_LLM_HEARTBEAT_S") or 1.0),
        lease_s=float(env.get(wire.LEASE_S) or 5.0),
    )
    try:
        code = agent.run()
    except Exception as exc:  # a bug of the agent, not a dead node: say so before going
        log.error("hpc_llm agent failed:\n%s", traceback.format_exc())
        if agent.conn is not None:
            agent.conn.send(messages.Bye(f"agent error: {type(exc).__name__}: {exc}"))
            agent.conn.flush()
        for p in agent.ranks.values():
            if p.alive:
                agent.rt.kill_group(p.pid)
        code = 1
    raise SystemExit(code)
