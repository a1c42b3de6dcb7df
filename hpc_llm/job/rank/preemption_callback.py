"""The Composer callback that stops every rank at the same batch and saves (in-job only).

See hpc_llm.job.rank.preemption for the whole sequence. With checkpoints in an S3 store it also
links ``latest`` (hpc_llm.job.rank.remote_saves): a periodic save once every rank's upload of it
is done, and a stop's save before the step exits ("a stop commits its save").
"""

from __future__ import annotations

import logging
import re
import time
from pathlib import Path
from typing import Any

import torch
from composer.callbacks import CheckpointSaver
from composer.core import Callback, State
from composer.loggers import Logger
from composer.utils import dist, format_name_with_dist

from hpc_llm.job import heartbeat
from hpc_llm.job.rank import context, disk, fence, measure, preemption
from hpc_llm.job.rank.object_store import STORE_OUTAGE_S
from hpc_llm.job.rank.remote_saves import NOTHING_PENDING, RemoteSaves

#: heartbeat phases around store I/O (a stall there is the store's, not a node's)
SAVE_PHASE = "save"
UPLOAD_PHASE = "upload"

log = logging.getLogger(__name__)

_SAVE_NAME = re.compile(r"^ep(\d+)-ba(\d+)(?:-rank(\d+)\.pt)?$")


def _remember_earlier_saves(state: State) -> None:
    """Keep-last-K over the run's life: Composer's saver starts each process with an empty
    ``saved_checkpoints`` and so rotates only what this attempt saved (Composer issue #2087).
    Hand it the earlier attempts' saves this rank owns, oldest first, up to the one resumed
    from, so its own rotation deletes them in turn (docs/design/decision-table.md)."""
    saver = next((cb for cb in state.callbacks if isinstance(cb, CheckpointSaver)), None)
    if saver is None or saver.num_checkpoints_to_keep < 0 or saver.saved_checkpoints:
        return
    folder = Path(format_name_with_dist(saver.folder, state.run_name))
    rank, resumed = dist.get_global_rank(), int(state.timestamp.batch)
    earlier: list[tuple[int, str]] = []
    for entry in folder.iterdir() if folder.is_dir() else []:
        m = _SAVE_NAME.match(entry.name)
        if m is None or entry.is_symlink() or int(m.group(2)) > resumed:
            continue
        if entry.is_dir():  # a sharded save: Composer removes the folder of the path it is given (rank 0)
            earlier.append((int(m.group(2)), str(entry / f"__{rank}_0.distcp")))
        elif m.group(3) is not None and int(m.group(3)) == rank:
            earlier.append((int(m.group(2)), str(entry)))
    saver.saved_checkpoints.extend(path for _batch, path in sorted(earlier))


class PreemptionCallback(Callback):
    """Registered in LLM Foundry's callbacks as ``hpc_llm_preemption``."""

    def __init__(self, progress_every_s: float = 5.0) -> None:
        if context.CURRENT is None:
            raise RuntimeError("hpc_llm_preemption callback used outside an hpc_llm job")
        self.ctx = context.CURRENT
        self.progress_every_s = progress_every_s
        self._last_progress = 0.0
        self._fit_start = time.time()
        self._batch_end: tuple[int, float] | None = None
        self._longest_save = 0.0
        self._disk_warned: str | None = None
        #: saves to an S3 folder: their uploads and the link of latest (None: a local folder)
        self._remote: RemoteSaves | None = None
        self._resumed_copy_dropped = False
        self._device: Any = None

    def fit_start(self, state: State, logger: Logger) -> None:
        # Autoresume has already loaded the checkpoint: this is where we resume.
        self._fit_start = time.time()
        heartbeat.progress(int(state.timestamp.batch))
        heartbeat.phase(heartbeat.TRAINING)
        if self.ctx.record is not None:
            self.ctx.record.note(
                resumed_at_batch=int(state.timestamp.batch),
                last_batch=int(state.timestamp.batch),
                loaded_at=time.time(),
            )
        _remember_earlier_saves(state)
        saver = _saver(state)
        if saver is not None:
            self._remote = RemoteSaves.of(saver, state, int(self.ctx.cfg.checkpoint.keep), self.ctx.node_dir)
        self._device = state.device

    def eval_start(self, state: State, logger: Logger) -> None:
        heartbeat.phase("eval")

    def eval_end(self, state: State, logger: Logger) -> None:
        heartbeat.phase(heartbeat.TRAINING)

    def fit_end(self, state: State, logger: Logger) -> None:
        saver = _saver(state)
        if self._remote is not None and saver is not None and saver.last_checkpoint_batch is not None:
            # the final save: uploaded and linked before the post-train stage
            last = int(saver.last_checkpoint_batch)
            self._register(last, self._batch_end[1] if self._batch_end else time.time())
            self._commit_now(last)
        heartbeat.phase("post")
        if self.ctx.record is not None:
            self.ctx.record.note(last_batch=int(state.timestamp.batch), train_s=round(time.time() - self._fit_start, 3))
            if self._remote is not None:
                if self._remote.committed is not None:
                    self.ctx.record.note(checkpoint_batch=self._remote.committed)
            elif saver is not None and saver.last_checkpoint_batch is not None:
                self.ctx.record.note(checkpoint_batch=int(saver.last_checkpoint_batch))

    def batch_start(self, state: State, logger: Logger) -> None:
        # A periodic checkpoint is written between one batch's end and the next one's start:
        # its duration (an upper bound) tells the supervisor how much lead a stop signal needs.
        if self._batch_end is None:
            return
        batch, ended = self._batch_end
        saver = next((cb for cb in state.callbacks if isinstance(cb, CheckpointSaver)), None)
        if saver is not None and saver.last_checkpoint_batch is not None and int(saver.last_checkpoint_batch) == batch:
            if self._remote is not None:
                # noted in the record once linked (batch_end), with the upload in its time
                self._register(batch, ended)
                return
            took = time.time() - ended
            if self.ctx.record is not None:
                # a new checkpoint is progress: the fault policy's failure count starts again
                changes: dict[str, float | int] = {"checkpoint_batch": batch}
                if took > self._longest_save:
                    self._longest_save = took
                    changes["checkpoint_save_s"] = round(took, 3)
                self.ctx.record.note(**changes)
                self._keep_training()
                if saver.saved_checkpoints:
                    last = Path(saver.saved_checkpoints[-1])  # a sharded save: this rank's shard in its folder
                    warning = disk.room_warning(last.parent if state.fsdp_sharded_state_dict_enabled else last)
                    if warning and warning != self._disk_warned:
                        self._disk_warned = warning
                        log.warning("hpc_llm: %s", warning)

    def batch_end(self, state: State, logger: Logger) -> None:
        batch = int(state.timestamp.batch)
        now = time.time()
        # a rank of a generation the supervisor has ended (its node was frozen, or cut off) stops
        # here, at the first batch boundary it reaches, before it writes anything
        fence.check("training on")
        heartbeat.progress(batch)
        if self._batch_end is None and self.ctx.record is not None:
            self.ctx.record.note(first_batch_at=now)
        self._batch_end = (batch, now)
        if now - self._last_progress > self.progress_every_s:
            self._last_progress = now
            if self.ctx.record is not None:
                self.ctx.record.note(last_batch=batch, train_s=round(now - self._fit_start, 3))
        # One tiny all-reduce per batch: every rank stops after the same batch. With saves to a
        # store it also carries, negated (MAX of the negation is the MIN), the newest save every
        # rank has finished uploading: then rank 0 links it.
        done = self._remote.done_upto() if self._remote is not None else NOTHING_PENDING
        flags = torch.tensor([1 if preemption.received() else 0, -done], dtype=torch.int64)
        flags = state.device.tensor_to_device(flags)
        dist.all_reduce(flags, reduce_operation="MAX")
        stop, uploaded = int(flags[0].item()), -int(flags[1].item())
        if self._remote is not None:
            self._after_uploads(uploaded)
        if not stop:
            return
        t0 = time.time()
        saver = next((cb for cb in state.callbacks if isinstance(cb, CheckpointSaver)), None)
        heartbeat.phase(SAVE_PHASE)
        if saver is not None and saver.last_checkpoint_batch != state.timestamp.batch:
            # Composer 0.32's own save path: writes the checkpoint, then moves latest-rank0.pt.
            saver._save_checkpoint(state, logger)
        if self._remote is not None and saver is not None and saver.last_checkpoint_batch == state.timestamp.batch:
            # a stop commits its save: uploaded and linked before the step exits, all in save_s
            self._register(batch, t0)
            self._commit_now(batch)
        dist.barrier()
        got = preemption.received()
        raise preemption.Preempted(batch, time.time() - t0, got.get("signal", "peer rank"), got.get("time", now))

    # -- saves to an object store (hpc_llm.job.rank.remote_saves) ---------------------------------
    def _register(self, batch: int, started_at: float) -> None:
        """A save to the store has just been written: its uploads are its own; room for the next."""
        assert self._remote is not None
        written = self._remote.saved(batch, started_at)
        warning = disk.room_warning_for(
            self._remote.local_folder.parent,
            written,
            where="node scratch (a save to the store is written there first)",
            fix="make room there or set cluster.scratch",
        )
        if warning and warning != self._disk_warned and self.ctx.record is not None:
            self._disk_warned = warning
            log.warning("hpc_llm: %s", warning)

    def _after_uploads(self, uploaded: int) -> None:
        """Every rank has uploaded its saves up to ``uploaded``: rank 0 links it. Also, once every
        rank is past loading, the node's copy of the checkpoint autoresume loaded goes."""
        assert self._remote is not None
        self._remote.forget_upto(uploaded)
        linked = self._remote.commit(uploaded)
        if linked is not None:
            self._note_checkpoint(*linked)
        if not self._resumed_copy_dropped:
            self._resumed_copy_dropped = True
            if self.ctx.dist.local_rank == 0:
                from hpc_llm.job.rank import checkpoint_store

                checkpoint_store.drop_local_copy(self.ctx.node_dir)

    def _commit_now(self, batch: int) -> None:
        """Wait for every rank's uploads of ``batch``, then rank 0 links it (a stop, the end of
        training). An upload that failed links nothing: the next attempt resumes from the last
        linked save, and sets this one aside."""
        assert self._remote is not None
        heartbeat.phase(UPLOAD_PHASE)
        error = self._remote.wait_uploaded(STORE_OUTAGE_S)
        ok = self._device.tensor_to_device(torch.tensor([0 if error is not None else 1], dtype=torch.int64))
        dist.all_reduce(ok, reduce_operation="MIN")
        if not int(ok[0].item()):
            if error is not None:
                log.warning("hpc_llm: the save of batch %d was not uploaded (%s): not linked", batch, error)
            return
        linked = self._remote.commit_now(batch, STORE_OUTAGE_S)
        if linked is not None:
            self._note_checkpoint(*linked)

    def _note_checkpoint(self, batch: int, took: float) -> None:
        """A save linked as latest is progress (the fault policy's count starts again); the time
        from its start to the link is what a stop needs for one."""
        if self.ctx.record is None:
            return
        changes: dict[str, float | int] = {"checkpoint_batch": batch}
        if took > self._longest_save:
            self._longest_save = took
            changes["checkpoint_save_s"] = round(took, 3)
        self.ctx.record.note(**changes)
        self._keep_training()

    def _keep_training(self) -> None:
        """Rank 0 keeps the loss history up to a new checkpoint: an attempt killed before any
        close of its own (its node dead, a stop that did not save in time) resumes from that
        checkpoint, and the run's history up to it must outlive the attempt (RunRecord.trained)."""
        assert self.ctx.record is not None
        self.ctx.record.trained(measure.kept_figures(self.ctx))


def _saver(state: State) -> CheckpointSaver | None:
    return next((cb for cb in state.callbacks if isinstance(cb, CheckpointSaver)), None)
