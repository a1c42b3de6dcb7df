"""pyxis and enroot on the dev cluster (``hpc-llm dev-cluster up --pyxis``).

``scripts/install-pyxis.sh`` builds enroot and one ``spank_pyxis.so`` per Slurm version into a
prefix of the project's own (``/opt/hpc_llm-pyxis`` or ``$HPC_LLM_PYXIS_PREFIX``). A cluster
started with ``pyxis=True`` then has:

- ``etc/plugstack.conf`` beside its slurm.conf (where srun, sbatch and slurmd look for it):
  ``required <prefix>/slurm-<version>/spank_pyxis.so runtime_path=<root>/pyxis/run``. A plugin
  built against the other version's spank.h does not load ("Incompatible plugin version").
- enroot on every slurmd's PATH: pyxis ``execvpe``s ``enroot``, and slurmstepd keeps slurmd's
  PATH (and nothing else of its environment: pyxis clears it, then passes the job's in, less
  the ``ENROOT_*_PATH`` variables).
- each node's own enroot directories, ``<root>/pyxis/<node>/{data,cache,runtime,tmp}``: on a real
  cluster each node unpacks images on its own disk; here the nodes share one, and two nodes of
  one job would unpack ``pyxis_<job>.<step>`` into the same directory. Since pyxis passes no
  ``ENROOT_*_PATH`` from the job and enroot's config file is one per install, each node's PATH
  starts with a directory holding an ``enroot`` of its own: a two-line script that exports the
  node's paths and execs the real one (:func:`node_bin`).
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path

PREFIX_ENV = "HPC_LLM_PYXIS_PREFIX"
DEFAULT_PREFIX = Path("/opt/hpc_llm-pyxis")


def prefix() -> Path:
    env = os.environ.get(PREFIX_ENV)
    return Path(env).expanduser() if env else DEFAULT_PREFIX


def enroot() -> Path:
    """The enroot install-pyxis.sh built (its paths are baked in at build time)."""
    return prefix() / "enroot" / "bin" / "enroot"


def plugin(slurm: str) -> Path:
    """The spank_pyxis.so built against Slurm ``slurm``'s headers."""
    return prefix() / f"slurm-{slurm}" / "spank_pyxis.so"


def unavailable(slurm: str) -> str | None:
    """Why a dev cluster of Slurm ``slurm`` cannot run pyxis here (None: it can): the one line
    install-pyxis.sh wrote when it could not build, or what is missing."""
    why = Path(str(prefix()) + ".why")
    if why.is_file() and why.read_text().strip():
        return f"pyxis and enroot are not installed: {why.read_text().strip()}"
    if not enroot().is_file():
        return f"pyxis and enroot are not installed (no {enroot()}): run bash scripts/install-pyxis.sh"
    if not plugin(slurm).is_file():
        return (
            f"pyxis is not built for Slurm {slurm} (no {plugin(slurm)}): run bash scripts/install-pyxis.sh "
            "after scripts/install-slurm.sh"
        )
    return None


def runtime_path(root: Path) -> Path:
    return root / "pyxis" / "run"


def node_dir(root: Path, node: str) -> Path:
    return root / "pyxis" / node


def node_bin(root: Path, node: str) -> Path:
    """The directory first on node ``node``'s slurmd PATH: its own ``enroot``."""
    return node_dir(root, node) / "bin"


def plugstack_conf(root: Path, slurm: str) -> str:
    return f"required {plugin(slurm)} runtime_path={runtime_path(root)}\n"


def write(root: Path, slurm: str, nodes: list[str]) -> None:
    """plugstack.conf and each node's enroot directories and wrapper (see the module docstring)."""
    (root / "etc" / "plugstack.conf").write_text(plugstack_conf(root, slurm))
    runtime_path(root).mkdir(parents=True, exist_ok=True)
    for node in nodes:
        d = node_dir(root, node)
        paths = {name: d / name.lower() for name in ("DATA", "CACHE", "RUNTIME", "TEMP")}
        for p in paths.values():
            p.mkdir(parents=True, exist_ok=True)
        node_bin(root, node).mkdir(parents=True, exist_ok=True)
        exports = " ".join(f"ENROOT_{k}_PATH={shlex.quote(str(v))}" for k, v in paths.items())
        wrapper = node_bin(root, node) / "enroot"
        wrapper.write_text(
            f'#!/bin/sh\n# node {node}\'s own enroot directories\nexport {exports}\nexec {enroot()} "$@"\n'
        )
        wrapper.chmod(0o755)


def remove(root: Path) -> None:
    """A cluster started again without pyxis loads no plugin."""
    (root / "etc" / "plugstack.conf").unlink(missing_ok=True)


def slurmd_path(root: Path, node: str, path: str) -> str:
    """Node ``node``'s slurmd PATH: its enroot first (slurmstepd, and so pyxis, keep it), then
    enroot's own helpers (enroot execs enroot-nsenter, enroot-switchroot... from PATH)."""
    return f"{node_bin(root, node)}:{enroot().parent}:{path}"
