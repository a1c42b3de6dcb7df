"""LLM Foundry's training, the default trainer (``trainer=llmfoundry``; in-job only).

The plugins' train config (:func:`hpc_llm.config.train_config.build_train_config`), their
preparation, then LLM Foundry's own ``train``: Composer's Trainer, with hpc_llm's callbacks and
logger (:mod:`hpc_llm.job.rank.foundry`) keeping the trainer contract
(docs/reference/trainers.md). Moved here from :mod:`hpc_llm.job.rank.task` unchanged when the
training stack became a plugin kind.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import time
from collections.abc import Iterator
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf

from hpc_llm.config import trackers
from hpc_llm.config.train_config import build_train_config
from hpc_llm.config.validate import ResolvedJob
from hpc_llm.job import heartbeat
from hpc_llm.job.rank import context, fence
from hpc_llm.job.rank.context import JobContext
from hpc_llm.job.rank.measure import kept_figures, training_figures
from hpc_llm.plugins.base import Trained
from hpc_llm.rundir.layout import RunDir

log = logging.getLogger(__name__)


class FoundryTrained(Trained):
    """Composer's Trainer after ``fit``."""

    def __init__(self, trainer: Any, train_s: float) -> None:
        self.handle = trainer
        self.batch = int(trainer.state.timestamp.batch)
        self.train_s = train_s

    def figures(self, ctx: JobContext, job_s: float) -> dict[str, Any]:
        return training_figures(ctx, self.handle, train_s=self.train_s, job_s=job_s)

    def close(self) -> None:
        self.handle.close()


def run_name(experiment: str, run_dir: Any) -> str:
    """Stable across requeues of the same run (autoresume keys on it)."""
    return RunDir(run_dir).run_name(experiment)


def train(cfg: DictConfig, job: ResolvedJob, ctx: JobContext) -> FoundryTrained:
    """The plugins' train config, their preparation, then LLM Foundry's ``train``."""
    train_cfg = build_train_config(cfg, job, run_name=run_name(job.plan.experiment, ctx.run_dir))
    if ctx.record is not None:  # rank 0: the tracker run's tags (the trackers log from rank 0)
        items = ctx.record.attempts.items
        trackers.add_job_tags(
            train_cfg,
            job_ids=list(dict.fromkeys(str(a.job_id) for a in items if a.job_id)),
            attempt=len(items),
            commit=((ctx.record.info.get("provenance") or {}).get("git") or {}).get("commit"),
        )
    if ctx.dist.rank == 0:
        RunDir(ctx.run_dir).train_config.write_text(yaml.safe_dump(train_cfg, sort_keys=False))
    heartbeat.phase("data")
    job.data.prepare(cfg.data, ctx)
    job.parallelism.prepare(cfg.parallelism, ctx)
    job.checkpoint.prepare(cfg.checkpoint, ctx)
    for ev in job.evaluators:
        ev.prepare(cfg.eval, ctx)

    # The training stack is imported only here, inside the job.
    from hpc_llm.job.rank import compat, foundry, stale_shm

    compat.apply()
    fence.guard_checkpoints()
    context.CURRENT = ctx
    foundry.register()
    # A killed or requeued predecessor leaves Streaming's shared memory behind ("reused local
    # directory"): local rank 0 of every node removes it (upstream fix 8). The node's other
    # ranks need not wait: none registers anything before LLM Foundry's rendezvous, which this
    # rank joins only after.
    if ctx.dist.local_rank == 0:
        stale_shm.clean(own=ctx.node_dir.resolve())
    from llmfoundry.command_utils import train as foundry_train

    heartbeat.phase("build")
    t0 = time.time()
    with training_done_goes_on(), noting_the_rendezvous(ctx):
        trainer = foundry_train(OmegaConf.create(train_cfg))
    train_s = time.time() - t0
    note_training_end(ctx, trainer, train_s)
    return FoundryTrained(trainer, train_s)


def note_training_end(ctx: JobContext, trainer: Any, train_s: float) -> None:
    """The attempt's record as training ends, before the post-train stage: the final checkpoint
    (Composer's saver writes it in its own fit_end, after hpc_llm's callback has run its, so
    that callback cannot see it) and, for an attempt that found training done, where it
    resumed (no fit ran, so no fit_start noted it). Without them a preemption in the
    post-train stage looked like an attempt that saved nothing, resumed at batch 0.

    And what it trained (the loss history, tokens/s, MFU), kept now: a preemption or time limit
    in the post-train stage finds no batch boundary to stop at, so the ranks are killed after
    the grace time and this attempt never reaches a close of its own (nor does one whose node
    dies there). Kept only at the close, the loss was lost, and a run completed by an attempt
    that resumed at max_duration said train_loss: null (issue #43)."""
    from composer.callbacks import CheckpointSaver

    if ctx.record is None:
        return
    batch = int(trainer.state.timestamp.batch)
    changes: dict[str, Any] = {"last_batch": batch}
    if getattr(trainer, SKIPPED_FIT, False):
        changes["resumed_at_batch"] = batch
    saver = next((cb for cb in trainer.state.callbacks if isinstance(cb, CheckpointSaver)), None)
    if saver is not None and saver.last_checkpoint_batch is not None:
        changes["checkpoint_batch"] = int(saver.last_checkpoint_batch)
    ctx.record.note(**changes)
    # after the note: the history is merged at the batch this attempt resumed at
    ctx.record.trained(kept_figures(ctx, tokens=int(trainer.state.timestamp.token), train_s=train_s))


@contextlib.contextmanager
def noting_the_rendezvous(ctx: JobContext) -> Iterator[None]:
    """Rank 0 notes when LLM Foundry's process-group start and first barrier are done (the
    attempt's ``rendezvous_at``: one phase of a restart's cost, benchmarks/faults.py). Wraps
    LLM Foundry 0.22's own ``_initialize_dist_with_barrier``; without it nothing is noted."""
    # the module, not the function the package re-exports under the same name
    module = importlib.import_module("llmfoundry.command_utils.train")
    original = getattr(module, "_initialize_dist_with_barrier", None)
    if original is None or ctx.record is None:
        yield
        return
    record = ctx.record

    def initialize(*args: Any, **kwargs: Any) -> Any:
        out = original(*args, **kwargs)
        record.note(rendezvous_at=time.time())
        return out

    setattr(module, "_initialize_dist_with_barrier", initialize)  # noqa: B010 - mypy: a private name
    try:
        yield
    finally:
        setattr(module, "_initialize_dist_with_barrier", original)  # noqa: B010 - mypy: a private name


#: set on a Trainer whose fit found training already done (training_done_goes_on)
SKIPPED_FIT = "_hpc_llm_training_was_done"


@contextlib.contextmanager
def training_done_goes_on() -> Iterator[None]:
    """A run whose training is done never trains again: an attempt that resumes from the
    checkpoint at max_duration (a preemption or time limit hit the post-train stage) goes on
    to the post-train stage. Composer's fit would raise "max_duration ... is less than or
    equal to the elapsed training duration", and the run would fail after every batch was
    trained (docs/design/decision-table.md)."""
    from composer import Trainer

    original = Trainer.fit

    def fit(self: Any, *args: Any, **kwargs: Any) -> Any:
        md = self.state.max_duration
        if not args and not kwargs and md is not None and md <= self.state.timestamp.get(md.unit):
            log.warning("training already reached max_duration (%s): going on to the post-train stage", md)
            heartbeat.phase("post")
            setattr(self, SKIPPED_FIT, True)
            return None
        return original(self, *args, **kwargs)

    Trainer.fit = fit  # type: ignore[method-assign]
    try:
        yield
    finally:
        Trainer.fit = original  # type: ignore[method-assign]
