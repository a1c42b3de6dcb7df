"""The check before the queue's verdicts, kept: a point checked once with one stack is not
checked again. Stdlib only; used by the warm checker (:mod:`hpc_llm.job.rank.check_server`)
and by the one-shot check (:mod:`hpc_llm.job.rank.foundry_check` ``--cache``), in the job's
environment, in the directory the login side names (``<hpc_llm home>/precheck/cache``).

One file a verdict, ``<root>/<key[:2]>/<key>.json``: the point's problems (an empty list: it
passed) and the sources the check ran with (hpc_llm's, and a plugin's on ``PYTHONPATH``:
:func:`~hpc_llm.job.rank.stack_fingerprint.sources`). The key is a SHA-256 of the rest of what a
verdict depends on: the environment as the login side names it (its command, the image), the
stack's fingerprint inside it (:mod:`hpc_llm.job.rank.stack_fingerprint`) and the point as
checked (its train config, with the run dir written as ``<run dir>``, its world size, its
device); a verdict whose sources changed since is a miss. A file is written whole
under a name of its own, then renamed over the key's (``os.replace`` is atomic): two submits
at once write the same bytes and a reader never sees half a file; a file that does not parse
is a miss. Verdicts not written for :data:`KEEP_S` are removed when a checker starts.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from hpc_llm.job.rank.stack_fingerprint import unchanged

#: bumped when what a verdict holds changes
VERSION = 2
#: a verdict not written again for this long is removed (the stack it was made with is gone, mostly)
KEEP_S = 30 * 86400


class VerdictCache:
    """Verdicts under ``root`` for one environment and stack; ``root`` None keeps nothing."""

    def __init__(self, root: str | None, environment: str, stack: str) -> None:
        self.root = Path(root) if root else None
        self.environment = environment
        self.stack = stack

    def key(self, point: dict[str, Any]) -> str:
        blob = json.dumps([VERSION, self.environment, self.stack, point], sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()

    def get(self, key: str) -> list[list[str]] | None:
        if self.root is None:
            return None
        try:
            found = json.loads((self.root / key[:2] / f"{key}.json").read_text())
            problems, made_with = found["problems"], found["sources"]
        except (OSError, ValueError, TypeError, KeyError):
            return None
        return problems if isinstance(problems, list) and unchanged(made_with) else None

    def put(self, key: str, problems: list[tuple[str, str]], made_with: dict[str, list[int]]) -> None:
        if self.root is None:
            return
        path = self.root / key[:2] / f"{key}.json"
        tmp = None
        try:
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".", suffix=".tmp")
            with os.fdopen(fd, "w") as f:
                json.dump({"problems": [list(p) for p in problems], "sources": made_with}, f)
            os.replace(tmp, path)
        except OSError:  # a full or read-only disk costs a check next time, not this one
            if tmp is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)

    def prune(self, now: float | None = None) -> int:
        """Remove the verdicts (and stray temporary files) older than :data:`KEEP_S`."""
        if self.root is None or not self.root.is_dir():
            return 0
        before = (now or time.time()) - KEEP_S
        removed = 0
        for path in self.root.glob("*/*"):
            with contextlib.suppress(OSError):
                if path.stat().st_mtime < before:
                    path.unlink()
                    removed += 1
        return removed
