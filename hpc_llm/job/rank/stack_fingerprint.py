"""What the check before the queue's verdicts depend on in this environment, taken with the
standard library alone: before the stack is imported, and at each request of the warm checker
(:mod:`hpc_llm.job.rank.check_server`; a few milliseconds).

:func:`fingerprint`: the interpreter and what is installed on ``sys.path``. It changes when a
distribution is installed, upgraded or removed (each directory's ``*.dist-info``,
``*.egg-info``, ``*.pth`` and ``*.egg-link`` entries, whose names carry the versions, and that
directory's mtime, which every install and removal moves), and when a module appears in or
leaves a plain directory on the path (one without that metadata: ``PYTHONPATH``, a source
tree; by name only, as its mtime moves with every file made in it). :func:`sources`: the
modules the check has loaded from hpc_llm's package (itself, the callbacks and logger whose
arguments it checks, what they import) and from those plain directories (a plugin on
``PYTHONPATH``), by size and mtime: an editable install of a checkout being edited, a plugin
edited in place; a verdict holds them and is not used once one changed (:func:`unchanged`;
issue #54 found a plugin on ``PYTHONPATH`` edited after a check kept its stale "ok"). Not
seen: a third-party package's sources edited in place inside ``site-packages`` (an editable
LLM Foundry); ``precheck.cache=false`` is for that.
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
#: ``sys.path`` as the check found it, before the stack was imported: a directory a library
#: appends at run time is not the user's (torch appends a temporary one, gone with the process)
_START_PATH = tuple(os.path.abspath(p or ".") for p in sys.path)


def fingerprint() -> str:
    """A SHA-256 of the interpreter and of what is installed on ``sys.path``."""
    h = hashlib.sha256()
    h.update(f"{sys.version}\0{sys.platform}\0{os.path.realpath(sys.executable)}\n".encode())
    plain = plain_dirs()
    for entry in sys.path:
        _installed(h, os.path.abspath(entry or "."), plain)
    return h.hexdigest()


def sources() -> dict[str, list[int]]:
    """The modules loaded in this process from hpc_llm's package (by their path in it) and from
    the plain directories of ``sys.path`` (by their absolute path): ``{path: [size, mtime_ns]}``."""
    package = str(_PACKAGE) + os.sep
    plain = set(plain_dirs())
    out: dict[str, list[int]] = {}
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None)
        if not path:
            continue
        if path.startswith(package):
            key = os.path.relpath(path, _PACKAGE)
        elif _imported_from(name, path) in plain:
            key = path
        else:
            continue
        with contextlib.suppress(OSError):
            st = os.stat(path)
            out[key] = [st.st_size, st.st_mtime_ns]
    return out


def _imported_from(name: str, path: str) -> str:
    """The ``sys.path`` directory module ``name`` was found in (``a.b.c`` at ``D/a/b/c.py``: ``D``;
    a venv inside a source tree is not that tree's)."""
    up = name.count(".") + (1 if os.path.basename(path).startswith("__init__.") else 0)
    folder = os.path.dirname(path)
    for _ in range(up):
        folder = os.path.dirname(folder)
    return folder


def plain_dirs() -> list[str]:
    """The directories of ``sys.path`` that hold no installed distribution (``PYTHONPATH``, a
    source tree, the working directory), the interpreter's own standard library and what a
    library appended since the start left out."""
    interpreter = tuple(os.path.realpath(p) + os.sep for p in {sys.base_prefix, sys.prefix})
    out = []
    for entry in sys.path:
        path = os.path.abspath(entry or ".")
        if path not in _START_PATH or (os.path.realpath(path) + os.sep).startswith(interpreter):
            continue
        if not os.path.isdir(path):
            continue
        with contextlib.suppress(OSError):
            if path not in out and not any(n.endswith(METADATA) for n in os.listdir(path)):
                out.append(path)
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


def _installed(h: hashlib._Hash, entry: str, plain: list[str]) -> None:
    """What is installed in one ``sys.path`` entry. A directory that holds no metadata (the
    working directory, a source tree, ``PYTHONPATH``) counts by the names of the modules and
    packages in it, not its mtime, which moves with every file made in it; what its modules
    say is :func:`sources`'s."""
    try:
        if os.path.isfile(entry):  # a zip or wheel on the path
            st = os.stat(entry)
            h.update(f"{entry}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
            return
        listing = os.listdir(entry)
        names = sorted(n for n in listing if n.endswith(METADATA))
        if names:
            h.update(f"{entry}\0{os.stat(entry).st_mtime_ns}\0{chr(0).join(names)}\n".encode())
            return
        if entry in plain:
            modules = sorted(n for n in listing if _importable(entry, n))
            h.update(f"{entry}\0plain\0{chr(0).join(modules)}\n".encode())
    except OSError:
        return


def _importable(folder: str, name: str) -> bool:
    """``name`` in ``folder`` is a module or a package an import could find."""
    if name.endswith((".py", ".pyc", ".so", ".pyd")):
        return True
    return name.isidentifier() and os.path.isfile(os.path.join(folder, name, "__init__.py"))


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
