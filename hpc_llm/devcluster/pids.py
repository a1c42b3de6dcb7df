"""The dev cluster's daemons by pid: whether one still runs, and the pid a pid file holds.

Shared by the cluster (:mod:`hpc_llm.devcluster.cluster`: slurmctld, slurmd, slurmdbd,
MariaDB) and its S3 server (:mod:`hpc_llm.devcluster.s3_server`).
"""

from __future__ import annotations

import os
from pathlib import Path


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie, exited but not yet reaped, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie is dead
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def read_pid(path: Path) -> int | None:
    """The pid a daemon wrote to ``path`` (its first word), None when there is none."""
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
