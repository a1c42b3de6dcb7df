"""One generation of ranks across the agents, as the supervisor keeps count of it.

A generation is one start of the run's ranks inside the allocation (an attempt of the run's
records, ``HPC_LLM_GENERATION`` in the ranks): generation 0 at the allocation's start,
generation 1 after a restart in place, and so on. :class:`Generation` tracks which ranks have
started and how each ended (the agents' ``started``/``exit``/``stopped`` messages; a dead
node's ranks end with it); :class:`GenerationEnd` is what the supervisor saw of it, the input
of its decision. Stdlib only.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hpc_llm import world
from hpc_llm.job import messages
from hpc_llm.job.failures import RankExit
from hpc_llm.rundir.outcome import Cause


@dataclass
class GenerationEnd:
    """How one generation ended, as seen from the batch host."""

    returncode: int
    #: srun's error lines of the agent step so far
    srun_errors: list[str] = field(default_factory=list)
    #: the ranks that did not exit 0, first to end first
    rank_exits: list[RankExit] = field(default_factory=list)
    #: stop signal forwarded to the ranks, when the supervisor got it, and why Slurm sent it
    stop: str | None = None
    stop_time: float | None = None
    stop_cause: Cause | None = None
    #: stop_cause is Slurm's answer, not the guess made from the cached end time
    stop_cause_asked: bool = False
    #: named hang: (reason, nodes to blame); storage: a stall in a storage phase (nobody blamed)
    hang: tuple[str, tuple[str, ...]] | None = None
    storage_stall: str | None = None
    terminated: bool = False
    #: the start-up phase that outlived fault.startup_timeout_s
    startup: str | None = None
    #: the allocation holds fewer usable nodes than the run needs (why), so no generation can start
    too_few: str | None = None
    #: slurmctld has not answered the supervisor for longer than it may go on (why)
    ctld_lost: str | None = None
    #: ... and answered again since (the supervisor stood down and has command back)
    ctld_answered: bool = False
    #: nodes whose agent was confirmed dead (silent, then its probe unanswered): node -> why
    dead_nodes: dict[str, str] = field(default_factory=dict)
    #: of those, the ones whose host accepted the probe's connection: frozen, the link to them fine
    frozen: set[str] = field(default_factory=set)
    #: nodes of the generation Slurm showed draining, for which the supervisor stopped it (stop_cause "drain")
    draining: tuple[str, ...] = ()
    #: straggler verdicts while it ran (hpc_llm.job.supervisor.stragglers), as recorded
    stragglers: list[dict[str, object]] = field(default_factory=list)
    #: slow nodes the supervisor stopped the generation for, to swap them (stop_cause "straggler")
    slow: tuple[str, ...] = ()
    #: agents that ended of their own error (a bug, not the node) or stalled: node -> why
    agent_errors: dict[str, str] = field(default_factory=dict)
    #: agents gone on a host that still answers (their probe was refused): node -> why
    agents_died: dict[str, str] = field(default_factory=dict)
    #: the highest batch any rank's heartbeat reported, and seconds from its first to its last batch
    top_batch: int = -1
    heartbeat_train_s: float = 0.0
    #: when the supervisor first saw the end coming (a rank's failure, a dead node, a hang, a signal)
    detected_at: float | None = None
    #: when the last rank of the generation was gone
    stopped_at: float | None = None

    @property
    def lost(self) -> dict[str, str]:
        """Every node whose agent is gone, whichever way (dead, died, ended of its own): node -> why."""
        return {**self.dead_nodes, **self.agents_died, **self.agent_errors}

    def forget_lost(self) -> None:
        self.dead_nodes.clear()
        self.frozen.clear()
        self.agents_died.clear()
        self.agent_errors.clear()


class Generation:
    """Ranks of generation ``gen``: ``layout`` maps each node to its node rank."""

    def __init__(self, gen: int, layout: dict[str, int], tasks_per_node: int) -> None:
        self.gen = gen
        self.layout = dict(layout)
        self.tasks_per_node = tasks_per_node
        self.expected = {
            node_rank * tasks_per_node + local: node
            for node, node_rank in layout.items()
            for local in range(tasks_per_node)
        }
        self.started: set[str] = set()
        self.pids: dict[int, int] = {}
        self.exits: dict[int, RankExit] = {}
        self.stopped: set[str] = set()
        self.killing = False
        self.started_at = world.time()

    @property
    def ntasks(self) -> int:
        return len(self.expected)

    @property
    def all_started(self) -> bool:
        return set(self.layout) <= self.started

    def on_started(self, node: str, pids: dict[int, int]) -> None:
        self.started.add(node)
        self.pids.update(pids)

    def on_exit(self, msg: messages.Exit) -> RankExit | None:
        rank = msg.rank
        if rank not in self.expected or rank in self.exits:
            return None
        e = RankExit(rank, msg.node, msg.status, msg.what, msg.killed, world.time())
        self.exits[rank] = e
        return e

    def lose(self, node: str, why: str) -> None:
        """The node is gone: its ranks ended with it."""
        for rank, where in self.expected.items():
            if where == node and rank not in self.exits:
                self.exits[rank] = RankExit(rank, node, None, f"lost with the node ({why})", False, world.time())
        self.stopped.add(node)

    @property
    def done(self) -> bool:
        return len(self.exits) >= self.ntasks and (not self.killing or set(self.layout) <= self.stopped)

    def failed(self) -> RankExit | None:
        """The first rank that ended badly of its own (not one the supervisor killed)."""
        bad = [e for e in self.exits.values() if not e.killed and e.status not in (0, None)]
        return min(bad, key=lambda e: e.at) if bad else None

    def ended_badly(self) -> list[RankExit]:
        """Every rank that did not exit 0, first to end first (the ones the supervisor killed are
        marked: bystanders of another's end)."""
        return sorted((e for e in self.exits.values() if e.status != 0), key=lambda e: e.at)

    def returncode(self) -> int:
        codes = [e.status for e in self.exits.values() if e.status not in (0, None)]
        if any(e.status is None for e in self.exits.values()):
            codes.append(-9)
        if not codes:
            return 0
        first = codes[0] or 1
        return first if first > 0 else 128 - first
