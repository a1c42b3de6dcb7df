"""The Composer callback that stops every rank at the same batch and saves (in-job only).

See hpc_llm.job.rank.preemption for the whole sequence.
"""

from __future__ import annotations

import logging
import re
import time
from pathlib import Path

import torch
from composer.callbacks import CheckpointSaver
from composer.core import Callback, State
from composer.loggers import Logger
from composer.utils import dist, format_name_with_dist

from hpc_llm.job import heartbeat
from hpc_llm.job.rank import context, disk, fence, preemption

log = logging.getLogger(__name__)

_SAVE_NAME = re.compile(r"^ep(\d+)-ba(\d+)(?:-rank(\d+)\.pt)?$")


def _remember_earlier_saves(state: State) -> None:
    """Keep-last-K over the run's life: Composer's saver starts each process with an empty
    ``saved_checkpoints`` and so rotates only what this attempt saved (Composer issue #2087).
    Hand it the earlier attempts' saves this rank owns, oldest first, up to the one resumed
    from, so its own rotation deletes them in turn (docs/design.md, "Long runs and failures")."""
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

    def eval_start(self, state: State, logger: Logger) -> None:
        heartbeat.phase("eval")

    def eval_end(self, state: State, logger: Logger) -> None:
        heartbeat.phase(heartbeat.TRAINING)

    def fit_end(self, state: State, logger: Logger) -> None:
        heartbeat.phase("post")
        if self.ctx.record is not None:
            self.ctx.record.note(last_batch=int(state.timestamp.batch), train_s=round(time.time() - self._fit_start, 3))
            saver = next((cb for cb in state.callbacks if isinstance(cb, CheckpointSaver)), None)
            if saver is not None and saver.last_checkpoint_batch is not None:
                self.ctx.record.note(checkpoint_batch=int(saver.last_checkpoint_batch))

    def batch_start(self, state: State, logger: Logger) -> None:
        # A periodic checkpoint is written between one batch's end and the next one's start:
        # its duration (an upper bound) tells the supervisor how much lead a stop signal needs.
        if self._batch_end is None:
            return
        batch, ended = self._batch_end
        saver = next((cb for cb in state.callbacks if isinstance(cb, CheckpointSaver)), None)
        if saver is not None and saver.last_checkpoint_batch is not None and int(saver.last_checkpoint_batch) == batch:
            took = time.time() - ended
            if self.ctx.record is not None:
                # a new checkpoint is progress: the fault policy's failure count starts again
                changes: dict[str, float | int] = {"checkpoint_batch": batch}
                if took > self._longest_save:
                    self._longest_save = took
                    changes["checkpoint_save_s"] = round(took, 3)
                self.ctx.record.note(**changes)
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
        # One tiny all-reduce per batch: every rank stops after the same batch.
        flag = state.device.tensor_to_device(torch.tensor([1 if preemption.received() else 0], dtype=torch.int32))
        dist.all_reduce(flag, reduce_operation="MAX")
        if not int(flag.item()):
            return
        t0 = time.time()
        saver = next((cb for cb in state.callbacks if isinstance(cb, CheckpointSaver)), None)
        if saver is not None and saver.last_checkpoint_batch != state.timestamp.batch:
            # Composer 0.32's own save path: writes the checkpoint, then moves latest-rank0.pt.
            saver._save_checkpoint(state, logger)
        dist.barrier()
        got = preemption.received()
        raise preemption.Preempted(batch, time.time() - t0, got.get("signal", "peer rank"), got.get("time", now))
