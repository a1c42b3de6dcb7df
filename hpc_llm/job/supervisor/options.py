"""What the supervisor is told by the batch script: the run's fault policy and timings.

``python -m hpc_llm.job.supervisor --run-dir DIR [options] -- srun ...``: the options
before ``--`` (rendered by hpc_llm.launch.sbatch.spec from the run's ``fault`` section) become a
:class:`Policy`; what follows is the agent step's command. Stdlib only.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Policy:
    run_dir: Path
    #: nodes the run trains on (an exclusion may never leave fewer than min_nodes)
    nodes: int
    #: the stop signal forwarded to the ranks; None: fault tolerance is off
    stop_signal: str | None
    signal_lead_s: float
    #: ranks per node (each agent forks this many)
    tasks_per_node: int = 1
    recover: bool = True
    max_timeouts: int | None = None
    max_preemptions: int | None = 100
    #: failures in a row without a new checkpoint (hpc_llm.job.supervisor.policy)
    max_failures: int = 5
    max_failures_per_day: float | None = 24.0
    max_attempts_without_progress: int = 10
    forgive_after_s: float = 86400.0
    restart_in_place: bool = True
    #: with spares, an agent takes the place of a supervisor whose host was lost (hpc_llm.job.agent.takeover)
    take_over: bool = True
    #: fixed seconds before the time limit to stop; None: derived from measured saves
    stop_lead_s: float | None = None
    #: the period of every heartbeat: ranks into their agent's board, agents to the supervisor
    heartbeat_s: float = 1.0
    #: an agent silent this long is suspect and probed; unanswered for probe_timeout_s, its node is dead
    node_timeout_s: float = 3.0
    probe_timeout_s: float = 1.5
    #: a batch may take hang_factor x the run's median step, never less than hang_floor_s
    hang_factor: float = 10.0
    hang_floor_s: float = 60.0
    #: the limit where there is no pace to judge by yet (the first batches, a first save or eval)
    hang_timeout_s: float = 1800.0
    #: seconds from a generation's start until every rank trains; longer is a start-up hang (None: no limit)
    startup_timeout_s: float | None = None
    #: straggler.*: a node this many times slower than the others' median, ``straggler_patience``
    #: windows in a row, is slow (hpc_llm.job.supervisor.stragglers); action warn | swap | exclude
    #: (None: not watched)
    straggler_factor: float = 2.0
    straggler_patience: int = 2
    straggler_action: str | None = None
    #: resources.min_nodes: the run goes on with as few as this many nodes after losing some
    #: (None: ``nodes``, never fewer)
    min_nodes: int | None = None

    @property
    def least_nodes(self) -> int:
        """The fewest nodes the run trains on."""
        return min(self.min_nodes or self.nodes, self.nodes)

    @property
    def lease_s(self) -> float:
        """How long a ping keeps a generation's ranks writing: as long as the supervisor takes to
        declare their node dead (hpc_llm.job.rank.fence)."""
        return self.node_timeout_s + self.probe_timeout_s


def parse_args(argv: list[str]) -> tuple[Policy, list[str]]:
    if "--" not in argv:
        raise SystemExit("usage: python -m hpc_llm.job.supervisor --run-dir DIR [options] -- srun ... <agent command>")
    cut = argv.index("--")
    p = argparse.ArgumentParser(prog="hpc_llm.job.supervisor")
    p.add_argument("--run-dir", required=True)
    p.add_argument("--nodes", type=int, default=1)
    p.add_argument("--tasks-per-node", type=int, default=1)
    p.add_argument("--signal", default=None)
    p.add_argument("--signal-lead-s", type=float, default=120.0)
    p.add_argument("--no-recover", action="store_true")
    p.add_argument("--max-timeouts", type=int, default=None)
    p.add_argument("--max-preemptions", type=int, default=100)
    p.add_argument("--max-failures", type=int, default=5)
    p.add_argument("--max-failures-per-day", type=float, default=None)
    p.add_argument("--max-attempts-without-progress", type=int, default=10)
    p.add_argument("--forgive-after-s", type=float, default=86400.0)
    p.add_argument("--no-restart-in-place", action="store_true")
    p.add_argument("--no-take-over", action="store_true")
    p.add_argument("--stop-lead-s", type=float, default=None)
    p.add_argument("--heartbeat-s", type=float, default=1.0)
    p.add_argument("--node-timeout-s", type=float, default=3.0)
    p.add_argument("--probe-timeout-s", type=float, default=1.5)
    p.add_argument("--hang-factor", type=float, default=10.0)
    p.add_argument("--hang-floor-s", type=float, default=60.0)
    p.add_argument("--hang-timeout-s", type=float, default=1800.0)
    p.add_argument("--startup-timeout-s", type=float, default=None)
    p.add_argument("--straggler-factor", type=float, default=2.0)
    p.add_argument("--straggler-patience", type=int, default=2)
    p.add_argument("--straggler-action", choices=("warn", "swap", "exclude"), default=None)
    p.add_argument("--min-nodes", type=int, default=None)
    a = p.parse_args(argv[:cut])
    policy = Policy(
        run_dir=Path(a.run_dir),
        nodes=a.nodes,
        tasks_per_node=a.tasks_per_node,
        stop_signal=a.signal,
        signal_lead_s=a.signal_lead_s,
        recover=not a.no_recover,
        max_timeouts=a.max_timeouts,
        max_preemptions=a.max_preemptions,
        max_failures=a.max_failures,
        max_failures_per_day=a.max_failures_per_day,
        max_attempts_without_progress=a.max_attempts_without_progress,
        forgive_after_s=a.forgive_after_s,
        restart_in_place=not a.no_restart_in_place,
        take_over=not a.no_take_over,
        stop_lead_s=a.stop_lead_s,
        heartbeat_s=a.heartbeat_s,
        node_timeout_s=a.node_timeout_s,
        probe_timeout_s=a.probe_timeout_s,
        hang_factor=a.hang_factor,
        hang_floor_s=a.hang_floor_s,
        hang_timeout_s=a.hang_timeout_s,
        startup_timeout_s=a.startup_timeout_s,
        straggler_factor=a.straggler_factor,
        straggler_patience=a.straggler_patience,
        straggler_action=a.straggler_action,
        min_nodes=a.min_nodes,
    )
    return policy, argv[cut + 1 :]
