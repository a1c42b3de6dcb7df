"""Which python a job's ranks, agents and supervisor start with (and the check before the queue).

``hydra.launcher.python`` when set (a venv, a module-loaded interpreter on the nodes); else the
trainer's environment (``trainer.python``: torchtitan's lives in a venv of its own, as it pins
another torch than LLM Foundry's); else this interpreter. A relative path is made absolute here,
where the user typed it: the job starts elsewhere.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from typing import Any

from omegaconf import OmegaConf

from hpc_llm.errors import ConfigError
from hpc_llm.paths import source_root


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
            command[0] = _absolute(command[0])
        return command
    return [sys.executable]


def _absolute(path: str) -> str:
    """A relative path from here; else from the checkout hpc_llm runs from (the default
    ``.venv-torchtitan/bin/python`` works from any directory of a development install)."""
    here = os.path.abspath(os.path.expanduser(path))
    root = source_root()
    if os.path.isabs(os.path.expanduser(path)) or os.path.exists(here) or root is None:
        return here
    beside = str(root / path)
    return beside if os.path.exists(beside) else here


def check_trainer_python(cfg: Any) -> None:
    """The trainer's own environment exists here (a login node sees the nodes' shared
    filesystem): one line saying how to make it, before anything is created. An image
    (``container``) or ``hydra.launcher.python`` is the user's to name."""
    given = OmegaConf.select(cfg, "trainer.python", default=None)
    container = OmegaConf.select(cfg, "container.name", default="none")
    if not given or container != "none" or OmegaConf.select(cfg, "hydra.launcher.python", default=None):
        return
    exe = job_python(cfg)[0]
    found = shutil.which(exe) if "/" not in exe else (exe if os.access(exe, os.X_OK) else None)
    if found is None:
        name = OmegaConf.select(cfg, "trainer.name", default="?")
        raise ConfigError(
            f"trainer.python={given}: {exe} does not exist; trainer={name} runs in an environment of its own: "
            "make it with `bash scripts/setup-torchtitan.sh` in the hpc_llm checkout, or name its python "
            "(HPC_LLM_TORCHTITAN_PYTHON=/path/to/bin/python, or hydra.launcher.python)"
        )


def source(cfg: Any, launcher_python: str | None = None) -> str:
    """The key that chose the job's python, for messages."""
    if launcher_python or (cfg is not None and OmegaConf.select(cfg, "hydra.launcher.python", default=None)):
        return "hydra.launcher.python"
    if cfg is not None and OmegaConf.select(cfg, "trainer.python", default=None):
        return "trainer.python"
    return "this interpreter"
