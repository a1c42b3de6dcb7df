"""Every message between the supervisor and the agents: one frozen dataclass each, encoded here.

The wire (:mod:`hpc_llm.job.wire`) carries one JSON object per line; the object's ``t`` names its
type and its other keys are the dataclass's fields. :func:`encode` and :func:`decode` are the
only places that see the JSON; everything else handles these types. An agent's :class:`Hello`
carries :data:`VERSION`: a supervisor refuses an agent that speaks another one (an image built
from an older hpc_llm) instead of misreading it.

=============  ==========================  =====================================================
type (``t``)   from                        what
=============  ==========================  =====================================================
hello          agent, first                token, node, node id, pid, probe port, address, version
warm           agent                       the training stack is imported: generations start now
beat           agent, every period         its ranks' heartbeats (rank, seq, batch, phase, pid, gen, pace)
port           agent                       the free rendezvous port it found for generation G
started        agent                       its ranks of generation G are forked (rank -> pid)
exit           agent                       a rank of generation G ended: its exit status
stopped        agent                       every rank of generation G it was told to kill is gone
stalled        agent                       its own loop stalled past the lease: it ended its ranks
bye            agent, last                 the agent ends on purpose (and why: a bug, not the node)
pong           agent, on a probe           the answer to a probe
ping           supervisor, every period    renews the live generation's lease (hpc_llm.job.rank.fence)
find_port      supervisor                  node rank 0's agent: name a free port for generation G
start          supervisor                  start generation G: node rank, layout, rendezvous, env
signal         supervisor                  pass a stop signal to the ranks of generation G
kill           supervisor                  end generation G now (SIGKILL to each rank's group)
end            supervisor                  the allocation is done: clean up and exit
probe          supervisor, own connection  are you there? (answered ``pong``)
=============  ==========================  =====================================================

Stdlib only.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any, ClassVar

#: the wire's version, in every agent's hello
VERSION = 1


@dataclass(frozen=True)
class Message:
    #: the value of ``t`` on the wire
    T: ClassVar[str] = ""

    @classmethod
    def from_fields(cls, data: dict[str, Any]) -> Message:
        """The message from its JSON fields (keys it does not know are ignored: a newer peer's)."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


# -- agent -> supervisor ---------------------------------------------------------------


@dataclass(frozen=True)
class Hello(Message):
    T: ClassVar[str] = "hello"
    token: str
    node: str
    node_id: int
    pid: int
    addr: str
    probe_port: int
    v: int = VERSION


@dataclass(frozen=True)
class Warm(Message):
    T: ClassVar[str] = "warm"
    #: seconds the training stack took to import
    import_s: float | None = None
    #: its node's own checks (hpc_llm.job.agent.node_check): the compute benchmark's GFLOP/s, and
    #: why the node failed one (None: passed, or not run)
    gflops: float | None = None
    failed: str | None = None


@dataclass(frozen=True)
class RankBeat:
    """One rank's heartbeat as its agent read it from the node's board (not a message itself)."""

    rank: int
    seq: int
    batch: int
    phase: str
    pid: int
    gen: int
    #: its last straggler window (-1: none yet), the median seconds per batch it was busy in it
    #: (not waiting inside a collective) and the median seconds per batch
    win: int = -1
    busy_s: float = -1.0
    wall_s: float = -1.0


@dataclass(frozen=True)
class Beat(Message):
    T: ClassVar[str] = "beat"
    seq: int
    ranks: tuple[RankBeat, ...] = ()

    @classmethod
    def from_fields(cls, data: dict[str, Any]) -> Message:
        keys = [f.name for f in dataclasses.fields(RankBeat)]
        return cls(int(data["seq"]), tuple(RankBeat(**{k: r[k] for k in keys if k in r}) for r in data["ranks"]))


@dataclass(frozen=True)
class PortFound(Message):
    T: ClassVar[str] = "port"
    gen: int
    port: int


@dataclass(frozen=True)
class Started(Message):
    T: ClassVar[str] = "started"
    gen: int
    #: global rank -> pid
    pids: dict[int, int] = field(default_factory=dict)

    @classmethod
    def from_fields(cls, data: dict[str, Any]) -> Message:
        return cls(int(data["gen"]), {int(r): int(p) for r, p in (data.get("pids") or {}).items()})


@dataclass(frozen=True)
class Exit(Message):
    T: ClassVar[str] = "exit"
    gen: int
    rank: int
    node: str
    #: os.waitstatus_to_exitcode: the exit code, or minus the signal that ended it
    status: int
    #: what the status means, in words ("exited with 1", "killed by SIGKILL")
    what: str
    #: the agent killed it (the supervisor ended the generation), not of its own
    killed: bool


@dataclass(frozen=True)
class Stopped(Message):
    T: ClassVar[str] = "stopped"
    gen: int
    #: ranks still not reaped when the agent gave up waiting
    unreaped: tuple[int, ...] = ()

    @classmethod
    def from_fields(cls, data: dict[str, Any]) -> Message:
        return cls(int(data["gen"]), tuple(int(r) for r in data.get("unreaped") or ()))


@dataclass(frozen=True)
class Stalled(Message):
    T: ClassVar[str] = "stalled"
    gen: int
    gap_s: float


@dataclass(frozen=True)
class Bye(Message):
    T: ClassVar[str] = "bye"
    #: "ended" (told to), a signal's name, or the agent's own error
    why: str = "ended"

    @property
    def on_purpose(self) -> bool:
        return self.why == "ended"


@dataclass(frozen=True)
class Pong(Message):
    T: ClassVar[str] = "pong"
    node: str
    gen: int | None = None


# -- supervisor -> agent ---------------------------------------------------------------


@dataclass(frozen=True)
class Ping(Message):
    T: ClassVar[str] = "ping"


@dataclass(frozen=True)
class FindPort(Message):
    T: ClassVar[str] = "find_port"
    gen: int


@dataclass(frozen=True)
class Start(Message):
    T: ClassVar[str] = "start"
    gen: int
    node_rank: int
    nnodes: int
    tasks_per_node: int
    master_addr: str
    master_port: int
    #: the HPC_LLM_* variables of the generation's ranks
    env: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Signal(Message):
    T: ClassVar[str] = "signal"
    gen: int
    #: the signal's name (SIGUSR2)
    signal: str


@dataclass(frozen=True)
class Kill(Message):
    T: ClassVar[str] = "kill"
    gen: int


@dataclass(frozen=True)
class End(Message):
    T: ClassVar[str] = "end"


@dataclass(frozen=True)
class Probe(Message):
    T: ClassVar[str] = "probe"
    token: str


TYPES: dict[str, type[Message]] = {
    cls.T: cls
    for cls in (
        Hello,
        Warm,
        Beat,
        PortFound,
        Started,
        Exit,
        Stopped,
        Stalled,
        Bye,
        Pong,
        Ping,
        FindPort,
        Start,
        Signal,
        Kill,
        End,
        Probe,
    )
}


def encode(msg: Message) -> bytes:
    """One line of JSON: ``t`` and the message's fields."""
    return json.dumps({"t": msg.T, **dataclasses.asdict(msg)}, separators=(",", ":")).encode() + b"\n"


def decode(line: bytes) -> Message | None:
    """The message on one line; None for anything that is not one (not JSON, an unknown type,
    a field missing or of the wrong kind): the caller drops it."""
    try:
        data = json.loads(line)
        cls = TYPES[data.pop("t")]
        return cls.from_fields(data)
    except (ValueError, TypeError, KeyError, AttributeError):
        return None
