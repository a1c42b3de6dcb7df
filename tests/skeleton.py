"""The tests' Apptainer image without a registry: a skeleton root filesystem whose /usr, this
checkout and its virtualenv come in through binds (shared by tests/test_containers.py and
benchmarks/container.py; no pytest here)."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent


def host_binds() -> list[str]:
    """What the skeleton image needs from the host: /usr, the checkout (with .venv) and,
    when it lives elsewhere, the interpreter the virtualenv was made from."""
    binds = ["/usr", str(ROOT)]
    base = os.path.realpath(sys.base_prefix)
    if not any(base == b or base.startswith(b + "/") for b in binds):
        binds.append(base)
    return binds


def make_skeleton(root: Path, host: bool = True, venv_bin: Path = VENV_BIN) -> Path:
    """A root filesystem with nothing in it: /usr and the venv come in through binds. Its
    environment puts the venv first on PATH, as the shipped images put theirs (``host``:
    with the mount points and PATH for the host's /usr and venv; ``venv_bin``: another venv of
    the checkout, torchtitan's as containers/torchtitan.def installs it)."""
    for d in ("usr", "etc", "tmp", "var/tmp", "proc", "sys", "dev", "root", "home", ".singularity.d/env"):
        (root / d).mkdir(parents=True, exist_ok=True)
    for link in ("bin", "lib", "lib64", "sbin"):
        if not (root / link).is_symlink():
            (root / link).symlink_to(f"usr/{link}")
    for f in ("passwd", "group"):
        shutil.copy(f"/etc/{f}", root / "etc" / f)
    if not host:
        return root
    for bind in host_binds():  # mount points: a build in a user namespace cannot create them
        (root / bind.lstrip("/")).mkdir(parents=True, exist_ok=True)
    env = root / ".singularity.d" / "env" / "90-environment.sh"
    env.write_text(f"#!/bin/sh\nexport PATH={venv_bin}:$PATH\nexport PYTHONNOUSERSITE=1\n")
    env.chmod(0o755)
    return root
