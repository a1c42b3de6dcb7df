"""The spares' account: how many are left, which were lost and why, which went back to Slurm.

A spare node (``resources.spare_nodes``) serves only if its agent is warm when a node is left
out and its node passed its own checks (:func:`failed_checks`). One whose agent dies, or never
starts, or whose node failed, cannot: the supervisor leaves it out of the allocation and gives it
back to Slurm (:meth:`Agents.give_back`), and the run goes on with the spares left. Nothing else
can take its place inside a running job (an allocation does not grow); the next requeue asks for
the full count again. :func:`never_started` says which spares' agents
are overdue; :mod:`hpc_llm.rundir.spare_record` keeps ``.hpc_llm/spares.json`` (the supervisor its
only writer), which ``hpc-llm status <run>`` shows. Stdlib only.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping

#: a spare's agent not heard from this long after the agent step started is given up...
GRACE_S = 120.0
#: ... or this many times the slowest start of the agents that did warm up, if longer
SLOWEST_STARTS = 3.0


def never_started(spares: list[str], joined: set[str], since_s: float, starts_s: list[float]) -> list[str]:
    """The spares whose agent never said hello, ``since_s`` after the agent step started, when the
    others took up to ``max(starts_s)`` to warm up: overdue past :data:`GRACE_S` and
    :data:`SLOWEST_STARTS` times the slowest start (a node's container or imports may be slow,
    and a spare is not needed yet)."""
    return [n for n in spares if n not in joined] if since_s > start_patience_s(starts_s) else []


def start_patience_s(starts_s: list[float]) -> float:
    """How long an agent's start may take: :data:`GRACE_S`, or :data:`SLOWEST_STARTS` times the
    slowest start of the agents that did warm up, if longer."""
    return max(GRACE_S, SLOWEST_STARTS * max(starts_s, default=0.0))


def failed_checks(checks: Mapping[str, tuple[float | None, str | None]], factor: float) -> dict[str, str]:
    """node -> why, for the nodes whose own checks (hpc_llm.job.agent.node_check: ``checks`` maps
    each warm node to its compute GFLOP/s and its failure) say it must not serve: a check it
    failed, or a compute figure under ``1 / factor`` of the other nodes' median (a node that slow
    would be a straggler from its first batch: straggler.factor). The others' median, not all
    nodes': with the three nodes of a small job the slow one's own figure is the median's
    neighbour, and a spare at a fifth of a CPU measured 33.7 against 67.0 and 76.2 passed."""
    out = {n: why for n, (_, why) in checks.items() if why}
    figures = {n: g for n, (g, why) in checks.items() if g is not None and not why}
    if len(figures) < 2:
        return out
    for node, gflops in figures.items():
        median = statistics.median(g for n, g in figures.items() if n != node)
        if gflops * factor < median:
            out[node] = (
                f"its compute check ran at {gflops:.1f} GFLOP/s, under 1/{factor:g} of the other nodes' "
                f"median {median:.1f}"
            )
    return out
