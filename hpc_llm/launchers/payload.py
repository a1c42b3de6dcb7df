"""What a launcher hands to the ranks of a job: a pickled (task function, config).

The launcher writes ``<run dir>/.hpc_llm/job.pkl`` once per job; every rank
runs :mod:`hpc_llm.job.entry` on it, and global rank 0 leaves the task
function's return value in ``return.pkl`` for the launcher. Login side: the
in-job entry point is imported only when a rank calls :class:`RankEntry`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import cloudpickle

from hpc_llm.record import PRIVATE_DIR

PAYLOAD = "job.pkl"
RETURN = "return.pkl"


def payload_dir(run_dir: Path | str) -> Path:
    return Path(run_dir) / PRIVATE_DIR


def write_payload(run_dir: Path | str, task_function: Any, config: Any) -> Path:
    """Pickle the job for its ranks; clears the return value of an earlier launch."""
    pdir = payload_dir(run_dir)
    pdir.mkdir(parents=True, exist_ok=True)
    (pdir / PAYLOAD).write_bytes(cloudpickle.dumps((task_function, config)))
    (pdir / RETURN).unlink(missing_ok=True)
    return pdir / PAYLOAD


def read_return(run_dir: Path | str) -> tuple[bool, Any]:
    """(found, value) of what rank 0's task function returned."""
    path = payload_dir(run_dir) / RETURN
    if not path.exists():
        return False, None
    return True, cloudpickle.loads(path.read_bytes())


class RankEntry:
    """The picklable callable submitit runs in every srun task (Slurm launcher)."""

    def __init__(self, payload: str) -> None:
        self.payload = payload

    def __call__(self) -> Any:
        from hpc_llm.job import entry

        entry.configure_logging()
        return entry.run_payload(Path(self.payload))
