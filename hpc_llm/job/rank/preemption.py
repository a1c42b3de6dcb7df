"""Save on the Slurm stop signal and stop at a batch boundary, every rank at the same one.

Slurm sends the job's ``--signal`` (USR2; never USR1, which NCCL uses)
``signal_lead_s`` before the time limit, and at preemption when the
partition has ``preempt_send_user_signal``, to the batch host; the job's
supervisor (:mod:`hpc_llm.job.supervisor`) forwards it to every rank. Then:

1. :func:`install` (called first thing in every rank, before the training
   stack is imported) records the signal instead of dying.
2. ``PreemptionCallback`` (hpc_llm.job.rank.preemption_callback) all-reduces a
   stop flag at every batch boundary, so every rank stops after the same
   batch; the checkpoint is then written synchronously through Composer's own
   CheckpointSaver (which moves ``latest-rank0.pt`` only after the file is
   complete), and :class:`Preempted` unwinds out of ``fit``.
3. Global rank 0 records the stop (hpc_llm.rundir.record); the ranks exit 0; the
   supervisor requeues the job (within the run's budget for that cause).
4. The requeued job (same job id, same run dir, ``SLURM_RESTART_COUNT`` + 1)
   resumes through Composer autoresume and Streaming's dataloader state, so
   no batch is recomputed (``batches_lost`` = 0).
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

STOP_SIGNAL_ENV = "HPC_LLM_STOP_SIGNAL"

#: set by the signal handler: {"signal": name, "time": epoch seconds}
_received: dict[str, Any] = {}
_installed: list[str] = []


def _on_signal(signum: int, frame: Any) -> None:
    if not _received:
        _received.update(signal=signal.Signals(signum).name, time=time.time())


def install(sig_name: str | None = None) -> str | None:
    """Record the stop signal instead of dying; restore SIGTERM's default.

    submitit's task wrapper ignores SIGTERM ("bypass") and requeues on the
    user signal itself; we take both over so a ``scancel`` still stops the job
    and the checkpoint-then-requeue sequence is ours.
    """
    name = sig_name or os.environ.get(STOP_SIGNAL_ENV)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if not name:
        return None
    signum = getattr(signal, name if name.startswith("SIG") else f"SIG{name}")
    signal.signal(signum, _on_signal)
    _spawned_children_keep_out(signum)
    _installed.append(name)
    return name


def _spawned_children_keep_out(signum: int) -> None:
    """Processes a rank spawns start with the stop signal blocked (docs/upstream-fixes.md, upstream fix 18).

    Slurm signals every process of the step (slurmstepd's proctrack sends to the whole
    container), and a process a rank starts with multiprocessing's spawn (Composer's upload
    workers and its uploader's Manager, with checkpoints in an object store; the resource
    tracker of Streaming's shared memory) is a fresh interpreter with the default action, which
    terminates it: a preemption's save then failed with BrokenProcessPool (seen on the dev
    cluster). A blocked signal stays blocked across fork and exec, so every spawn
    (``multiprocessing.util.spawnv_passfds``, which they all go through) happens with it blocked
    in the spawning thread; the rank itself gets a signal that came meanwhile when the mask is
    restored, a moment later. Forked children (dataloader workers) inherit the rank's handler.
    """
    from multiprocessing import util

    original = util.spawnv_passfds
    if getattr(original, "_hpc_llm", False):
        return

    def spawnv_passfds(path: Any, args: Any, passfds: Any) -> Any:
        old = signal.pthread_sigmask(signal.SIG_BLOCK, {signum})
        try:
            return original(path, args, passfds)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)

    spawnv_passfds._hpc_llm = True  # type: ignore[attr-defined]
    util.spawnv_passfds = spawnv_passfds


def request_stop(reason: str) -> None:
    """Stop at the next batch boundary as if signalled (the watchdog's requeue)."""
    if not _received:
        _received.update(signal=reason, time=time.time())


def received() -> dict[str, Any]:
    return dict(_received)


class Preempted(Exception):
    """Raised from a batch boundary once every rank has agreed to stop."""

    def __init__(self, batch: int, save_s: float, signal_name: str, signal_time: float) -> None:
        super().__init__(f"stopped after batch {batch} on {signal_name}")
        self.batch = batch
        self.save_s = save_s
        self.signal_name = signal_name
        self.signal_time = signal_time
        #: where the stop's save is, when the trainer knows (torchtitan's step-N); else the
        #: checkpoint backend's ``latest`` says
        self.checkpoint: str | None = None
