"""A run's checkpoints in an S3 store, rank side (boto3, via :mod:`hpc_llm.job.rank.object_store`):
the in-job half of the ``uri`` checkpoint backend (:mod:`hpc_llm.builtin.checkpoint`), and what
the ranks' remote saves and the stop path call (:mod:`hpc_llm.job.rank.remote_saves`,
:mod:`hpc_llm.job.rank.preemption_callback`). It lives on the rank side, not with the plugin:
core code never imports a built-in plugin, and the plugin imports this.

What Composer 0.32 leaves to us with a remote ``save_folder`` (docs/design/verified/object-stores.md), for ``s3://``:

- whose checkpoints a folder holds: :func:`owner` reads, :func:`claim` writes
  ``<folder>/hpc_llm-run.json`` (the run's name and run dir) at the first start; another run's
  folder is refused unless resumed on purpose (``checkpoint.resume_other=true``);
- ``latest``: Composer's link is an object, ``latest-rank0.pt.symlink`` (a sharded run:
  ``latest-sharded-rank0.symlink``), holding the key of the save it names. hpc_llm links it
  itself, once every rank's upload of a save is done (:func:`commit_latest`), so that a stop
  commits its save before the step exits;
- a save uploaded but never linked (a death between the upload and the link) is set aside
  to ``<folder>/unfinished/`` at the next start (:func:`set_aside_unfinished`): left in place,
  the resumed run's save of the same batch would fail with FileExistsError on every requeue;
- keep-last-K over the run's life (:func:`prune`): Composer's ``ObjectStore`` has no delete
  and its ``save_num_checkpoints_to_keep`` only ever removes local copies;
- the node-local side (:func:`prepare_node`): Composer's local copies and upload staging go
  to a per-rank folder in node scratch, emptied at each start, and the copy of ``latest``
  autoresume downloads into ``<cwd>/s3:/...`` (and then reuses, stale, on a requeue that lands
  on the same node) is removed before Composer starts and once it has been loaded.

The commit points (every write to the store) are :func:`claim`, :func:`commit_latest`,
:func:`set_aside_unfinished` and :func:`prune`; each goes through
:class:`~hpc_llm.job.rank.object_store.Store`'s one write gate.
"""

from __future__ import annotations

import json
import logging
import shutil
import socket
import time
from pathlib import Path
from typing import Any

from hpc_llm.job.rank import object_store
from hpc_llm.job.rank.object_store import STORE_OUTAGE_S, Location, Store
from hpc_llm.rundir.layout import CHECKPOINT_NAME, LATEST, LATEST_SHARDED, UNFINISHED

log = logging.getLogger(__name__)

#: who the folder's checkpoints belong to
OWNER = "hpc_llm-run.json"
SYMLINK = ".symlink"
#: the scheme of a save folder that autoresume copies into the working directory (``<cwd>/s3:/...``)
LOCAL_COPY_ROOT = "s3:"


def _rel(loc: Location, key: str) -> str:
    prefix = loc.key() + "/" if loc.prefix else ""
    return key[len(prefix) :] if key.startswith(prefix) else key


def saves(store: Store, loc: Location) -> dict[int, list[str]]:
    """batch -> the keys of that save at the folder's top level (a ``.pt`` per saving rank, or
    every object of a sharded save's folder)."""
    out: dict[int, list[str]] = {}
    for key in store.list(loc.key() + "/" if loc.prefix else ""):
        top = _rel(loc, key).split("/", 1)[0]
        m = CHECKPOINT_NAME.match(top)
        if m:
            out.setdefault(int(m.group(2)), []).append(key)
    return out


def latest(store: Store, loc: Location) -> tuple[str, int] | None:
    """(the key ``latest`` names, its batch), from Composer's symlink object; None without one."""
    for name in (LATEST, LATEST_SHARDED):
        data = store.read(loc.key(name + SYMLINK))
        if data is None:
            continue
        target = data.decode().strip()
        m = CHECKPOINT_NAME.match(target.rstrip("/").rsplit("/", 1)[-1])
        return target, int(m.group(2)) if m else 0
    return None


def owner(store: Store, loc: Location) -> dict[str, Any] | None:
    data = store.read(loc.key(OWNER))
    if data is None:
        return None
    try:
        found = json.loads(data)
    except ValueError:
        return {"run": None}
    return found if isinstance(found, dict) else {"run": None}


def claim(store: Store, loc: Location, run: str, run_dir: str, resume_other: bool) -> None:
    """Record this run as the folder's owner (a commit point). Another run's folder, or one
    whose checkpoints no run recorded, is refused unless resumed on purpose."""
    from hpc_llm.errors import ConfigError

    found = owner(store, loc)
    if found is not None and found.get("run") == run:
        return
    theirs = saves(store, loc)
    if (found is not None or theirs) and not resume_other:
        who = f"run {found.get('run')!r} (run dir {found.get('run_dir')})" if found else "a run hpc_llm did not record"
        raise ConfigError(
            f"checkpoint.location={loc.uri()!r} holds the checkpoints of {who}, not this run's ({run}); choose "
            "another checkpoint.location, or set checkpoint.resume_other=true to resume them on purpose"
        )
    record = {"run": run, "run_dir": run_dir, "claimed_at": time.time(), "host": socket.gethostname()}
    if found is not None or theirs:
        record["resumed_from"] = found or {"run": None}
        log.warning("hpc_llm: resuming the checkpoints in %s on purpose (checkpoint.resume_other=true)", loc.uri())
    store.put(loc.key(OWNER), json.dumps(record).encode())


def commit_latest(store: Store, symlink_key: str, target_key: str) -> None:
    """Link ``latest`` to a save whose every object is in the store (a commit point): the
    symlink object Composer's autoresume follows (``latest-rank0.pt.symlink``, a sharded run's
    ``latest-sharded-rank0.symlink``), holding the save's key, written whole in one PUT."""
    store.put(symlink_key, target_key.encode())


def set_aside_unfinished(store: Store, loc: Location) -> list[str]:
    """Move saves newer than the one ``latest`` names (or every save, without a link) to
    ``<folder>/unfinished/`` (commit points; docs/upstream-fixes.md, upstream fix 17). Nothing is
    deleted here; :func:`prune` keeps the newest of them."""
    found = latest(store, loc)
    newest = found[1] if found is not None else -1
    moved = []
    for batch, keys in sorted(saves(store, loc).items()):
        if batch <= newest:
            continue
        for key in keys:
            dest = loc.key(f"{UNFINISHED}/{_rel(loc, key)}")
            store.move(key, dest)
            moved.append(dest)
        log.warning(
            "hpc_llm: the save of batch %d in %s was never linked as latest; moved to %s/",
            batch,
            loc.uri(),
            loc.uri(UNFINISHED),
        )
    return moved


def prune(store: Store, loc: Location, keep: int) -> list[str]:
    """Keep-last-K over the run's life, in the store (commit points; docs/upstream-fixes.md,
    upstream fix 16): finished saves beyond the
    ``keep`` newest, never the one ``latest`` names; ``unfinished/`` keeps only its newest save."""
    if keep <= 0:
        return []
    found = latest(store, loc)
    newest = found[1] if found is not None else None
    removed: list[str] = []
    kept = 0
    for batch, keys in sorted(saves(store, loc).items(), reverse=True):
        if newest is not None and batch > newest:
            continue  # not linked: set aside at the next start, not pruned
        if kept < keep or batch == newest:
            kept += 1
            continue
        removed += keys
    aside: dict[int, list[str]] = {}
    for key in store.list(loc.key(UNFINISHED) + "/"):
        m = CHECKPOINT_NAME.match(_rel(loc, key).split("/")[1] if "/" in _rel(loc, key) else "")
        aside.setdefault(int(m.group(2)) if m else -1, []).append(key)
    for _batch, keys in sorted(aside.items(), reverse=True)[1:]:
        removed += keys
    store.delete(removed)
    if removed:
        log.info("hpc_llm: pruned %d object(s) of old checkpoints from %s (keep %d)", len(removed), loc.uri(), keep)
    return removed


def _quick(folder: str) -> tuple[Store, Location]:
    """For what results.json says of the store: a store that does not answer at once (a stop in
    a grace time) gets no minute-long retries."""
    return Store.of(folder, object_store.client(connect_timeout=3, read_timeout=5, attempts=1))


def latest_uri(folder: str) -> str | None:
    """The URI of the save ``latest`` names; None when there is none or the store does not answer."""
    try:
        store, loc = _quick(folder)
        found = latest(store, loc)
    except Exception as exc:
        log.warning("hpc_llm: could not read latest in %s (%s)", folder, object_store.describe(exc))
        return None
    return f"s3://{loc.bucket}/{found[0]}" if found else None


def latest_bytes(folder: str) -> int | None:
    """Bytes of the save ``latest`` names (a file, or every object of a sharded save's folder)."""
    try:
        store, loc = _quick(folder)
        found = latest(store, loc)
        if found is None:
            return None
        size = store.size(found[0])
        return size if size is not None else (sum(store.list(found[0].rstrip("/") + "/").values()) or None)
    except Exception as exc:
        log.warning("hpc_llm: could not size latest in %s (%s)", folder, object_store.describe(exc))
        return None


def start_of_attempt(folder: str, keep: int, run: str, run_dir: str, resume_other: bool) -> None:
    """Rank 0, before Composer starts (after the store check): whose folder this is, then set
    aside what an attempt did not link and prune to ``keep``. A store that stops answering is
    waited for (:data:`STORE_OUTAGE_S`); another run's folder is one line."""

    def waiting(exc: BaseException, wait: float) -> None:
        log.warning("hpc_llm: the checkpoint store does not answer (%s); trying again in %.0fs", exc, wait)

    store, loc = Store.of(folder)

    def manage() -> None:
        claim(store, loc, run, run_dir, resume_other)
        set_aside_unfinished(store, loc)
        prune(store, loc, keep)

    object_store.retrying(manage, STORE_OUTAGE_S, on_retry=waiting)


# -- the node-local side ---------------------------------------------------------------------


def local_copy_root(cwd: Path | None = None) -> Path:
    """Where Composer's autoresume copies ``latest`` on each node: ``os.path.abspath`` of
    ``s3://bucket/...`` joined to the working directory, i.e. ``<cwd>/s3:/bucket/...``."""
    return (cwd or Path.cwd()) / LOCAL_COPY_ROOT


def prepare_node(node_dir: Path, local_rank: int) -> None:
    """Before Composer starts, local rank 0 of each node empties ``<node dir>/saves`` (where each
    rank writes a save to the store first and stages its upload:
    :func:`hpc_llm.job.rank.remote_saves.local_saves_dir`) of what an earlier attempt on this node
    left (a killed one's saves and staging links), and removes the stale copy of ``latest``.
    The other ranks of the node write there only after the rendezvous, which waits for it."""
    if local_rank == 0:
        shutil.rmtree(node_dir / "saves", ignore_errors=True)
        drop_local_copy(node_dir)


def drop_local_copy(node_dir: Path) -> None:
    """The copy of the loaded checkpoint autoresume downloaded into the node's working dir
    (docs/upstream-fixes.md, upstream fix 15)."""
    shutil.rmtree(local_copy_root(node_dir), ignore_errors=True)
