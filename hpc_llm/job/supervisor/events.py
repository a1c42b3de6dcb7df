"""What the fleet tells the supervisor's loop: its own events, not wire messages.

:class:`~hpc_llm.job.supervisor.fleet.Fleet`'s I/O thread hears the agents and judges their
liveness; what needs a decision reaches the supervisor's loop
(:mod:`~hpc_llm.job.supervisor.watch`) as one of these. Stdlib only.
"""

from __future__ import annotations

from dataclasses import dataclass

from hpc_llm.job import messages


@dataclass(frozen=True)
class Joined:
    """An agent said hello with the allocation's token."""

    node: str


@dataclass(frozen=True)
class Heard:
    """A message from an agent that needs the main loop (warm, port, started, exit, stopped,
    stalled, bye); beats are kept in the fleet's view instead."""

    node: str
    msg: messages.Message


@dataclass(frozen=True)
class Suspect:
    """An agent went silent or its connection dropped: it is being probed."""

    node: str
    why: str


@dataclass(frozen=True)
class Cleared:
    """A suspect agent answered its probe: alive."""

    node: str


@dataclass(frozen=True)
class Dead:
    """A suspect agent's probe failed; its lease ends ``lease_left_s`` from now. ``host_answers``:
    the host answered the probe's connection (refused it: nothing listens), so the agent is gone
    and the node lives; otherwise no answer came from the host at all (gone, frozen or cut off,
    or the supervisor's own host cut off)."""

    node: str
    why: str
    lease_left_s: float
    host_answers: bool = False
    #: the probe's connection was accepted (the host's kernel answered), and then nothing: the
    #: link to the node works and its processes do not (a frozen node), so the fault is the node's
    reached: bool = False


FleetEvent = Joined | Heard | Suspect | Cleared | Dead
