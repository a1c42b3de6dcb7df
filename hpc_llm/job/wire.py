"""The supervisor and the agents, over TCP: one JSON object per line, on one connection per node.

Each agent (:mod:`hpc_llm.job.agent`) connects to the supervisor
(:mod:`hpc_llm.job.supervisor`) once per allocation and keeps the connection; the messages it
carries are the types of :mod:`hpc_llm.job.messages`. This module is the transport: a
non-blocking :class:`Conn` for a ``selectors`` loop (both sides are single ``select`` loops)
with a bounded input buffer, the listening and connecting sockets, and the environment the
supervisor gives the agent step.

Why not a library: the supervisor must stay stdlib-only on the batch host (no training stack,
nothing to install there), and the protocol is a dozen short messages on one connection per
node; a line of JSON per message is what ``nc`` and a person reading a capture understand.
Stdlib only.
"""

from __future__ import annotations

import contextlib
import socket
from pathlib import Path
from typing import Any

from hpc_llm import world
from hpc_llm.job.messages import Message, decode, encode

#: a line longer than this is not ours: the connection is closed
MAX_LINE = 1 << 20

# What the supervisor tells the agent step, in its environment.
#: the supervisor's address, ``host:port``
SUPERVISOR = "HPC_LLM_SUPERVISOR"
#: the allocation's secret: an agent's hello carries it, a probe too
TOKEN = "HPC_LLM_AGENT_TOKEN"
#: seconds a ping renews the live generation's lease for (hpc_llm.job.rank.fence)
LEASE_S = "HPC_LLM_LEASE_S"
#: set when the job has spare nodes (sbatch --no-kill): an agent that loses the supervisor without
#: an ``end`` (the batch host died; Slurm keeps a --no-kill job RUNNING without its batch script)
#: requeues the job. Its value: ``NEEDED,FULL,PER_NODE``, the nodes the run needs, the nodes it
#: was submitted with (spares included) and the ranks per node, to size the requeued job to what
#: the partition can hold (hpc_llm.slurm.requeue.fit_partition)
REQUEUE_ON_LOSS = "HPC_LLM_REQUEUE_ON_LOSS"
#: with :data:`REQUEUE_ON_LOSS`: the supervisor's node, and its own command line (JSON), for an
#: agent to take its place in the same allocation when that node is lost (hpc_llm.job.agent.takeover)
SUPERVISOR_NODE = "HPC_LLM_SUPERVISOR_NODE"
TAKEOVER = "HPC_LLM_TAKEOVER"
#: told to a supervisor started by an agent that took over: the node whose supervisor was lost
TAKEN_OVER_FROM = "HPC_LLM_TAKEN_OVER_FROM"
#: told by the batch script (sbatch_templates/default.sh.j2): how many times it started the
#: supervisor again after one died of a signal, and the last one's exit status
SUPERVISOR_RESTARTS = "HPC_LLM_SUPERVISOR_RESTARTS"
SUPERVISOR_DIED = "HPC_LLM_SUPERVISOR_DIED"


def requeue_on_loss(value: str | None) -> tuple[int, int, int] | None:
    """:data:`REQUEUE_ON_LOSS`'s value as (needed, full, per_node); None when unset or malformed."""
    try:
        needed, full, per_node = (int(x) for x in (value or "").split(","))
    except ValueError:
        return None
    return needed, full, per_node


#: an agent takes its supervisor as gone after this many ping periods without a message, and
#: at least this many leases (a dead or frozen host closes no connection)
SILENT_PINGS = 10
SILENT_LEASES = 3


#: the supervisor's patience, as it tells the agent step (seconds; hpc_llm.job.agent.loop)
SILENT_S = "HPC_LLM_SUPERVISOR_SILENT_S"
#: an agent gives its supervisor up before Slurm can have called a silent node DOWN, by this much
#: of SlurmdTimeout: a host cut off and healed after that carries no process of the job
SLURMD_SHARE = 0.8


def supervisor_silent_s(beat_s: float, lease_s: float, slurmd_timeout_s: float | None = None) -> float:
    """How long an agent waits for its supervisor's next message before it gives up on it (ends
    its ranks and itself). A supervisor whose own loop stalled longer than this finds every agent
    gone, by no fault of theirs (supervisor.fleet). Never longer than :data:`SLURMD_SHARE` of
    Slurm's ``SlurmdTimeout``: Slurm calls a node it has not heard from for that long DOWN and
    requeues its job, and a node cut off, then healed after that, must carry no process of the
    job (slurmctld drains a node that reports a job it placed elsewhere: "Duplicate jobid");
    never shorter than a lease and two pings either."""
    patience = max(SILENT_PINGS * beat_s, SILENT_LEASES * lease_s)
    if slurmd_timeout_s:
        patience = min(patience, max(SLURMD_SHARE * slurmd_timeout_s, lease_s + 2 * beat_s))
    return patience


def ephemeral_ports() -> tuple[int, int]:
    """The kernel's range of source ports for outgoing connections (Linux's default 32768-60999):
    a port a server must listen on is taken from outside it (agent.loop.free_port)."""
    try:
        lo, hi = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(lo), int(hi)
    except (OSError, ValueError):
        return 32768, 60999


class Conn:
    """One end of a connection: messages queued by :meth:`send` and written as the socket
    takes them; :meth:`receive` returns the complete messages read so far."""

    def __init__(self, sock: Any) -> None:
        sock.setblocking(False)
        self.sock = sock
        self._in = bytearray()
        self._out = bytearray()
        self.closed = False

    def fileno(self) -> int:
        return self.sock.fileno()

    @property
    def wants_write(self) -> bool:
        return bool(self._out) and not self.closed

    def send(self, msg: Message) -> None:
        if self.closed:
            return
        self._out += encode(msg)
        self.flush()

    def flush(self) -> None:
        while self._out and not self.closed:
            try:
                n = self.sock.send(self._out)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                self.close()
                return
            del self._out[:n]

    def receive(self) -> list[Message]:
        """The messages that arrived (call when the socket is readable); an EOF or error
        closes the connection (``closed``), after what was read before it. A line that is no
        message (:func:`hpc_llm.job.messages.decode`) is dropped."""
        while not self.closed:
            try:
                chunk = self.sock.recv(65536)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                self.close()
                break
            if not chunk:
                self.close()
                break
            self._in += chunk
            if len(self._in) > MAX_LINE and b"\n" not in self._in:
                self.close()
        out = []
        while b"\n" in self._in:
            line, _, rest = bytes(self._in).partition(b"\n")
            self._in = bytearray(rest)
            msg = decode(line)
            if msg is not None:
                out.append(msg)
        return out

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            with contextlib.suppress(OSError):
                self.sock.close()


def listener(host: str = "0.0.0.0", backlog: int = 4096) -> Any:
    """A listening, non-blocking TCP socket on an ephemeral port (its address: ``getsockname()``)."""
    return world.listener(host, backlog)


def connect(address: str, timeout_s: float) -> Any:
    """A connection to ``host:port`` (blocking, with a timeout), with TCP keepalive on and
    Nagle off: the messages are small and each one matters now."""
    host, _, port = address.rpartition(":")
    s = world.connect(host, int(port), timeout_s)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    return s
