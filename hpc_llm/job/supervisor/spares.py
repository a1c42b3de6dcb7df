"""The spares' account: how many are left, which were lost and why, which went back to Slurm.

A spare node (``resources.spare_nodes``) serves only if its agent is warm when a node is left
out. One whose agent dies, or never starts, cannot: the supervisor leaves it out of the
allocation and gives it back to Slurm (:meth:`Agents.give_back`), and the run goes on with the
spares left. Nothing else can take its place inside a running job (an allocation does not grow);
the next requeue asks for the full count again. :func:`never_started` says which spares' agents
are overdue; :mod:`hpc_llm.rundir.spare_record` keeps ``.hpc_llm/spares.json`` (the supervisor its
only writer), which ``hpc-llm status <run>`` shows. Stdlib only.
"""

from __future__ import annotations

#: a spare's agent not heard from this long after the agent step started is given up...
GRACE_S = 120.0
#: ... or this many times the slowest start of the agents that did warm up, if longer
SLOWEST_STARTS = 3.0


def never_started(spares: list[str], joined: set[str], since_s: float, starts_s: list[float]) -> list[str]:
    """The spares whose agent never said hello, ``since_s`` after the agent step started, when the
    others took up to ``max(starts_s)`` to warm up: overdue past :data:`GRACE_S` and
    :data:`SLOWEST_STARTS` times the slowest start (a node's container or imports may be slow,
    and a spare is not needed yet)."""
    limit = max(GRACE_S, SLOWEST_STARTS * max(starts_s, default=0.0))
    return [n for n in spares if n not in joined] if since_s > limit else []
