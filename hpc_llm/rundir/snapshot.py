"""A copy of the code a queued job will run, taken at submit time.

``hydra.launcher.snapshot=true``: a job may wait in the queue for days while
its author keeps editing the checkout it was submitted from. The launcher
copies what the job imports into ``<sweep dir>/.hpc_llm/code`` and the batch
script puts that first on ``PYTHONPATH``, so the job runs the code as it was
when it was submitted:

- the ``hpc_llm`` package, with ``conf/``, ``sbatch_templates/`` and
  ``containers/`` under ``hpc_llm/_data/`` (where a wheel keeps them,
  :mod:`hpc_llm.paths`) and the ``hydra_plugins`` namespace package;
- every installed plugin package (entry-point group ``hpc_llm``): its
  top-level package and its ``.dist-info``, so plugin discovery finds the
  copies first (``importlib.metadata`` keeps the first distribution of a name
  on ``sys.path``).

The libraries (torch, LLM Foundry, ...) are not copied: they change when the
environment is reinstalled, which provenance records (:mod:`hpc_llm.rundir.provenance`).
"""

from __future__ import annotations

import importlib.util
import shutil
from importlib import metadata
from pathlib import Path

from hpc_llm.paths import conf_dir, containers_dir, templates_dir

_IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache", ".mypy_cache")


def _package_dir(name: str) -> Path | None:
    """Where top-level module ``name`` lives (a package dir or a .py file), without importing it."""
    spec = importlib.util.find_spec(name)
    if spec is None:
        return None
    if spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations)))
    return Path(spec.origin) if spec.origin else None


def _copy(src: Path, dest: Path) -> None:
    if src.is_dir():
        shutil.copytree(src, dest, ignore=_IGNORE, dirs_exist_ok=True)
    else:
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dest)


def _plugin_packages() -> list[tuple[str, Path | None, Path | None]]:
    """(distribution, top-level package, dist-info dir) of every installed hpc_llm plugin."""
    from hpc_llm.plugins.manager import ENTRY_POINT_GROUP

    out: dict[str, tuple[str, Path | None, Path | None]] = {}
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        dist = getattr(ep, "dist", None)
        top = ep.value.split(":")[0].split(".")[0]
        info = getattr(dist, "_path", None)  # PathDistribution: its .dist-info directory
        out[top] = (str(dist.metadata["Name"]) if dist else top, _package_dir(top), Path(info) if info else None)
    return list(out.values())


def take(dest: Path) -> Path:
    """Copy the code into a new directory ``dest`` (an existing one is never reused: a job
    already queued may run from it) and return it."""
    dest = Path(dest)
    n = 1
    while dest.exists():
        n += 1
        dest = dest.with_name(f"{dest.name.split('.')[0]}.{n}")
    work = dest.with_name(dest.name + ".partial")
    shutil.rmtree(work, ignore_errors=True)
    hpc_llm_dir = _package_dir("hpc_llm")
    if hpc_llm_dir is None:  # pragma: no cover - we are running from it
        raise RuntimeError("hpc_llm is not importable")
    _copy(hpc_llm_dir, work / "hpc_llm")
    for name, src in (("conf", conf_dir()), ("sbatch_templates", templates_dir()), ("containers", containers_dir())):
        _copy(src, work / "hpc_llm" / "_data" / name)
    hydra_plugins = _package_dir("hydra_plugins.hpc_llm_launchers")
    if hydra_plugins is not None:
        _copy(hydra_plugins, work / "hydra_plugins" / "hpc_llm_launchers")
    for _dist, package, info in _plugin_packages():
        if package is not None and package.resolve() != hpc_llm_dir.resolve():
            _copy(package, work / package.name)
        if info is not None and info.is_dir():
            _copy(info, work / info.name)
    work.rename(dest)
    return dest
