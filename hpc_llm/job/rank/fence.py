"""A rank of a generation that has ended never writes: the fence, checked before every commit.

The supervisor ends a generation (a failure elsewhere, a dead node, a hang)
and starts the next one, possibly while some rank of the old one cannot be
told: its node frozen (SIGSTOP, a stuck kernel) or cut off. When that node
comes back, the old rank carries on from where it stood, in the middle of a
batch or a checkpoint save, beside the new generation writing the same run
directory. The fence makes sure it then writes nothing that counts:

* the node's agent keeps on its shared-memory board (:class:`hpc_llm.job.heartbeat.Board`)
  the **live generation** and a **lease**: a deadline on the node's monotonic
  clock, renewed by every ping from the supervisor. The supervisor stops
  pinging an agent as soon as it suspects it, and declares it dead only once
  that lease has run out; an agent that finds its own loop stalled that long
  (its node was frozen) ends its generation before it reads anything, so the
  pings that waited in its socket buffer renew nothing
  (:mod:`hpc_llm.job.agent.loop`);
* :func:`check` raises :class:`Fenced` when this rank's generation is not the
  live one, or the lease has run out. It runs before every write of the run's
  record (:func:`hpc_llm.rundir.record.guard_writes`), at every batch boundary
  (the preemption callback: the rank stops there), and before and after
  Composer writes a checkpoint (:func:`guard_checkpoints`: a save that was in
  progress when the node froze is never linked as ``latest`` or uploaded).

Composer's upload workers are processes the rank *spawned* (fresh interpreters
that inherit no mapping): they map the agent's board file named in
``HPC_LLM_BOARD`` and check the same fence before every write to a store
(:meth:`hpc_llm.job.rank.object_store.Store._write_allowed`). The agent also
kills the rank's whole process group when it ends a generation, workers included.

A rank outside an agent (the local launcher) has no board: nothing to fence.
Stdlib only, except :func:`guard_checkpoints` (Composer, imported there).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hpc_llm.job import heartbeat
from hpc_llm.job.env import JobEnv
from hpc_llm.rundir import epoch
from hpc_llm.rundir.epoch import Epoch, Stale

log = logging.getLogger(__name__)


#: this rank's generation is over: it must not write anything that counts (the run's epoch's
#: refusal, hpc_llm.rundir.epoch: one exception for every process of the job)
Fenced = Stale


#: seconds a rank whose lease ran out waits for the agent to renew it before it gives up: a
#: few pings late is a slow network, not a generation that has ended
RENEWAL_WAIT_S = 3.0


def state(wait_s: float = RENEWAL_WAIT_S) -> str | None:
    """Why this rank may not write (None: it may). A lease that ran out while the generation is
    still live is waited on for ``wait_s`` (the agent renews it on the next ping)."""
    found = heartbeat.board() or heartbeat.spawned_board()
    if found is None:
        if os.environ.get(heartbeat.BOARD_ENV):
            return "the node's agent has ended (its board file is gone)"
        return None
    board, _slot, gen = found
    return state_of(board, gen, wait_s)


def state_of(
    board: heartbeat.Board,
    gen: int,
    wait_s: float = RENEWAL_WAIT_S,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> str | None:
    """Why a rank of generation ``gen`` on ``board`` may not write (None: it may); the clock of
    its node (the simulator's ranks pass theirs)."""
    deadline = clock() + wait_s
    while True:
        live, lease_until = board.fence()
        if live != gen:
            return f"generation {gen} has ended (the live one is {live})"
        now = clock()
        if now <= lease_until:
            return None
        if now >= deadline:
            return f"the supervisor has not been heard from for {now - lease_until:.1f} s past the lease"
        sleep(0.05)


def ended() -> bool:
    """This rank's generation is no longer the live one (its lease aside)."""
    found = heartbeat.board()
    return found is not None and found[0].fence()[0] != found[2]


def check(what: str = "write") -> None:
    """Raise :class:`Fenced` when this rank may not ``what``: the run's epoch check
    (:func:`hpc_llm.rundir.epoch.check`), of which this rank's part is its generation's lease
    (:func:`state`). A process the rank spawned (an upload worker) gets its holder from the
    environment it inherited."""
    if epoch.held() is None:
        install()
    why = epoch.refusal(what)
    if why is not None:
        log.error("hpc_llm: fenced, not doing %s: %s", what, why)
        raise Fenced(what, why)


def guard_checkpoints() -> None:
    """Check the fence before Composer starts a checkpoint save and again once the file is
    written, before the saver links ``latest`` or queues its upload (both follow
    ``save_checkpoint`` in ``CheckpointSaver._save_checkpoint``, Composer 0.32)."""
    from composer.utils import checkpoint

    original = checkpoint.save_checkpoint
    if getattr(original, "_hpc_llm_fenced", False):
        return

    def save_checkpoint(*args: Any, **kwargs: Any) -> Any:
        check("a checkpoint save")
        saved = original(*args, **kwargs)
        check("linking or uploading a checkpoint")
        return saved

    save_checkpoint._hpc_llm_fenced = True  # type: ignore[attr-defined]
    checkpoint.save_checkpoint = save_checkpoint


def install() -> None:
    """This rank's epoch (call once, in the rank; every write of the run's record checks it):
    its generation's, as the supervisor told it, with the lease on its node's board. A rank
    outside an agent (the local launcher) has neither, and holds nothing."""
    job = JobEnv.current()
    mine = Epoch.parse(job.epoch) if job.epoch else None
    on_board = heartbeat.board() is not None or bool(os.environ.get(heartbeat.BOARD_ENV))
    if mine is None and not on_board:
        return
    run_dir = Path(job.run_dir) if job.run_dir else None
    epoch.install(
        epoch.Holder(
            run_dir, job.job_id if mine else None, mine or Epoch(0, 0), "rank", lease=state if on_board else None
        )
    )
