"""The agents as the supervisor sees them: one per node, over TCP, served by an I/O thread.

The thread (:meth:`Fleet._serve`, one ``selectors`` loop) accepts the agents'
connections (a hello with the allocation's token), reads their messages,
sends every live agent a ping each period (the ping renews the lease of the
agent's generation, :mod:`hpc_llm.job.rank.fence`) and judges liveness by the
supervisor's own clock. It runs apart from the supervisor's main loop so that
a slow ``scontrol`` there never holds the pings, and it hands everything that
needs a decision to the main loop as events (:meth:`Fleet.events`).

A node is declared dead in two steps, never on silence alone:

1. **suspect**: its agent has been silent for ``node_timeout_s`` (no beat, while
   beats come every ``beat_s``), or its connection dropped without a ``bye``;
   the agent gets no more pings from then on, so its lease runs out;
2. **confirmed**: a request/response probe on a connection of its own, to the
   agent's probe port, is not answered within ``probe_timeout_s`` (a refused
   or unreachable connection fails it at once). A SIGSTOPped agent's kernel
   still accepts the TCP connection, but nobody answers on it.

What the probe's failure says is kept (:class:`~hpc_llm.job.supervisor.events.Dead`'s
``host_answers``): a refused connection is the host answering that nothing listens (the
agent died, the node lives: a new agent there, the node no more than a suspect); no answer
at all (a timeout, EHOSTUNREACH) is the host gone, frozen or cut off, or this supervisor
cut off from it. An agent that answers the probe is live again. One that said ``bye`` left
on purpose (the end) or of its own error (a bug, not the node): that is an event
of its own, never a dead node. The declaration of a dead node comes no sooner
than the agent's lease runs out (``lease_s`` after the last ping), so a
generation started after it can never overlap a rank that still holds a lease.
Stdlib only.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import queue
import selectors
import socket
import threading
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from hpc_llm import world
from hpc_llm.job import heartbeat, messages, wire
from hpc_llm.job.supervisor.events import Cleared, Dead, FleetEvent, Heard, Joined, Suspect

log = logging.getLogger("hpc_llm.supervisor")


class AgentState(str, Enum):
    """What an agent is, as the supervisor knows it."""

    IMPORTING = "importing"
    WARM = "warm"
    SUSPECT = "suspect"
    DEAD = "dead"
    GONE = "gone"

    def __str__(self) -> str:
        return self.value


IMPORTING, WARM, SUSPECT, DEAD, GONE = AgentState


@dataclass
class AgentView:
    node: str
    node_id: int
    pid: int
    addr: str
    probe_port: int
    conn: wire.Conn
    state: AgentState = IMPORTING
    last_heard: float = field(default_factory=world.monotonic)
    last_ping: float = 0.0
    import_s: float | None = None
    #: its node's own checks, sent with ``warm`` (hpc_llm.job.agent.node_check)
    gflops: float | None = None
    failed: str | None = None
    #: rank -> its latest beat, as this agent last sent it
    beats: dict[int, heartbeat.Beat] = field(default_factory=dict)
    #: why it is suspect, dead or gone
    why: str | None = None
    suspect_since: float | None = None

    @property
    def alive(self) -> bool:
        return self.state in (IMPORTING, WARM, SUSPECT)


@dataclass
class _Probe:
    node: str
    sock: Any
    deadline: float
    sent: bool = False
    buf: bytes = b""


class Fleet:
    def __init__(
        self,
        token: str,
        *,
        beat_s: float,
        node_timeout_s: float,
        probe_timeout_s: float,
        lease_s: float,
        host: str = "0.0.0.0",
    ) -> None:
        self.token = token
        self.beat_s = beat_s
        self.node_timeout_s = node_timeout_s
        self.probe_timeout_s = probe_timeout_s
        self.lease_s = lease_s
        self.longest_stall = 0.0
        self.last_turn = world.monotonic()
        self.listener = wire.listener(host)
        self.port = int(self.listener.getsockname()[1])
        self.agents: dict[str, AgentView] = {}
        self._pending: dict[int, wire.Conn] = {}
        self._probes: dict[int, _Probe] = {}
        self._events: queue.Queue[FleetEvent] = world.event_queue()
        # taken only around work that never waits (the simulator runs both sides in one thread)
        self._lock = threading.Lock()
        self._sel = world.selector()
        self._stop = threading.Event()
        self._thread = world.thread(self._serve, "hpc_llm-fleet")

    # -- the main loop's side ----------------------------------------------------------
    def start(self) -> None:
        self._sel.register(self.listener, selectors.EVENT_READ, ("listen", None))
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        with self._lock:
            for a in self.agents.values():
                a.conn.close()
            self.listener.close()

    def take_stall(self) -> float:
        """The longest stall of the I/O loop since the last call (seconds), then forget it. The
        stall still running counts: thawed, the main loop may decide before this loop turns."""
        with self._lock:
            out = max(self.longest_stall, world.monotonic() - self.last_turn)
            self.longest_stall = 0.0
        return out

    def events(self, timeout: float = 0.0) -> list[FleetEvent]:
        """What happened since the last call (waits up to ``timeout`` for the first)."""
        out: list[FleetEvent] = []
        try:
            out.append(self._events.get(timeout=timeout) if timeout > 0 else self._events.get_nowait())
            while True:
                out.append(self._events.get_nowait())
        except queue.Empty:
            pass
        return out

    def send(self, node: str, msg: messages.Message) -> None:
        with self._lock:
            a = self.agents.get(node)
            if a is not None and a.alive:
                a.conn.send(msg)

    def view(self) -> dict[str, AgentView]:
        with self._lock:
            return dict(self.agents)

    def beats(self) -> dict[int, heartbeat.Beat]:
        """Every rank's latest beat from the agents still alive, by global rank."""
        with self._lock:
            out: dict[int, heartbeat.Beat] = {}
            for a in self.agents.values():
                if a.alive:
                    out.update(a.beats)
            return out

    def declare_dead(self, node: str, why: str) -> None:
        """The main loop's own verdict (e.g. the srun step lost the node): as a failed probe."""
        with self._lock:
            a = self.agents.get(node)
            if a is not None and a.alive:
                self._dead(a, why)

    # -- the I/O thread ------------------------------------------------------------------
    def _serve(self) -> None:
        next_ping = self.last_turn = world.monotonic()
        while not self._stop.is_set():
            # the longest this loop went without a turn: a frozen process (its host frozen) that
            # sent no ping for longer than the agents wait for one (Supervisor._facts)
            self.longest_stall = max(self.longest_stall, world.monotonic() - self.last_turn)
            self.last_turn = world.monotonic()
            for key, mask in self._sel.select(timeout=0.1):
                kind, ref = key.data
                with self._lock:
                    try:
                        if kind == "listen":
                            self._accept()
                        elif kind == "pending":
                            self._greet(ref)
                        elif kind == "agent":
                            self._read(ref)
                        elif kind == "probe":
                            self._probe_io(key.fd, mask)
                    except Exception:  # noqa: BLE001 - every agent's liveness rides on this thread
                        # one peer's surprise must not end the I/O thread (then no agent gets a
                        # ping, and every one gives its supervisor up): drop that connection
                        log.exception("hpc_llm supervisor: fleet I/O on %s %s failed; dropping it", kind, ref)
                        self._drop(key)
            now = world.monotonic()
            with self._lock:
                self._judge(now)
                if now >= next_ping:
                    next_ping = now + self.beat_s
                    for a in self.agents.values():
                        if a.state in (IMPORTING, WARM):
                            a.conn.send(messages.Ping())
                            a.last_ping = now
                for a in self.agents.values():
                    if a.conn.wants_write:
                        a.conn.flush()

    def _accept(self) -> None:
        """Every connection waiting, not one: each turn of this loop walks every agent (judge,
        ping, flush), so one accept a turn made 2,048 agents starting together cost 2,048 turns,
        O(n^2): on a 2-core machine under load their hellos were not all in after 5 s."""
        while True:
            try:
                sock, _ = self.listener.accept()
            except (BlockingIOError, OSError):
                return
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                c = wire.Conn(sock)
                self._sel.register(c, selectors.EVENT_READ, ("pending", c.fileno()))
            except OSError:  # reset as soon as it came: it never said hello
                sock.close()
                continue
            self._pending[c.fileno()] = c

    def _drop(self, key: selectors.SelectorKey) -> None:
        """Forget a connection whose handling failed: an agent's is then a dropped agent's (suspect,
        probed), a pending or probe one is closed."""
        with contextlib.suppress(KeyError, ValueError, OSError):
            self._sel.unregister(key.fileobj)
        kind, ref = key.data
        if kind == "agent" and ref in self.agents and self.agents[ref].alive:
            self.agents[ref].conn.close()
            self._suspect(self.agents[ref], "its connection failed", world.monotonic())
        elif kind == "pending":
            c = self._pending.pop(ref, None)
            if c is not None:
                c.close()
        elif kind == "probe":
            with contextlib.suppress(Exception):
                self._probe_done(key.fd, None)

    def _greet(self, fd: int) -> None:
        c = self._pending.get(fd)
        if c is None:
            return
        msgs = c.receive()
        if not msgs and not c.closed:
            return
        self._pending.pop(fd, None)
        self._sel.unregister(c)
        hello = msgs[0] if msgs else None
        if not isinstance(hello, messages.Hello) or hello.token != self.token:
            c.close()
            return
        if hello.v != messages.VERSION:
            # an agent of another hpc_llm (an image built from an older one) would misread us
            log.error(
                "hpc_llm supervisor: the agent on %s speaks wire version %s, this supervisor %s: refused",
                hello.node,
                hello.v,
                messages.VERSION,
            )
            c.close()
            return
        node = hello.node
        old = self.agents.get(node)
        if old is not None and old.alive:
            # a second agent for one node is a mistake of the launch: keep the first
            c.close()
            return
        a = AgentView(
            node=node, node_id=hello.node_id, pid=hello.pid, addr=hello.addr, probe_port=hello.probe_port, conn=c
        )
        self.agents[node] = a
        self._events.put(Joined(node))
        for msg in msgs[1:]:
            self._message(a, msg)
        if c.closed:
            # said hello and went at once (its process ended, the connection was reset): a dropped
            # agent, suspect and probed. Registering its closed socket raised ValueError and ended
            # this thread (seen beside 2,048 agents on a busy machine: their process had died).
            if a.state != GONE:
                self._suspect(a, "its connection dropped", world.monotonic())
            return
        self._sel.register(c, selectors.EVENT_READ, ("agent", node))

    def _read(self, node: str) -> None:
        a = self.agents.get(node)
        if a is None:
            return
        msgs = a.conn.receive()
        if msgs:
            a.last_heard = world.monotonic()
        for msg in msgs:
            self._message(a, msg)
        if a.conn.closed and a.alive:
            with contextlib.suppress(KeyError, ValueError):
                self._sel.unregister(a.conn)
            if a.state == GONE:
                return
            # dropped without a word: suspect at once, and ask it on a connection of its own
            self._suspect(a, "its connection dropped", world.monotonic())

    def _message(self, a: AgentView, msg: messages.Message) -> None:
        if isinstance(msg, messages.Beat):
            for b in msg.ranks:
                a.beats[b.rank] = heartbeat.Beat(
                    b.rank, b.seq, b.batch, a.node, b.pid, b.phase, b.gen, b.win, b.busy_s, b.wall_s
                )
            if a.state == SUSPECT and not a.conn.closed:
                self._cleared(a)
            return
        if isinstance(msg, messages.Warm):
            a.state, a.import_s, a.gflops, a.failed = WARM, msg.import_s, msg.gflops, msg.failed
        elif isinstance(msg, messages.Bye):
            a.state, a.why = GONE, msg.why
            with contextlib.suppress(KeyError, ValueError):
                self._sel.unregister(a.conn)
            a.conn.close()
        self._events.put(Heard(a.node, msg))

    def _judge(self, now: float) -> None:
        for a in self.agents.values():
            if a.state == WARM and now - a.last_heard > self.node_timeout_s:
                self._suspect(a, f"silent for {now - a.last_heard:.1f} s", now)
        for fd, p in list(self._probes.items()):
            if now > p.deadline:
                self._probe_done(fd, None, reached=p.sent)

    def _suspect(self, a: AgentView, why: str, now: float) -> None:
        if a.state == SUSPECT:
            return
        a.state, a.why, a.suspect_since = SUSPECT, why, now
        self._events.put(Suspect(a.node, why))
        if not a.addr:  # nothing to ask on another host: this host's loopback would answer for it
            self._dead(a, f"{why}, and it gave no address to probe")
            return
        sock, err = world.connect_nowait(a.addr, a.probe_port)
        if err not in (0, errno.EINPROGRESS, errno.EWOULDBLOCK):
            sock.close()
            self._dead(a, f"{why}, and {probe_failed(err)}", host_answers=err in HOST_ANSWERED)
            return
        p = _Probe(a.node, sock, now + self.probe_timeout_s)
        self._probes[sock.fileno()] = p
        self._sel.register(sock, selectors.EVENT_WRITE, ("probe", a.node))

    def _probe_io(self, fd: int, mask: int) -> None:
        p = self._probes.get(fd)
        if p is None:
            return
        if not p.sent:
            err = p.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if err:
                self._probe_done(fd, probe_failed(err), host_answers=err in HOST_ANSWERED)
                return
            with contextlib.suppress(OSError):
                p.sock.send(messages.encode(messages.Probe(self.token)))
            p.sent = True
            self._sel.modify(p.sock, selectors.EVENT_READ, ("probe", p.node))
            return
        try:
            chunk = p.sock.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        p.buf += chunk
        if any(isinstance(messages.decode(line), messages.Pong) for line in p.buf.split(b"\n")[:-1]):
            self._probe_done(fd, "answered", host_answers=True)
        elif not chunk:
            self._probe_done(fd, "its probe connection closed unanswered", host_answers=True)

    def _probe_done(self, fd: int, outcome: str | None, host_answers: bool = False, reached: bool = False) -> None:
        """The probe of a suspect agent ended: ``outcome`` None is no answer in time (the host
        gone, frozen or cut off, or this observer cut off); ``host_answers``: the host's kernel
        answered (a refused connection, or one accepted and closed, or the agent answered but
        its connection to us is gone): the agent is gone, the node lives. ``reached``: the probe's
        connection was accepted and nothing came back (a frozen node: its kernel answers for it)."""
        p = self._probes.pop(fd, None)
        if p is None:
            return
        with contextlib.suppress(KeyError, ValueError):
            self._sel.unregister(p.sock)
        p.sock.close()
        a = self.agents.get(p.node)
        if a is None or a.state != SUSPECT:
            return
        if outcome == "answered" and not a.conn.closed:
            self._cleared(a)
            return
        what = outcome or f"its probe went unanswered for {self.probe_timeout_s:g} s"
        if outcome is None and reached:
            what = f"its host accepted the probe's connection and nothing answered it for {self.probe_timeout_s:g} s"
        if outcome == "answered":
            what = "its probe was answered, but its connection to the supervisor is gone"
        self._dead(a, f"{a.why}; {what}", host_answers=host_answers, reached=reached and outcome is None)

    def _cleared(self, a: AgentView) -> None:
        a.state, a.why, a.suspect_since = WARM, None, None
        a.last_heard = world.monotonic()
        self._events.put(Cleared(a.node))

    def _dead(self, a: AgentView, why: str, host_answers: bool = False, reached: bool = False) -> None:
        a.state, a.why = DEAD, why
        with contextlib.suppress(KeyError, ValueError):
            self._sel.unregister(a.conn)
        a.conn.close()
        # no ping has gone to it since it became suspect: its lease ends lease_s after the last one
        lease_ends = a.last_ping + self.lease_s
        self._events.put(Dead(a.node, why, max(0.0, lease_ends - world.monotonic()), host_answers, reached))


#: a probe's connect errors that are the host's own answer (its kernel sent a reset)
HOST_ANSWERED = (errno.ECONNREFUSED, errno.ECONNRESET)


def probe_failed(err: int) -> str:
    """What a failed probe connection says: ECONNREFUSED is the host answering that nothing
    listens (the agent died, the node lives); ECONNRESET is the same answer a moment later (the
    agent died with the probe's connection queued on its port: the kernel resets it; seen under
    load, and taken for a dead node); EHOSTUNREACH, ENETUNREACH or a timeout is no answer from
    the host at all (it is gone or cut off, or this observer is)."""
    name = errno.errorcode.get(err, str(err))
    if err in HOST_ANSWERED:
        return f"its probe port refused ({name})"
    return f"its probe got no answer from the host ({name})"
