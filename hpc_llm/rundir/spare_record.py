"""The spare nodes' account of a run (``.hpc_llm/spares.json``): how many are left, which were
lost and why, which went back to Slurm. The supervisor writes it (hpc_llm.job.supervisor.spares);
``hpc-llm status <run>`` reads it. Stdlib only."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

from hpc_llm import world
from hpc_llm.rundir.layout import RunDir
from hpc_llm.rundir.record import write_json


def write(
    run_dir: Path,
    submitted: int,
    left: list[str],
    lost: dict[str, str],
    given_back: list[str],
) -> None:
    """``.hpc_llm/spares.json``: the spares submitted, those left (in the allocation, their agent
    alive), those lost (and why), those given back. A failed write loses only this view."""
    record = {"submitted": submitted, "left": left, "lost": lost, "given_back": given_back, "at": world.time()}
    with contextlib.suppress(OSError):
        write_json(RunDir(run_dir).spares, record)


def read(run_dir: Path | str) -> dict[str, Any] | None:
    try:
        record = json.loads(RunDir(run_dir).spares.read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def describe(record: dict[str, Any]) -> str:
    """One line for ``hpc-llm status``: '1 of 2 left; lost n3 (its agent never started)'."""
    left, submitted = len(record.get("left") or []), int(record.get("submitted") or 0)
    lost = record.get("lost") or {}
    text = f"{left} of {submitted} left"
    if lost:
        text += "; lost " + ", ".join(f"{n} ({why})" for n, why in sorted(lost.items()))
    if record.get("given_back"):
        text += "; given back to Slurm: " + ",".join(record["given_back"])
    return text
