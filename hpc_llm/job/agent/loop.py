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

Environment (set by the supervisor for the agent step): ``HPC_LLM_SUPERVISOR``
(host:port), ``HPC_LLM_AGENT_TOKEN``, ``HPC_LLM_HEARTBEAT_S``,
``HPC_LLM_LEASE_S``; the node's name and index come from Slurm (JobEnv).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import selectors
import shutil
import signal
import socket
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

from hpc_llm.job import heartbeat, messages, wire
from hpc_llm.job.agent import forker, warm
from hpc_llm.job.agent.forker import RankProc
from hpc_llm.job.env import FORKED_AT, JobEnv
from hpc_llm.ports import PORT_BASE, PORT_SPAN
from hpc_llm.rundir.layout import RunDir

log = logging.getLogger("hpc_llm.agent")

#: how long the agent keeps trying to reach the supervisor at start
CONNECT_S = 60.0
#: a generation's ranks that do not die of SIGKILL within this long are reported stopped anyway
KILL_WAIT_S = 30.0
#: an orphaned agent waits this long x its node index before it requeues the job: the first one
#: alive asks, the others find the job requeued already
ORPHAN_STAGGER_S = 2.0
#: an orphaned agent waits this long before it asks the supervisor's address whether it refuses
ORPHAN_SETTLE_S = 0.3
#: an orphaned agent whose supervisor's host does not refuse a connection (frozen, or cut off from
#: this node only) waits for Slurm's verdict on that host this long beyond SlurmdTimeout
VERDICT_SLACK_S = 60.0
VERDICT_POLL_S = 2.0


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
        self.requeue_on_loss = wire.requeue_on_loss(os.environ.get(wire.REQUEUE_ON_LOSS))
        #: the supervisor's connection was lost without an ``end`` (``silent``: it stayed open, unused)
        self.orphaned = False
        self.silent = False
        self.heard = time.monotonic()  # the supervisor's last message
        self.silent_s = wire.supervisor_silent_s(beat_s, lease_s)
        self.lost_at = 0.0  # when the supervisor was found gone (wall clock)
        self.payload: Any = None
        self.board: heartbeat.Board | None = None
        self.ranks: dict[int, RankProc] = {}  # pid -> rank
        self.gen: int | None = None  # the generation this node runs (or ran last)
        self.live: int | None = None  # the generation whose lease pings renew (None once killed)
        self.killing: dict[int, float] = {}  # generation -> when the kill began
        self.scratch: set[Path] = set()
        self.sel = selectors.DefaultSelector()
        self.conn: wire.Conn | None = None
        self.probes: dict[int, tuple[wire.Conn, float]] = {}
        self.done = False
        self.stalled = False
        self.file = heartbeat.Writer(self.run_dir, self.node)
        self._seq = 0
        self._wake_r, self._wake_w = os.pipe()
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
                pid=os.getpid(),
                addr=self.conn.sock.getsockname()[0],
                probe_port=self.listener.getsockname()[1],
            )
        )
        self.payload, took = warm.warm(self.payload_path)
        log.info("hpc_llm agent on %s: warm in %.1f s (%s)", self.node, took, warm.describe(self.payload))
        if stale := heartbeat.remove_stale_boards(board_file().parent):
            log.info("hpc_llm agent on %s: removed %d board file(s) of agents gone", self.node, len(stale))
        self.conn.send(messages.Warm(import_s=round(took, 3)))
        self.heard = time.monotonic()
        return self._loop()

    def _connect(self) -> wire.Conn:
        deadline = time.monotonic() + CONNECT_S
        while True:
            try:
                return wire.Conn(wire.connect(self.supervisor, timeout_s=5.0))
            except OSError as exc:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"cannot reach the supervisor at {self.supervisor}: {exc}") from exc
                time.sleep(0.5)

    def _install_signals(self) -> None:
        os.set_blocking(self._wake_w, False)
        signal.set_wakeup_fd(self._wake_w, warn_on_full_buffer=False)

        def note(signum: int, frame: Any) -> None:
            self._signals.append(signum)

        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, signal.SIGUSR2):
            signal.signal(sig, note)

    # -- the loop ----------------------------------------------------------------
    def _loop(self) -> int:
        next_beat = time.monotonic()
        last_tick = time.monotonic()
        while not self.done:
            wait = max(0.0, min(next_beat - time.monotonic(), 0.5))
            events = self.sel.select(wait)
            now = time.monotonic()
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
        if self.orphaned and self.requeue_on_loss:
            self._requeue_orphaned()
        return 0

    def _ready(self, key: selectors.SelectorKey) -> None:
        what = key.data
        if what == "supervisor" and self.conn is not None:
            self.heard = time.monotonic()
            for msg in self.conn.receive():
                self._command(msg)
            if self.conn.closed:
                self._supervisor_lost()
        elif what == "listener":
            with contextlib.suppress(BlockingIOError, OSError):
                sock, _ = self.listener.accept()
                c = wire.Conn(sock)
                self.probes[c.fileno()] = (c, time.monotonic() + 10.0)
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
            with contextlib.suppress(BlockingIOError):
                os.read(self._wake_r, 4096)

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
            self.board.set_fence(self.live, time.monotonic() + self.lease_s)

    def _start(self, msg: messages.Start) -> None:
        gen, node_rank, per_node = msg.gen, msg.node_rank, msg.tasks_per_node
        warm.check_fork_safe()
        if self.board is None or self.board.slots < per_node:
            if self.board is not None:
                self.board.remove()
            self.board = heartbeat.Board(per_node, board_file())
        self.gen = self.live = gen
        self.stalled = False
        self.board.set_fence(gen, time.monotonic() + self.lease_s)
        base = dict(msg.env)
        scratch = warm.scratch_dir(self.payload, self.run_dir, self.job_id, node_rank)
        if scratch is not None:
            self.scratch.add(scratch)
        close = [self._wake_r, self._wake_w, self.listener.fileno()]
        close += [c.fileno() for c, _ in self.probes.values()]
        if self.conn is not None:
            close.append(self.conn.fileno())
        started = time.time()
        for local in range(per_node):
            rank = node_rank * per_node + local
            env = {**base, **rank_env(msg, rank, local, node_rank), FORKED_AT: f"{started:.6f}"}
            pid = forker.fork_rank(
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
                    os.kill(p.pid, sig)

    def _kill(self, gen: int) -> None:
        if self.board is not None and self.live == gen:
            self.live = None
            self.board.set_fence(heartbeat.NO_GENERATION, 0.0)
        for p in self._of(gen):
            if p.alive:
                p.killed = True
                forker.kill_group(p.pid)
        self.killing.setdefault(gen, time.monotonic())
        self._check_kills(time.monotonic())

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
                        forker.kill_group(p.pid)
                self._send(messages.Bye(signal.Signals(sig).name))
                self.done = True

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            p = self.ranks.get(pid)
            if p is None:
                continue
            p.status = code = os.waitstatus_to_exitcode(status)
            forker.kill_group(pid)  # whatever the rank started dies with it
            if self.board is not None and p.gen == self.gen:
                self.board.clear(p.local_rank)  # an ended rank beats no more
            self._send(messages.Exit(p.gen, p.rank, self.node, code, forker.describe_status(code), p.killed))

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
        how = "silent for %.0f s" % (time.monotonic() - self.heard) if self.silent else "gone"
        log.error("hpc_llm agent on %s: the supervisor's connection is %s: ending the ranks", self.node, how)
        self.lost_at = time.time()
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
                forker.kill_group(p.pid)
        self.done = True

    def _requeue_orphaned(self) -> None:
        """The supervisor is gone without an ``end`` and the job has spares (--no-kill): its batch
        host died, and Slurm keeps the job RUNNING with no batch script (docs/design.md, "Spare
        nodes"). Requeue it, once, with that host excluded, and leave what was seen for the next
        allocation's supervisor to book. The agents ask in node order, each only while the job
        still runs this allocation. Not when this node itself was frozen (its loop stalled: the
        supervisor left it out), nor while the supervisor still accepts connections after it
        closed ours (it dropped this agent). A host that neither answers nor refuses (frozen,
        powered off, or cut off from this node alone) is judged by Slurm: requeue only once
        slurmctld finds it not responding too."""
        from hpc_llm.job.supervisor import slurm_job

        if self.stalled or not self.job_id or not self.job_ref:
            return
        # a process being killed closes its sockets one by one: asked 1 ms after our connection
        # dropped, its listener still accepted, and the agent took the supervisor for alive
        time.sleep(ORPHAN_SETTLE_S)
        try:
            wire.connect(self.supervisor, timeout_s=2.0).close()
            refused = False
        except ConnectionRefusedError:
            refused = True  # the host is up, the supervisor's process is not
        except OSError:
            refused = False  # no answer at all
        else:
            if not self.silent:
                log.warning("hpc_llm agent on %s: the supervisor dropped this agent: not requeueing", self.node)
                return
        # the batch host (whose death orphans us) is the allocation's first node: the next asks at
        # once
        time.sleep(ORPHAN_STAGGER_S * max(0, self.node_id - 1))
        log.info(
            "hpc_llm agent on %s: the supervisor's address %s: asking Slurm",
            self.node,
            "refuses" if refused else "does not answer",
        )
        info = self._job_info()
        host = info.get("BatchHost") or "?"
        how = "refused connections" if refused else None
        if not refused:
            deadline = time.monotonic() + slurm_job.slurmd_timeout_s(slurm_job.slurm_config()) + VERDICT_SLACK_S
            log.warning("hpc_llm agent on %s: waiting for Slurm's verdict on the batch host %s", self.node, host)
            # staggered like the first ask: at scale, not every agent polls slurmctld at once
            while host == "?" or not slurm_job.node_gone(host):
                time.sleep(VERDICT_POLL_S + ORPHAN_STAGGER_S * (self.node_id % 8))
                info = self._job_info()
                host = info.get("BatchHost") or host
                if time.monotonic() > deadline or (info and not self._still_ours(info)):
                    log.warning("hpc_llm agent on %s: Slurm still finds %s alive: not requeueing", self.node, host)
                    return
            how = "not responding to slurmctld"
            info = self._job_info()
        if not self._still_ours(info):
            log.warning("hpc_llm agent on %s: the job is %s already: not requeueing", self.node, info.get("JobState"))
            return
        # decided and recorded first: the requeue ends this agent's step within seconds. The job
        # asks for what the partition can still hold (slurm_job.fit_partition): with every node
        # of it allocated, a job whose batch host died would otherwise pend until an operator
        # returns that host
        needed, full, per_node = self.requeue_on_loss or (0, 0, 1)
        exclude = [n for n in slurm_job.hostnames(info.get("ExcNodeList")) if n != host]
        exclude += [host] if host != "?" else []
        asked = len(slurm_job.hostnames(info.get("NodeList"))) or full
        sized = slurm_job.fit_partition(asked, full, needed, exclude, info.get("Partition") or None)
        seen = {
            "job_id": self.job_id,
            "restart": self.restart,
            "node": host,
            "how": how,
            "by": self.node,
            "detected_at": self.lost_at,
            "requeued_at": time.time(),
            "exclude_error": None if host != "?" else "no BatchHost",
            "shrunk": sized[1] if sized else None,
        }
        with contextlib.suppress(OSError):
            RunDir(self.run_dir).supervisor_lost.write_text(json.dumps(seen))
        log.info("hpc_llm agent on %s: job %s is %s: requeueing it", self.node, self.job_ref, info.get("JobState"))
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        err = slurm_job.requeue_job(self.job_ref)
        if err:
            with contextlib.suppress(OSError):
                RunDir(self.run_dir).supervisor_lost.unlink()
            log.error("hpc_llm agent on %s: the supervisor is gone; scontrol requeue failed: %s", self.node, err)
            return
        err = slurm_job.update_pending(
            self.job_ref,
            exclude=exclude if host != "?" else None,
            nodes=sized[0] if sized else None,
            per_node=per_node,
        ) or ("no BatchHost" if host == "?" else None)
        held = slurm_job.hold_if_dead_node_lingers(self.job_ref)
        log.warning(
            "hpc_llm agent on %s: the supervisor is gone, its batch host %s %s: job requeued%s%s%s",
            self.node,
            host,
            how,
            f" (could not exclude {host}: {err})" if err else f", {host} excluded",
            f"; {sized[1]}" if sized and not err else "",
            f"; could not hold it: {held}" if held else "",
        )

    def _job_info(self) -> dict[str, str]:
        """``scontrol show job``, asked up to 5 times: one slow answer from slurmctld must not
        leave a job with no supervisor RUNNING until its time limit ({} when it never answers)."""
        from hpc_llm.job.supervisor import slurm_job

        for i in range(5):
            info = slurm_job.scontrol_show_job(self.job_id or "")
            if info:
                return info
            time.sleep(2.0 * (i + 1))
        return {}

    def _still_ours(self, info: dict[str, str]) -> bool:
        """The job still runs the allocation this agent belongs to."""
        return info.get("JobState") == "RUNNING" and info.get("Restarts", "0") == str(self.restart)

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
                gen, rank, seq, batch, pid, ph = got
                slots.append(heartbeat.Beat(rank, seq, batch, self.node, pid, ph, gen))
                beats.append(messages.RankBeat(rank, seq, batch, ph, pid, gen))
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
        deadline = time.monotonic() + KILL_WAIT_S
        while any(p.alive for p in self.ranks.values()) and time.monotonic() < deadline:
            self._reap()
            time.sleep(0.05)
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


def board_file() -> Path:
    """This agent's board file: in /dev/shm (memory, and per job where Slurm's job_container
    gives each job its own), else the temp dir; named by the agent's pid."""
    shm = Path("/dev/shm")
    base = shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())
    return base / f"{heartbeat.BOARD_PREFIX}{os.getpid()}"


def rank_env(msg: messages.Start, rank: int, local_rank: int, node_rank: int) -> dict[str, str]:
    """What srun gives task ``rank`` of a step of ``nnodes`` x ``tasks_per_node`` tasks, plus the
    rendezvous: every rank reads them through JobEnv, as it did as an srun task."""
    per_node, nnodes = msg.tasks_per_node, msg.nnodes
    world = per_node * nnodes
    layout = f"{per_node}(x{nnodes})" if nnodes > 1 else str(per_node)
    return {
        "SLURM_PROCID": str(rank),
        "SLURM_LOCALID": str(local_rank),
        "SLURM_NODEID": str(node_rank),
        "SLURM_NTASKS": str(world),
        "SLURM_STEP_NUM_TASKS": str(world),
        "SLURM_STEP_NUM_NODES": str(nnodes),
        "SLURM_NNODES": str(nnodes),
        "SLURM_STEP_TASKS_PER_NODE": layout,
        "SLURM_TASKS_PER_NODE": layout,
        "MASTER_ADDR": msg.master_addr,
        "MASTER_PORT": str(msg.master_port),
    }


def free_port() -> int:
    """A port free on this node now, for the generation's rendezvous (torch's TCPStore binds it),
    outside the kernel's ephemeral range.

    A port from ``bind(0)`` is an ephemeral one: any outgoing connection on the node may take it
    as its source port before rank 0's store binds it, and a rank on the same host that retries
    its connection to it before the store listens can be handed it as its own source port and
    connect to itself (TCP self-connect: connect() succeeds, no store answers). Seen under load
    on the dev cluster, where every node is one host: a generation stuck in start-up with both
    ranks in "build", and "Gloo connectFullMesh failed". The ports of the srun path
    (``hpc_llm.ports.PORT_BASE`` + ``PORT_SPAN``, below 32768) are used instead, from a random start
    (two jobs on one node), the first that binds."""
    lo, hi = wire.ephemeral_ports()
    start = random.randrange(PORT_SPAN)
    for i in range(PORT_SPAN):
        port = PORT_BASE + (start + i) % PORT_SPAN
        if lo <= port <= hi:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("", port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:  # every one taken: any free port
        s.bind(("", 0))
        return int(s.getsockname()[1])


def own_output(payload_path: Path) -> None:
    """This agent's stdout and stderr straight into its log file, and stdin from /dev/null: not
    through srun. srun writes a step's ``--output`` files itself, so once it dies with the batch
    host, what an agent writes through it reaches no file, and those are the lines that say what
    the orphaned agents did. The file is the one srun's ``--output`` names (append mode, as
    srun opens it), which keeps what came before this call."""
    job = JobEnv.current()
    path = RunDir.of_payload(payload_path).agent_log(job.rank)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
    except OSError:
        return  # srun's file it is
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.dup2(null, 0)
    os.close(fd)
    os.close(null)


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if len(args) == 1 and JobEnv.current().on_slurm:
        own_output(Path(args[0]))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s: %(message)s")
    if len(args) != 1:
        raise SystemExit("usage: python -m hpc_llm.job.agent <payload.pkl>")
    env = os.environ
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
                forker.kill_group(p.pid)
        code = 1
    raise SystemExit(code)
