"""Run a preparation step once across ranks, processes and nodes.

Before ``torch.distributed`` exists there is no barrier, so ranks that all
want a prepared artifact (tokenizer, MDS shards) serialise on an exclusive
``flock`` next to it: the first builds into a temporary directory and renames
it into place (atomic on one filesystem); the others find it done. flock works
on local filesystems and on NFSv4 / Lustre, where shared caches live.
"""

from __future__ import annotations

import fcntl
import os
import shutil
from collections.abc import Callable
from pathlib import Path


def build_once(target: Path, build: Callable[[Path], None]) -> Path:
    """Ensure ``target`` exists, calling ``build(tmpdir)`` at most once."""
    target = Path(target)
    if target.is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    lock_path = target.parent / f".{target.name}.lock"
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if target.is_dir():
                return target
            tmp = target.parent / f".{target.name}.tmp-{os.getpid()}"
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir()
            try:
                build(tmp)
                os.rename(tmp, target)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return target
