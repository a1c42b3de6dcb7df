"""Which python a job's ranks, agents and supervisor start with (and the check before the queue).

``hydra.launcher.python`` when set (a venv, a module-loaded interpreter on the nodes); else the
trainer's environment (``trainer.python``: torchtitan's lives in a venv of its own, as it pins
another torch than LLM Foundry's); else this interpreter. A relative path is made absolute here,
where the user typed it: the job starts elsewhere.
"""

from __future__ import annotations

import os
import shlex
import sys
from typing import Any

from omegaconf import OmegaConf


def job_python(cfg: Any, launcher_python: str | None = None) -> list[str]:
    given = launcher_python or (
        OmegaConf.select(cfg, "hydra.launcher.python", default=None) if cfg is not None else None
    )
    if given:
        return shlex.split(str(given))
    trainer = OmegaConf.select(cfg, "trainer.python", default=None) if cfg is not None else None
    if trainer:
        command = shlex.split(str(trainer))
        if "/" in command[0]:
            command[0] = os.path.abspath(os.path.expanduser(command[0]))
        return command
    return [sys.executable]


def source(cfg: Any, launcher_python: str | None = None) -> str:
    """The key that chose the job's python, for messages."""
    if launcher_python or (cfg is not None and OmegaConf.select(cfg, "hydra.launcher.python", default=None)):
        return "hydra.launcher.python"
    if cfg is not None and OmegaConf.select(cfg, "trainer.python", default=None):
        return "trainer.python"
    return "this interpreter"
