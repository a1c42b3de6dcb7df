"""What one rank knows about its job while it runs."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpc_llm.job.distenv import DistEnv
from hpc_llm.plan import JobPlan


@dataclass
class JobContext:
    plan: JobPlan
    dist: DistEnv
    run_dir: Path
    #: node-local working directory of this rank (DESIGN.md hazard 1)
    node_dir: Path
    #: last value of every metric Composer logged (filled by ResultsLogger)
    metrics: dict[str, Any] = field(default_factory=dict)
    #: (batch, loss) for every logged training loss
    loss_history: list[tuple[int, float]] = field(default_factory=list)
