"""What a trainer's loop owes hpc_llm at each step (docs/reference/trainers.md; in-job only).

LLM Foundry's trainer keeps the contract through Composer callbacks
(:mod:`hpc_llm.job.rank.preemption_callback`, :mod:`hpc_llm.job.rank.results_logger`); a
trainer without Composer calls these from its own loop: torchtitan's
(:mod:`hpc_llm.job.rank.titan.run`) and any third party's. Every rank calls every method, in
the same order: :meth:`StepDuties.step_ended` holds a collective.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from hpc_llm.job import heartbeat
from hpc_llm.job.env import JobEnv
from hpc_llm.job.rank import fence, preemption
from hpc_llm.job.rank.context import JobContext
from hpc_llm.job.rank.watchdog import ThroughputWatch, slowed
from hpc_llm.rundir.record import write_progress

#: steps the throughput is measured over (the last ones)
WINDOW = 10
#: seconds between notes of the run's record and rewrites of its progress file (rank 0)
NOTE_EVERY_S = 1.0


class StepDuties:
    """One attempt's duties, step by step. ``tokens_per_step``: the global batch's tokens.
    ``flops_per_token`` (the model's training FLOPs per token) and ``peak_flops``
    (one device's): given both, the model FLOPs utilisation is measured over the same window as
    the throughput, as Composer's SpeedMonitor measures LLM Foundry's (a fraction, 0-1)."""

    def __init__(
        self,
        ctx: JobContext,
        total_steps: int,
        tokens_per_step: int,
        flops_per_token: float | None = None,
        peak_flops: float | None = None,
    ) -> None:
        self.ctx = ctx
        self.total_steps = total_steps
        self.tokens_per_step = tokens_per_step
        self.flops_per_token = flops_per_token
        self.peak_flops = peak_flops
        #: the step this attempt resumed at (0: a fresh start); None before the first step
        self.first_step: int | None = None
        #: the last step a checkpoint was saved at, in this attempt
        self.saved_step: int | None = None
        self.started_at = time.time()
        self._noted = 0.0
        self._ends: list[tuple[int, float]] = []
        self._pending: Callable[[], int] | None = None
        #: the throughput watchdog (``watchdog.enabled``), as LLM Foundry's Composer callback runs it
        w = ctx.cfg.get("watchdog") if ctx.cfg is not None else None
        self.watch = ThroughputWatch(int(w.window), float(w.fraction), int(w.patience)) if w and w.enabled else None
        self.watch_action = str(w.action) if w else "warn"

    def started(self, step: int) -> None:
        """Training starts after ``step`` (loaded from a checkpoint, or 0)."""
        self.first_step = step
        self.started_at = time.time()
        self._ends = [(step, self.started_at)]
        heartbeat.progress(step)
        heartbeat.phase(heartbeat.TRAINING)
        if self.ctx.record is not None:
            self.ctx.record.note(resumed_at_batch=step, last_batch=step, loaded_at=self.started_at)

    def loss(self, step: int, value: float) -> None:
        """The training loss of ``step`` (1-based: the step that produced it)."""
        self.ctx.loss_history.append((int(step), float(value)))

    def before_save(self) -> None:
        """A checkpoint save is about to write: a rank of an ended generation writes nothing."""
        fence.check("a checkpoint save")

    def saved(self, step: int) -> None:
        self.saved_step = step
        if self.ctx.record is not None:
            self.ctx.record.note(checkpoint_batch=step)

    def trained_tokens(self, step: int) -> int:
        return (step - (self.first_step or 0)) * self.tokens_per_step

    def step_ended(
        self,
        step: int,
        save: Callable[[int], Any],
        start_reduce: Callable[[int], Callable[[], int]],
        wait_saved: Callable[[], Any] | None = None,
    ) -> None:
        """After ``step`` and its periodic save: the fence, the heartbeat, the record and the
        progress file; then whether any rank got the stop signal. ``start_reduce(value)`` starts
        the trainer's all-reduce (max) of one integer and returns what waits for its result.

        The all-reduce of step k is waited for at the end of step k+1: it runs while step k+1
        computes, so a step pays no round trip (a synchronous one cost 3 % of a tiny model's
        step on CPU, benchmarks/titan.py). Every rank reads the same result at the same step,
        so every rank stops at the same step, one step after the signal. On a stop:
        ``save(step)`` unless this step was saved, then ``wait_saved()`` (a trainer that saves
        asynchronously waits there for the save in flight), and
        :class:`~hpc_llm.job.rank.preemption.Preempted` (the rank's task records it)."""
        ctx, now = self.ctx, time.time()
        fence.check("training on")
        heartbeat.progress(step)
        if step - (self.first_step or 0) == 1 and ctx.record is not None:
            ctx.record.note(first_batch_at=now)
        seconds = max(now - self.started_at, 1e-9)
        # over the last WINDOW steps, as Composer's SpeedMonitor measures LLM Foundry's: the
        # steady pace, not the first step's warm-up
        self._ends.append((step, now))
        del self._ends[: -WINDOW - 1]
        if len(self._ends) > 2:  # the first step holds start-up costs
            self._watch(step, self._ends[-2], self._ends[-1])
        (s0, t0), (s1, t1) = self._ends[0], self._ends[-1]
        window = (s1 - s0) * self.tokens_per_step / (t1 - t0) if s1 > s0 and t1 > t0 else None
        tps = ctx.metrics["throughput/tokens_per_sec"] = window or self.trained_tokens(step) / seconds
        if self.flops_per_token and self.peak_flops:
            per_device = tps / ctx.dist.world_size
            ctx.metrics["throughput/device/mfu"] = per_device * self.flops_per_token / self.peak_flops
        if ctx.record is not None and now - self._noted > NOTE_EVERY_S:
            self._noted = now
            ctx.record.note(last_batch=step, train_s=round(seconds, 3))
            write_progress(
                ctx.run_dir,
                {
                    "phase": "train",
                    "batch": step,
                    "total_batches": self.total_steps,
                    "loss": ctx.loss_history[-1][1] if ctx.loss_history else None,
                    "tokens_per_sec": ctx.metrics["throughput/tokens_per_sec"],
                    "time": now,
                },
            )
        earlier, self._pending = self._pending, start_reduce(1 if preemption.received() else 0)
        if not (earlier() if earlier is not None else 0) or step >= self.total_steps:
            return
        self.finish()
        t0 = time.time()
        heartbeat.phase("save")
        if self.saved_step != step:
            save(step)
        if wait_saved is not None:
            # the step's periodic save may still be writing (asynchronous): a rank that left
            # now would leave it without its metadata, and the next attempt would resume at
            # the save before (seen under load: stopped at 50, resumed at 45)
            wait_saved()
        start_reduce(0)()  # every rank's save is done before any rank leaves
        got = preemption.received()
        raise preemption.Preempted(step, time.time() - t0, got.get("signal", "peer rank"), got.get("time", now))

    def _watch(self, step: int, before: tuple[int, float], end: tuple[int, float]) -> None:
        if self.watch is None or end[1] <= before[1]:
            return
        tps = (end[0] - before[0]) * self.tokens_per_step / (end[1] - before[1])
        event = self.watch.observe(tps)
        if event is not None and self.ctx.dist.rank == 0:
            nodes = JobEnv.current().nodelist  # the job's nodes, as Slurm writes them (n[1-4])
            slowed(self.ctx, event, tps, step, [nodes] if nodes else [], self.watch_action, self.watch.patience)

    def finish(self) -> None:
        """Wait for the all-reduce still running (before the trainer's next collective of its own)."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending()

    def ended(self, step: int) -> None:
        """Training is done (rank 0 notes where it got and what it saved)."""
        self.finish()
        heartbeat.phase("post")
        if self.ctx.record is not None:
            self.ctx.record.note(last_batch=step, train_s=round(time.time() - self.started_at, 3))
            if self.saved_step is not None:
                self.ctx.record.note(checkpoint_batch=self.saved_step)
