"""What the check before the queue's verdicts depend on in this environment, taken with the
standard library alone: before the stack is imported, and at each request of the warm checker
(:mod:`hpc_llm.job.rank.check_server`; a few milliseconds).

:func:`fingerprint`: the interpreter and what is installed on ``sys.path``. It changes when a
distribution is installed, upgraded or removed (each directory's ``*.dist-info``,
``*.egg-info``, ``*.pth`` and ``*.egg-link`` entries, whose names carry the versions, and that
directory's mtime, which every install and removal moves). :func:`sources`: hpc_llm's own
modules the check has loaded (itself, the callbacks and logger whose arguments it checks, what
they import), by size and mtime: an editable install of a checkout being edited; a verdict
holds them and is not used once one changed (:func:`unchanged`). Not seen: a third-party
package's sources edited in place (an editable LLM Foundry); ``precheck.cache=false`` is for that.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import sys
from pathlib import Path

#: names in a ``sys.path`` directory that say what is installed there
METADATA = (".dist-info", ".egg-info", ".pth", ".egg-link")
#: the distributions a verdict comes from, named in the line the login side prints
STACK = ("llm-foundry", "mosaicml", "torch")
#: the hpc_llm package this environment runs
_PACKAGE = Path(__file__).resolve().parents[2]


def fingerprint() -> str:
    """A SHA-256 of the interpreter and of what is installed on ``sys.path``."""
    h = hashlib.sha256()
    h.update(f"{sys.version}\0{sys.platform}\0{os.path.realpath(sys.executable)}\n".encode())
    for entry in sys.path:
        _installed(h, os.path.abspath(entry or "."))
    return h.hexdigest()


def sources() -> dict[str, list[int]]:
    """hpc_llm's modules loaded in this process: ``{path in the package: [size, mtime_ns]}``."""
    out: dict[str, list[int]] = {}
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if path and path.startswith(str(_PACKAGE) + os.sep):
            with contextlib.suppress(OSError):
                st = os.stat(path)
                out[os.path.relpath(path, _PACKAGE)] = [st.st_size, st.st_mtime_ns]
    return out


def unchanged(made_with: dict[str, list[int]]) -> bool:
    """Whether hpc_llm's sources a verdict was made with are as they were."""
    for rel, was in made_with.items():
        try:
            st = os.stat(_PACKAGE / rel)
        except OSError:
            return False
        if [st.st_size, st.st_mtime_ns] != was:
            return False
    return True


def _installed(h: hashlib._Hash, entry: str) -> None:
    """What is installed in one ``sys.path`` entry. A directory that holds no metadata (the
    working directory, a source tree) is left out: its mtime moves with every file made in it."""
    try:
        if os.path.isfile(entry):  # a zip or wheel on the path
            st = os.stat(entry)
            h.update(f"{entry}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
            return
        names = sorted(n for n in os.listdir(entry) if n.endswith(METADATA))
        if names:
            h.update(f"{entry}\0{os.stat(entry).st_mtime_ns}\0{chr(0).join(names)}\n".encode())
    except OSError:
        return


def versions() -> dict[str, str | None]:
    """The stack's versions as installed (``None``: not installed), without importing it."""
    from importlib import metadata

    out: dict[str, str | None] = {}
    for name in STACK:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def describe(found: dict[str, str | None]) -> str:
    """``llm-foundry 0.22.0, mosaicml 0.32.1, torch 2.7.0``."""
    return ", ".join(f"{name} {version}" for name, version in found.items() if version)
