"""Where the Slurm launcher hands a job over to the compute nodes.

:class:`RankEntry` is the picklable callable submitit runs in every srun task
(``python -m submitit.core._submit``): the job's entry point on the payload the
launcher wrote. It lives in a module of its own that imports nothing, so
unpickling it in each rank costs nothing of the login side; the in-job side is
imported only when a task calls it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


class RankEntry:
    def __init__(self, payload: str) -> None:
        self.payload = payload

    def __call__(self) -> Any:
        from hpc_llm.job.rank import entry

        entry.configure_logging()
        return entry.run_payload(Path(self.payload))
