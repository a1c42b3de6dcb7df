"""A seed's world: the cluster, the run, and the faults that happen to it, all drawn from the seed.

One seed is one :class:`Scenario`: a Slurm version and its timeouts, a job of N training nodes
(with spares, or ``min_nodes`` below N) on a cluster with a node or two beside it, a short
training run, and a schedule of faults at random times: nodes killed (for good, or rebooted),
frozen and thawed, cut off and healed, partitions between groups of hosts (one way too),
processes killed (a rank, an agent, the supervisor), slurmctld silent or slow. :func:`draw`
makes it from the seed alone, so ``--seed N`` replays it exactly.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

#: what a fault can do
KINDS = (
    "kill_node",
    "freeze_node",
    "cut_node",
    "partition",
    "oneway",
    "kill_agent",
    "kill_rank",
    "kill_supervisor",
    "ctld_silent",
)
#: whom a fault is aimed at, resolved when it happens (the job's nodes move)
ROLES = ("batch", "worker", "spare", "any")


@dataclass(frozen=True)
class Fault:
    at: float
    kind: str
    role: str = "any"
    #: seconds until it is undone (a node back up, thawed, a link healed); None: for good
    lasts: float | None = None
    #: a partition's other side: this many of the other hosts (the controller among them or not)
    with_ctl: bool = True

    def describe(self) -> str:
        how = "for good" if self.lasts is None else f"for {self.lasts:.0f}s"
        return f"t={self.at:.1f}s {self.kind} {self.role} {how}"


@dataclass
class Scenario:
    seed: int
    version: tuple[int, int, int] = (24, 11, 5)
    slurmd_timeout_s: int = 10
    nodes: int = 2
    spares: int = 1
    min_nodes: int | None = None
    extra: int = 1
    take_over: bool = True
    max_batches: int = 60
    import_s: float = 2.0
    faults: list[Fault] = field(default_factory=list)
    #: the simulated time at which a run must have ended, whatever happened
    horizon_s: float = 1800.0

    @property
    def no_kill(self) -> bool:
        return self.spares > 0 or (self.min_nodes is not None and self.min_nodes < self.nodes)

    @property
    def cluster(self) -> int:
        return self.nodes + self.spares + self.extra

    def describe(self) -> str:
        shape = f"{self.nodes} node(s)"
        if self.spares:
            shape += f" + {self.spares} spare(s)"
        if self.min_nodes is not None:
            shape += f", min_nodes={self.min_nodes}"
        version = ".".join(map(str, self.version))
        head = (
            f"seed {self.seed}: Slurm {version}, SlurmdTimeout={self.slurmd_timeout_s}, {shape} on a "
            f"{self.cluster}-node cluster, {self.max_batches} batches"
            + ("" if self.take_over else ", fault.take_over=false")
        )
        return "\n".join([head, *("  " + f.describe() for f in self.faults)])


def draw(seed: int) -> Scenario:
    """The scenario of ``seed`` (see the module docstring)."""
    r = random.Random(seed)
    nodes = r.choice((1, 2, 2, 3))
    spares = r.choice((0, 1, 1, 2))
    min_nodes = None
    if spares == 0 and nodes > 1 and r.random() < 0.3:
        min_nodes = nodes - 1
    s = Scenario(
        seed=seed,
        version=r.choice(((22, 5, 8), (24, 11, 5))),
        slurmd_timeout_s=r.choice((10, 10, 20, 30)),
        nodes=nodes,
        spares=spares,
        min_nodes=min_nodes,
        extra=r.choice((0, 1, 1, 2)),
        take_over=r.random() < 0.85,
        max_batches=r.choice((40, 60, 80)),
        import_s=r.uniform(1.0, 4.0),
    )
    # faults while it trains: from the agents' start to about the run's end (0.5 s a batch)
    window = 3.0 + s.import_s + 0.5 * s.max_batches
    for _ in range(r.choice((0, 1, 1, 2, 2, 2, 3))):
        kind = r.choice(KINDS)
        role = r.choice(ROLES)
        lasts = None if r.random() < 0.35 else r.choice((2.0, 5.0, 8.0, 15.0, 40.0, 90.0))
        if kind in ("kill_agent", "kill_rank", "kill_supervisor"):
            lasts = None
        if kind == "ctld_silent":
            lasts = r.choice((3.0, 8.0, 20.0, 60.0))
        at = round(r.uniform(2.0, window), 2)
        s.faults.append(Fault(at=at, kind=kind, role=role, lasts=lasts, with_ctl=r.random() < 0.5))
    s.faults.sort(key=lambda f: f.at)
    return s
