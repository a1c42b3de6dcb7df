"""Where the non-Python parts of the toolkit live.

``conf/``, ``sbatch_templates/`` and ``containers/`` sit at the top of the
repository so users find them, and are force-included into the wheel under
``hpc_llm/_data/``. An editable install sees the repository copies, a wheel
install sees the packaged ones. Hatchling has no "data directory mapped into a
package" that works for both editable and wheel installs, hence this lookup.
"""

from __future__ import annotations

import os
from pathlib import Path

_PKG = Path(__file__).resolve().parent


def _data_dir(name: str) -> Path:
    for candidate in (_PKG / "_data" / name, _PKG.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(
        f"hpc_llm data directory '{name}' not found next to the package ({_PKG}); reinstall hpc-llm"
    )


def conf_dir() -> Path:
    """The Hydra config tree (``conf/``)."""
    return _data_dir("conf")


def templates_dir() -> Path:
    """The sbatch templates (``sbatch_templates/``)."""
    return _data_dir("sbatch_templates")


def containers_dir() -> Path:
    """The Apptainer definition files (``containers/``)."""
    return _data_dir("containers")


def size_bytes(path: Path) -> int:
    """Bytes of a file, or of every file under a directory (checkpoints, HF model dirs)."""
    path = Path(path)
    if path.is_file():
        return path.stat().st_size
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def source_root() -> Path | None:
    """The repository checkout this package runs from (editable install), if any."""
    root = _PKG.parent
    return root if (root / "pyproject.toml").is_file() and (root / "containers").is_dir() else None


def assets_dir() -> Path:
    """Small files shipped inside the package (the bundled tiny corpus)."""
    return _PKG / "assets"


def cache_dir() -> Path:
    """Per-user cache for derived data (tokenizers, MDS shards).

    Must be on a filesystem every node sees; ``HPC_LLM_CACHE`` overrides it.
    """
    env = os.environ.get("HPC_LLM_CACHE")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "hpc_llm"


def user_dir() -> Path:
    """The user's own hpc_llm directory (``~/.hpc_llm``): not a run directory."""
    return Path.home() / ".hpc_llm"


def state_dir() -> Path:
    """Where the login side keeps its state (the run ledger): ``$HPC_LLM_HOME``, else :func:`user_dir`."""
    return Path(os.environ.get("HPC_LLM_HOME") or user_dir()).expanduser()


def claim_new_dir(base: str) -> str:
    """Make ``base``, or the first of ``base_2``, ``base_3``, ... that nobody has made, and return
    it: a directory this process has alone. ``os.mkdir`` is atomic, so two processes naming the
    same ``base`` (a sweep dir named to the second, submitted twice within it) never share one."""
    os.makedirs(os.path.dirname(os.path.abspath(base)), exist_ok=True)
    for n in range(1, 1000):
        claimed = base if n == 1 else f"{base}_{n}"
        try:
            os.mkdir(claimed)
            return claimed
        except FileExistsError:
            continue
    raise FileExistsError(f"{base} and {base}_2 to _999 exist")
