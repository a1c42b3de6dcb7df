"""A save to an S3 store, from Composer's local write to ``latest`` (in-job only).

Composer 0.32's remote saver (a ``CheckpointSaver`` whose folder is ``s3://...``) writes each
save with ``torch.save`` into a local temp folder, copies every file into its RemoteUploader's
staging folder, and uploads from spawned worker processes, each tried 3 times within seconds;
its link (``latest-rank0.pt.symlink``) goes up from its own ``batch_end``/``fit_end`` once a
polling process (every 30 s) has seen every file in the store. A preemption's save, which
raises out of ``fit``, was therefore never linked. What hpc_llm does instead (docs/design/verified/object-stores.md,
and docs/upstream-fixes.md, upstream fix 13):

- :func:`stage`: the staging copy is a hard link (node scratch holds both): one local write
  of each file, not two;
- :func:`upload_staged`: the worker retries while the store is down or frozen (for up to
  :data:`~hpc_llm.job.rank.object_store.STORE_OUTAGE_S`), so a minute's outage fails nothing;
- :class:`RemoteSaves`: the link is hpc_llm's. Each rank says, in the batch-end all-reduce the
  stop flag already rides on, up to which save its uploads have finished; once every rank's
  have, rank 0 links it (:func:`hpc_llm.job.rank.checkpoint_store.commit_latest`). A stop waits
  for its save's uploads, links it and only then exits, and the save time it reports includes
  all of that.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpc_llm.job.rank import object_store
from hpc_llm.job.rank.object_store import STORE_OUTAGE_S, Location, Store

log = logging.getLogger(__name__)

#: what a rank reports when none of its saves waits for an upload (the all-reduce takes the minimum)
NOTHING_PENDING = 2**62


def stage(uploader: Any, file_path: Path) -> str:
    """The file in the uploader's staging folder: a hard link, so staging writes nothing (a copy
    where the two folders are on different filesystems). The worker removes it once uploaded."""
    staged = os.path.join(uploader._upload_staging_folder, str(uuid.uuid4()))
    os.makedirs(uploader._upload_staging_folder, exist_ok=True)
    try:
        os.link(file_path, staged)
    except OSError:
        shutil.copy2(file_path, staged)
    return staged


def upload_staged(
    remote_backend_name: str,
    backend_kwargs: dict[str, Any],
    remote_file_name: str,
    local_file_path: str,
    overwrite: bool,
    num_attempts: int,
) -> int:
    """Runs in one of Composer's upload worker processes. For s3, one upload retried while the
    store's errors are transient; other stores keep Composer's own worker function."""
    if remote_backend_name != "s3":
        from composer.utils.remote_uploader import _upload_file_to_object_store

        return int(
            _upload_file_to_object_store(
                remote_backend_name, backend_kwargs, remote_file_name, local_file_path, overwrite, num_attempts
            )
        )
    store = Store(str(backend_kwargs["bucket"]))
    tries = [0]

    def once() -> None:
        tries[0] += 1
        # Composer's rule: never replace a checkpoint (asked on the first try only: a retry may
        # find the object a lost answer had in fact stored)
        if tries[0] == 1 and not overwrite and store.size(remote_file_name) is not None:
            raise FileExistsError(f"Object {remote_file_name} already exists, but overwrite was set to False.")
        store.put(remote_file_name, Path(local_file_path))

    def waiting(exc: BaseException, wait: float) -> None:
        # a spawned worker has no logging set up; its stderr is the rank's log
        print(
            f"hpc_llm: upload of {remote_file_name} failed ({object_store.describe(exc)}); trying again in {wait:.0f}s",
            file=sys.stderr,
            flush=True,
        )

    object_store.retrying(once, STORE_OUTAGE_S, on_retry=waiting)
    os.remove(local_file_path)
    return 0


@dataclass
class _Save:
    batch: int
    #: when the save started (the end of its batch): the commit's time minus this is what a stop
    #: needs for it
    started_at: float
    names: list[str] = field(default_factory=list)
    futures: list[Future] = field(default_factory=list)

    def uploaded(self) -> bool:
        return all(f.done() and f.exception() is None for f in self.futures)

    def failed(self) -> BaseException | None:
        return next((e for f in self.futures if f.done() and (e := f.exception()) is not None), None)


class RemoteSaves:
    """One rank's saves to an S3 folder: which are uploaded, and (rank 0) which one is linked
    (docs/upstream-fixes.md, upstream fix 14).

    Local copies and upload staging go to ``<node dir>/saves/rank<N>`` in node scratch (emptied
    at each start by :func:`hpc_llm.job.rank.checkpoint_store.prepare_node`) instead of Composer's
    ``tempfile.mkdtemp()`` folders, so an attempt killed mid-upload leaves nothing that outlives the
    next start. Only these two folders move: the process's temp dir stays where it was
    (multiprocessing puts its AF_UNIX sockets there, and a long scratch path is too long for one).

    Rank 0 links ``latest`` (and prunes to ``keep``) in a thread of its own: a store that hangs
    must not hold training at a batch boundary.
    """

    def __init__(self, saver: Any, state: Any, keep: int, node_dir: Path) -> None:
        self.saver = saver
        self.keep = keep
        self.uploader = saver.remote_uploader
        self.rank = _global_rank()
        self.sharded = bool(state.fsdp_sharded_state_dict_enabled)
        self.loc = Location.parse(str(self.uploader.remote_folder))
        self.store = Store(self.loc.bucket, object_store.client(connect_timeout=5, read_timeout=20, attempts=2))
        # Composer's own link is the name autoresume reads; hpc_llm writes it, Composer no longer
        self.symlink_key = saver.latest_remote_file_name.format(state).lstrip("/") + ".symlink"
        saver.latest_remote_file_name = None
        # keep-last-K is applied in the store (rank 0, at each link); a local copy goes as soon
        # as it is staged for upload (a yaml's save_num_checkpoints_to_keep would keep K of them)
        saver.num_checkpoints_to_keep = 0
        root = local_saves_dir(node_dir, self.rank)
        self.local_folder = root / "save"
        self.local_folder.mkdir(parents=True, exist_ok=True)
        for attr in ("filename", "latest_filename"):
            partial = getattr(saver, attr, None)
            if partial is not None:
                partial.folder = str(self.local_folder)
        saver.folder = str(self.local_folder)
        self.uploader._upload_staging_folder = str(root / "staging")
        self.pending: dict[int, _Save] = {}
        self.committed: int | None = None
        self._linker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hpc_llm-link") if self.rank == 0 else None
        self._linking: tuple[int, Future] | None = None

    @classmethod
    def of(cls, saver: Any, state: Any, keep: int, node_dir: Path) -> RemoteSaves | None:
        """For a saver that uploads to s3:// (None for a local folder and for other stores);
        ``keep``: checkpoint.keep, the saves kept in the store (-1: all)."""
        uploader = getattr(saver, "remote_uploader", None)
        if uploader is None or uploader.remote_backend_name != "s3" or saver.latest_remote_file_name is None:
            return None
        return cls(saver, state, keep, node_dir)

    # -- after each save --------------------------------------------------------------------
    def saved(self, batch: int, started_at: float) -> int:
        """Composer has just saved ``batch``: the uploads it submitted belong to it. The local
        files are dropped (the staging links keep what is still to upload). Returns the bytes
        this rank wrote for it (what node scratch must hold for each save)."""
        submitted = getattr(self.uploader, SUBMITTED, [])
        setattr(self.uploader, SUBMITTED, [])
        save = self.pending.setdefault(batch, _Save(batch, started_at))
        written = 0
        for name, future, size in submitted:
            save.names.append(name)
            save.futures.append(future)
            written += size
        self.drop_local_saves()
        return written

    def drop_local_saves(self) -> None:
        """Composer's local copies of this rank's saves (with ``save_num_checkpoints_to_keep=0`` it
        removes a rank-0 file itself, but never another rank's shard)."""
        from hpc_llm.rundir.layout import CHECKPOINT_NAME

        for entry in self.local_folder.iterdir() if self.local_folder.is_dir() else []:
            if CHECKPOINT_NAME.match(entry.name) and not entry.is_symlink():
                if entry.is_dir():
                    shutil.rmtree(entry, ignore_errors=True)
                else:
                    entry.unlink(missing_ok=True)

    def done_upto(self) -> int:
        """The newest save whose uploads on this rank, and those of every older save, are done
        (:data:`NOTHING_PENDING` when none waits). Raises an upload's error (Composer's own
        ``check_workers`` would raise it too)."""
        newest = NOTHING_PENDING
        for batch in sorted(self.pending):
            save = self.pending[batch]
            error = save.failed()
            if error is not None:
                raise error
            if not save.uploaded():
                return -1 if newest == NOTHING_PENDING else newest
            newest = batch
        return newest

    def forget_upto(self, batch: int) -> None:
        """Every rank has uploaded ``batch`` and what came before: only rank 0 keeps them, to link."""
        if self.rank != 0:
            for old in [b for b in self.pending if b <= batch]:
                del self.pending[old]

    def target(self, batch: int) -> str | None:
        """The key ``latest`` must hold for ``batch``: rank 0's file, or its sharded save's folder."""
        save = self.pending.get(batch)
        if save is None or not save.names:
            return None
        name = save.names[-1]
        return str(Path(name).parent) if self.sharded else name

    # -- the link: every rank agrees, rank 0 writes ----------------------------------------------
    def _link(self, batch: int, target: str) -> tuple[int, float]:
        """In rank 0's link thread: ``latest`` to ``batch``, then keep-last-K; when it was linked."""
        from hpc_llm.job.rank import checkpoint_store

        checkpoint_store.commit_latest(self.store, self.symlink_key, target)
        linked_at = time.time()
        try:
            checkpoint_store.prune(self.store, self.loc, self.keep)
        except Exception as exc:  # tried again at the next link, and at the next start
            log.warning("hpc_llm: could not prune %s (%s)", self.loc.uri(), object_store.describe(exc))
        return batch, linked_at

    def commit(self, batch: int) -> tuple[int, float] | None:
        """Every rank has uploaded up to ``batch``: rank 0 starts linking it, unless a link is under
        way. Returns ``(batch, seconds from its save's start to its link)`` of a link that has
        just finished (a store that did not answer is tried again at a later batch)."""
        if self.rank != 0:
            return None
        finished = self._finished_link()
        newest = max(self.committed or -1, self._linking[0] if self._linking else -1)
        if self._linking is None and batch != NOTHING_PENDING and batch > newest:
            target = self.target(batch)
            if target is not None and self._linker is not None:
                self._linking = (batch, self._linker.submit(self._link, batch, target))
        return finished

    def _finished_link(self, timeout: float | None = 0) -> tuple[int, float] | None:
        if self._linking is None:
            return None
        batch, future = self._linking
        try:
            linked, linked_at = future.result(timeout=timeout)
        except FutureTimeout:
            return None
        except Exception as exc:
            self._linking = None
            if not object_store.transient(exc):
                raise
            log.warning("hpc_llm: could not link latest to batch %d yet (%s)", batch, object_store.describe(exc))
            return None
        self._linking = None
        took = linked_at - self.pending[linked].started_at
        self.committed = linked
        for old in [b for b in self.pending if b <= linked]:
            del self.pending[old]
        return linked, took

    def commit_now(self, batch: int, deadline_s: float) -> tuple[int, float] | None:
        """Rank 0, at a stop or at the end of training: link ``batch`` before returning (a link under
        way is waited for first); a store that does not answer is asked again until the deadline."""
        if self.rank != 0:
            return None
        until = time.monotonic() + deadline_s
        done: tuple[int, float] | None = None
        while (self.committed or -1) < batch and time.monotonic() < until:
            if self._linking is None:
                done = self.commit(batch) or done
                if self._linking is None and (self.committed or -1) < batch:
                    return done  # nothing of rank 0's to link for this batch
                if self._linking is None:
                    break
            finished = self._finished_link(timeout=max(0.0, until - time.monotonic()))
            if finished is not None:
                done = finished
            elif self._linking is None:
                time.sleep(2.0)  # the store did not answer the link: ask again
        return done

    def wait_uploaded(self, deadline_s: float) -> BaseException | None:
        """Block until this rank's uploads are done (a stop, the end of training); the error of
        one that failed, or a TimeoutError past the deadline."""
        until = time.monotonic() + deadline_s
        for save in list(self.pending.values()):
            for future in save.futures:
                try:
                    future.result(timeout=max(0.0, until - time.monotonic()))
                except Exception as exc:
                    return exc
        return None


def local_saves_dir(node_dir: Path, rank: int) -> Path:
    """Where a rank's saves to a store are written first, and staged for upload, in node scratch."""
    return node_dir / "saves" / f"rank{rank}"


#: the attribute the patched ``RemoteUploader.upload_file_async`` appends ``(remote name, future,
#: bytes)`` to, for :meth:`RemoteSaves.saved` to take
SUBMITTED = "_hpc_llm_submitted"


def _global_rank() -> int:
    from composer.utils import dist

    return int(dist.get_global_rank())
