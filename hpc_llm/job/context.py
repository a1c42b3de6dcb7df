"""What one rank knows about its job while it runs."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpc_llm.job.distenv import DistEnv
from hpc_llm.job.preemption import Attempts
from hpc_llm.plan import JobPlan


@dataclass
class JobContext:
    plan: JobPlan
    dist: DistEnv
    run_dir: Path
    #: node-local working directory of this rank (DESIGN.md hazard 1)
    node_dir: Path
    #: the job's composed config (hpc_llm keys and ``train``)
    cfg: Any = None
    #: last value of every metric Composer logged (filled by ResultsLogger)
    metrics: dict[str, Any] = field(default_factory=dict)
    #: (batch, loss) for every logged training loss
    loss_history: list[tuple[int, float]] = field(default_factory=list)
    #: this run's attempts across requeues (kept by global rank 0)
    attempts: Attempts | None = None
    #: what post-train evaluators produced for later ones (``hf_model_dir``)
    artifacts: dict[str, Any] = field(default_factory=dict)
    #: the preflight record (hpc_llm.job.health), once checks have run
    preflight: dict[str, Any] | None = None
    #: slowdowns the throughput watchdog reported (global rank 0)
    watchdog_events: list[dict[str, Any]] = field(default_factory=list)

    def record_progress(self, batch: int) -> None:
        if self.attempts is not None:
            self.attempts.current.last_batch = batch
            self.attempts.save()


#: the context of the rank running in this process; LLM Foundry builds our
#: registered logger and callback with no arguments, so they look it up here
CURRENT: JobContext | None = None
