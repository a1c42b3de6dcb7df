"""What one rank knows about its job while it runs."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpc_llm.config.plan import JobPlan
from hpc_llm.job.env import DistEnv
from hpc_llm.rundir.record import RunRecord


@dataclass
class JobContext:
    plan: JobPlan
    dist: DistEnv
    run_dir: Path
    #: node-local working directory of this rank (docs/upstream-fixes.md, upstream fix 1)
    node_dir: Path
    #: the job's composed config (hpc_llm keys and ``train``)
    cfg: Any = None
    #: last value of every metric Composer logged (filled by ResultsLogger)
    metrics: dict[str, Any] = field(default_factory=dict)
    #: (batch, loss) for every logged training loss
    loss_history: list[tuple[int, float]] = field(default_factory=list)
    #: the run's record (global rank 0 only; None elsewhere)
    record: RunRecord | None = None
    #: what post-train evaluators produced for later ones (``hf_model_dir``)
    artifacts: dict[str, Any] = field(default_factory=dict)
    #: the preflight record (hpc_llm.job.rank.preflight), once checks have run
    preflight: dict[str, Any] | None = None
    #: slowdowns the throughput watchdog reported (global rank 0)
    watchdog_events: list[dict[str, Any]] = field(default_factory=list)


#: the context of the rank running in this process; LLM Foundry builds our
#: registered logger and callback with no arguments, so they look it up here
CURRENT: JobContext | None = None
