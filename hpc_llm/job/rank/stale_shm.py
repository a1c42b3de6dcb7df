"""Streaming's shared memory that no process uses any more, removed before a rank's loaders start
(docs/upstream-fixes.md, upstream fix 8).

A ``StreamingDataset`` registers its local dirs under a numbered prefix in ``/dev/shm``
(``000003_locals``, ``000003_barrier``, ...: ``streaming.base.constant.SHM_TO_CLEAN``) and
refuses a local dir that a registration with a remote already names ("reused local
directory"). A rank killed by a signal (a restart in place, a requeue) never unregisters, so
its successor on the node would be refused.

Streaming's own ``clean_stale_shared_memory()`` is not used, for two reasons:

* it starts torch.distributed itself (a rendezvous on ``MASTER_PORT``, a barrier, then
  ``destroy_process_group``), right before LLM Foundry's own rendezvous on the same port. A
  rank that leaves the first one early can join the second on its peer's old store, still
  open while that peer is descheduled between the barrier and the destroy; the peer's new
  store then waits for it until the process-group timeout ("DistStoreError: Timed out after
  601 seconds waiting for clients. 1/2 clients joined."): a start-up stalled 10 minutes in
  CI, and reproduced with a 0.5 s sleep before that destroy;
* it unlinks every Streaming registration on the host, a live one of another job on a shared
  node included; that job's loader workers started later would attach to the next job's.

:func:`clean` needs no peer. Local rank 0 of each node runs it before its rendezvous, so
before any rank of the generation has registered anything, and removes a prefix when

* every local dir it registers lies in this job's scratch on this node (``own``: the
  built-in remote streams cache there): only this job's ranks on this node register those,
  and every one that could be alive is of this generation, which has registered nothing yet;
* or no process maps any of its names. Not enough alone: Streaming keeps every registration
  it *reads* while looking for a free prefix mapped until its process exits (an ``atexit``
  hook holds each one), so any dataset started on the node since then keeps a dead one
  mapped. It is what protects a registration of another job (a user's own absolute ``local``).

Another user's registrations are theirs to clean (unlinking them is refused). Stdlib only,
except Streaming's list of names and its reading of a registration.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

log = logging.getLogger(__name__)

SHM_DIR = Path("/dev/shm")
PROC = Path("/proc")


def streaming_names() -> tuple[str, ...]:
    from streaming.base.constant import SHM_TO_CLEAN

    return tuple(SHM_TO_CLEAN)


def mapped() -> set[str]:
    """Names in /dev/shm that a process this user can read has mapped."""
    marker = (str(SHM_DIR) + "/").encode()
    found: set[str] = set()
    for pid in os.listdir(PROC):
        if not pid.isdigit():
            continue
        try:
            data = (PROC / pid / "maps").read_bytes()
        except OSError:  # gone meanwhile, or another user's
            continue
        if marker not in data:
            continue
        for line in data.splitlines():
            at = line.find(marker)
            if at >= 0:
                found.add(line[at + len(marker) :].decode(errors="replace").removesuffix(" (deleted)"))
    return found


def registered_dirs(path: Path) -> list[str] | None:
    """The local dirs a ``<prefix>_locals`` registration names; None when it cannot be read."""
    from streaming.base.shared.prefix import _unpack_locals

    try:
        return _unpack_locals(path.read_bytes())[0]
    except (OSError, ValueError, IndexError, UnicodeDecodeError):
        return None


def clean(own: Path | None = None) -> list[str]:
    """Unlink every Streaming prefix in /dev/shm that is stale (the module's two rules; ``own``:
    this job's scratch on this node); the names removed. Listed before the processes are read,
    so a registration made meanwhile is not even seen."""
    pattern = re.compile(r"(\d{6})_(?:" + "|".join(map(re.escape, streaming_names())) + ")")
    try:
        entries = os.listdir(SHM_DIR)
    except OSError:  # no /dev/shm: nothing of Streaming's to find either
        return []
    prefixes: dict[str, list[str]] = {}
    for entry in entries:
        m = pattern.fullmatch(entry)
        if m:
            prefixes.setdefault(m.group(1), []).append(entry)
    if not prefixes:
        return []
    live = mapped()
    removed: list[str] = []
    for prefix, found in sorted(prefixes.items()):
        ours = (
            own is not None
            and bool(dirs := registered_dirs(SHM_DIR / f"{prefix}_locals"))
            and all(Path(d).is_relative_to(own) for d in dirs or ())
        )
        if not ours and any(name in live for name in found):
            continue
        for name in sorted(found):
            try:
                os.unlink(SHM_DIR / name)
            except FileNotFoundError:
                continue
            except PermissionError:  # another user's
                break
            removed.append(name)
    if removed:
        log.info("removed stale Streaming shared memory: %s", " ".join(removed))
    return removed
