"""Which node is slow: the nodes' busy times compared, window after window. Pure.

Each rank publishes, with its heartbeat, its busy seconds per batch over its last window of
batches (:mod:`hpc_llm.job.rank.straggler`: its batch time with its waits inside collectives
taken out). A node's figure is its slowest rank's. Each time every rank of the generation has
published a window newer than the last one judged, :class:`StragglerWatch` compares each node
with the median of the *other* nodes: ``factor`` times it or more is slow, and the same node
slow ``patience`` judgements in a row is a verdict (once per node and generation). A slowdown of
every node at once (a slow filesystem, a throttled switch) moves the median with it and names
nobody: that is the throughput watchdog's. Stdlib only.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field

from hpc_llm.job.heartbeat import Beat


@dataclass(frozen=True)
class Verdict:
    """A slow node, with the evidence: every node's busy seconds per batch when it was found."""

    node: str
    #: the node's figure over the median of the other nodes'
    ratio: float
    #: the straggler window of the judgement that reached the patience
    window: int
    #: node -> busy seconds per batch (its slowest rank's median over the window)
    busy_s: dict[str, float] = field(default_factory=dict)
    #: the median seconds per batch (every rank's is about the same: they wait for each other)
    batch_s: float = 0.0

    def as_record(self) -> dict[str, object]:
        return {
            "node": self.node,
            "ratio": round(self.ratio, 3),
            "window": self.window,
            "busy_s": {n: round(v, 4) for n, v in sorted(self.busy_s.items())},
            "batch_s": round(self.batch_s, 4),
        }


class StragglerWatch:
    def __init__(self, factor: float, patience: int) -> None:
        self.factor, self.patience = factor, patience
        #: the newest window every rank had published at the last judgement
        self.judged = -1
        self.streak: dict[str, int] = {}
        self.named: set[str] = set()

    def observe(self, beats: Mapping[int, Beat], node_of: Mapping[int, str]) -> Verdict | None:
        """``beats``: the generation's latest beats by global rank; ``node_of``: every rank of the
        generation and its node. A verdict when a node reaches the patience, else None."""
        if len(set(node_of.values())) < 2:
            return None
        windows = [beats[r].win if r in beats else -1 for r in node_of]
        newest_common = min(windows)
        if newest_common < 0 or newest_common <= self.judged:
            return None
        self.judged = newest_common
        busy: dict[str, float] = {}
        for rank, node in node_of.items():
            busy[node] = max(busy.get(node, 0.0), beats[rank].busy_s)
        walls = [beats[r].wall_s for r in node_of]
        found: Verdict | None = None
        for node, figure in busy.items():
            others = statistics.median(v for n, v in busy.items() if n != node)
            ratio = figure / others if others > 0 else 0.0
            if ratio < self.factor:
                self.streak[node] = 0
                continue
            self.streak[node] = self.streak.get(node, 0) + 1
            if self.streak[node] >= self.patience and node not in self.named and found is None:
                self.named.add(node)
                found = Verdict(node, ratio, newest_common, dict(busy), statistics.median(walls))
        return found
