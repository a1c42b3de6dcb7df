"""Write the resolved constraints of an environment: every distribution hpc_llm[EXTRAS] needs, pinned.

    .venv/bin/python scripts/freeze-constraints.py train,test > constraints/llmfoundry.txt
    .venv-torchtitan/bin/python scripts/freeze-constraints.py torchtitan > constraints/torchtitan.txt

Run with the Python of an environment that was installed and tested (scripts/setup-dev.sh): it
walks the installed distributions' requirements from ``hpc-llm[EXTRAS]`` (markers evaluated for
this Python and platform, extras followed) and prints ``name==version`` for each, sorted. pip then
installs exactly these (``-c constraints/llmfoundry.txt``) instead of resolving again: no
backtracking, the same versions on every machine. Hand-written because pip freeze lists whatever
else the environment holds, and pip-tools is one more tool to install. tests/test_constraints.py
fails when pyproject.toml and the file disagree.
"""

from __future__ import annotations

import os
import sys
from importlib import metadata

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name


def closure(root: str, extras: set[str]) -> dict[str, str]:
    """canonical name -> installed version, for ``root[extras]`` and everything it needs."""
    out: dict[str, str] = {}
    todo: list[tuple[str, set[str]]] = [(root, extras)]
    seen: set[tuple[str, frozenset[str]]] = set()
    while todo:
        name, wanted = todo.pop()
        key = (canonicalize_name(name), frozenset(wanted))
        if key in seen:
            continue
        seen.add(key)
        dist = metadata.distribution(name)
        if key[0] != canonicalize_name(root):
            out[key[0]] = dist.version
        for line in dist.requires or []:
            req = Requirement(line)
            envs = [{"extra": e} for e in wanted] or [{"extra": ""}]
            if req.marker is not None and not any(req.marker.evaluate(env) for env in envs):
                continue
            todo.append((req.name, set(req.extras)))
    return out


def main() -> None:
    extras = {e for e in (sys.argv[1] if len(sys.argv) > 1 else "train,test").split(",") if e}
    pins = closure("hpc-llm", extras)
    print(
        f"# hpc-llm[{','.join(sorted(extras))}] on Python {sys.version_info.major}.{sys.version_info.minor}, resolved"
    )
    venv = os.path.relpath(sys.prefix)  # .venv, or .venv-torchtitan for its own environment
    print(f"# by pip and tested; regenerate: {venv}/bin/python scripts/freeze-constraints.py", ",".join(sorted(extras)))
    for name, version in sorted(pins.items()):
        print(f"{name}=={version}")


if __name__ == "__main__":
    main()
