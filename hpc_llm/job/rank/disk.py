"""Room for the next checkpoint: a warning before a save fails with ENOSPC (in-job, stdlib only).

A full filesystem makes every save fail at the same batch, which would read as a
user error; a warning in rank 0's log (and the run's record) when less than two
saves' worth is free gives the user time to make room or move ``checkpoint.location``.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from hpc_llm.paths import size_bytes
from hpc_llm.results.format import human_bytes

log = logging.getLogger(__name__)

#: warn while less than this many saves of the last one's size fit
SAVES_OF_ROOM = 2


def free_bytes(folder: Path) -> int:
    st = os.statvfs(folder)
    return st.f_bavail * st.f_frsize


def room_warning(last_save: Path) -> str | None:
    """One line when the filesystem of ``last_save`` holds less than two more saves of its size."""
    return room_warning_for(last_save.parent, size_bytes(last_save))


def room_warning_for(
    folder: Path,
    size: int,
    where: str = "checkpoint folder",
    fix: str = "make room or move checkpoint.location",
) -> str | None:
    """One line when ``folder``'s filesystem holds less than two more saves of ``size`` bytes.
    A save to an object store is written to node scratch first: that is the room it needs."""
    free = free_bytes(folder)
    if size <= 0 or free >= SAVES_OF_ROOM * size:
        return None
    return (
        f"{where} {folder}: {human_bytes(free)} free, less than {SAVES_OF_ROOM} saves of "
        f"{human_bytes(size)}; the next saves may fail (ENOSPC): {fix}"
    )
