"""What a run was submitted from: git commit, dirty tree and diff, command line, versions.

The launcher collects it once per invocation (:func:`collect`) and writes it
into every run dir (``.hpc_llm/provenance.json``, the diff beside it as
``.hpc_llm/git.diff``); rank 0 adds the versions of the training stack it
actually imported (:func:`for_results`, which may differ from the login
node's when the job runs in a container) and results.json carries the whole.

Git is asked by its command line (no library here is both light and kept for
this: GitPython shells out the same way), for the repository holding the
working directory and the one holding hpc_llm's own source, when they exist.
"""

from __future__ import annotations

import getpass
import hashlib
import json
import os
import platform
import shlex
import socket
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from hpc_llm.rundir.layout import RunDir

#: a diff larger than this is cut (its sha1 is of the whole); a generated file
#: checked in by mistake must not copy gigabytes into every run dir
MAX_DIFF_BYTES = 8 << 20
#: the distributions of the login side and of the training stack, by their PyPI names
LOGIN_PACKAGES = ("hpc-llm", "hydra-core", "omegaconf", "submitit", "pluggy")
TRAINING_PACKAGES = ("torch", "mosaicml", "llm-foundry", "mosaicml-streaming", "transformers", "torchtitan")


def _git(repo: Path, *args: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


def git_state(where: Path) -> tuple[dict[str, Any], str] | None:
    """Commit, branch, dirtiness and the diff against HEAD (tracked files) of the
    repository holding ``where``; None outside a repository or without git."""
    top = _git(where, "rev-parse", "--show-toplevel")
    if top is None:
        return None
    repo = Path(top.strip())
    commit = (_git(repo, "rev-parse", "HEAD") or "").strip() or None
    branch = (_git(repo, "rev-parse", "--abbrev-ref", "HEAD") or "").strip() or None
    status = _git(repo, "status", "--porcelain", "--untracked-files=no") or ""
    diff = (_git(repo, "diff", "HEAD", "--no-color", "--no-ext-diff") or "") if commit else ""
    untracked = (_git(repo, "ls-files", "--others", "--exclude-standard") or "").split()
    state = {
        "repo": str(repo),
        "commit": commit,
        "branch": branch,
        "dirty": bool(status.strip()),
        "untracked_files": len(untracked),
        "diff_sha1": hashlib.sha1(diff.encode()).hexdigest() if diff else None,
        "diff_bytes": len(diff.encode()),
    }
    return state, diff


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def plugin_versions() -> dict[str, str]:
    """Every installed distribution that registers hpc_llm plugins (entry-point group
    ``hpc_llm``), by name; read from metadata, nothing is imported."""
    from hpc_llm.plugins.manager import ENTRY_POINT_GROUP

    out: dict[str, str] = {}
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        dist = getattr(ep, "dist", None)
        if dist is not None:
            out[str(dist.metadata["Name"])] = str(dist.version)
    return dict(sorted(out.items()))


def command_line(argv: list[str] | None = None) -> str:
    """The command as the user typed it (``python -m hpc_llm ...`` rather than the path of
    ``__main__.py`` that Python puts in argv[0])."""
    if argv is None and os.environ.get("HPC_LLM_COMMAND"):  # set by hpc_llm.app.main, as typed
        args = shlex.split(os.environ["HPC_LLM_COMMAND"])
    else:
        args = list(sys.argv if argv is None else argv)
    if args and Path(args[0]).name == "__main__.py" and Path(args[0]).parent.name == "hpc_llm":
        args[0:1] = ["python", "-m", "hpc_llm"]
    return shlex.join(args)


def collect(cwd: Path | None = None) -> tuple[dict[str, Any], str]:
    """The login side's provenance and the diff of the primary repository: the one holding
    the working directory, else hpc_llm's own checkout."""
    from hpc_llm.paths import source_root

    repos: list[dict[str, Any]] = []
    diff = ""
    for where in (Path(cwd or os.getcwd()), source_root()):
        if where is None:
            continue
        found = git_state(where)
        if found is None or any(r["repo"] == found[0]["repo"] for r in repos):
            continue
        if not repos:
            diff = found[1]
        repos.append(found[0])
    prov: dict[str, Any] = {
        "command": command_line(),
        "cwd": str(cwd or os.getcwd()),
        "user": getpass.getuser(),
        "host": socket.gethostname(),
        "submitted_at": time.time(),
        "git": repos[0] if repos else None,
        "repos": repos,
        "versions": {"python": platform.python_version(), **{n: _version(n) for n in LOGIN_PACKAGES}},
        "plugins": plugin_versions(),
    }
    return prov, diff


def write(run_dir: Path | str, prov: dict[str, Any], diff: str) -> None:
    """``.hpc_llm/provenance.json`` and, when the tree was dirty, ``.hpc_llm/git.diff``."""
    rd = RunDir(run_dir)
    rd.private.mkdir(parents=True, exist_ok=True)
    data = dict(prov)
    if diff:
        blob = diff.encode()
        rd.git_diff.write_bytes(blob[:MAX_DIFF_BYTES])
        data["diff_file"] = str(rd.git_diff.relative_to(rd.root))
        data["diff_truncated"] = len(blob) > MAX_DIFF_BYTES
    rd.provenance.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def read(run_dir: Path | str) -> dict[str, Any] | None:
    path = RunDir(run_dir).provenance
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def for_results(run_dir: Path | str) -> dict[str, Any]:
    """What results.json carries: the submit-time record plus what the job itself runs
    (training-stack versions, where hpc_llm was imported from, the interpreter)."""
    import hpc_llm

    prov = read(run_dir) or {}
    prov["job"] = {
        "python": platform.python_version(),
        "executable": sys.executable,
        "hpc_llm_path": str(Path(hpc_llm.__file__).resolve().parent),
        "versions": {n: _version(n) for n in (*LOGIN_PACKAGES, *TRAINING_PACKAGES)},
        "plugins": plugin_versions(),
    }
    return prov


def short(prov: dict[str, Any] | None) -> str:
    """``abc12345`` or ``abc12345+dirty`` for tables; ``-`` when not known."""
    git = (prov or {}).get("git") or {}
    commit = git.get("commit")
    if not commit:
        return "-"
    return str(commit)[:8] + ("+dirty" if git.get("dirty") else "")
