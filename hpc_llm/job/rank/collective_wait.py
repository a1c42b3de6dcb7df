"""Time a rank spends blocked inside collectives (in-job only; torch).

Two sources, because the two parallelisms reach their collectives differently:

* **Python's collectives.** FSDP2's all-gathers and reduce-scatters, Composer's metric and
  object all-reduces, a barrier: they call ``torch.distributed.<collective>`` at call time, so
  :func:`install` wraps those functions once per process and adds the time of every blocking call
  (``async_op`` false) to :func:`waited`.
* **DDP's gradient buckets**, all-reduced from C++ as backward runs. :func:`time_ddp` registers a
  communication hook (torch's own ``allreduce_hook``, so the gradients are the same) that notes
  when each bucket is handed over and when its all-reduce completes. The rank blocks only after
  its last bucket (the earlier ones overlap its remaining backward), so a batch's DDP wait is
  from the last hand-over to the last completion.

On CUDA both measure host time while NCCL runs on streams: the host does not block there, and
the figure is not a wait (docs/guides/long-runs.md says what is verified where). Hand-written
because neither torch nor Composer keeps such a figure: torch's profiler records it, at a cost
no run pays every batch.
"""

from __future__ import annotations

import functools
import time
from typing import Any

import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

#: the torch.distributed functions timed (the blocking collectives FSDP2 and Composer call)
COLLECTIVES = (
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_object",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "all_to_all_single",
    "broadcast",
    "broadcast_object_list",
    "barrier",
)

_waited = [0.0]
_installed = [False]


def waited() -> float:
    """Seconds this process has spent blocked in the timed collectives so far."""
    return _waited[0]


def install() -> None:
    """Wrap :data:`COLLECTIVES` in ``torch.distributed`` (once per process)."""
    if _installed[0]:
        return
    _installed[0] = True
    for name in COLLECTIVES:
        fn = getattr(dist, name, None)
        if fn is None:
            continue

        @functools.wraps(fn)
        def timed(*args: Any, _fn: Any = fn, **kwargs: Any) -> Any:
            if kwargs.get("async_op"):
                return _fn(*args, **kwargs)
            start = time.perf_counter()
            try:
                return _fn(*args, **kwargs)
            finally:
                _waited[0] += time.perf_counter() - start

        setattr(dist, name, timed)


class DdpWait:
    """The DDP communication hook's clock: per batch, the last bucket's hand-over and completion."""

    def __init__(self) -> None:
        self.issued = 0.0
        self.done = 0.0

    # unannotated on purpose: DDP refuses a hook whose annotations are not torch's own types
    # (with postponed annotations, every one is a string)
    def hook(self, state, bucket):
        self.issued = time.perf_counter()
        fut = allreduce_hook(state, bucket)

        def completed(f: Any) -> Any:
            self.done = time.perf_counter()  # gloo's or NCCL's thread: a float store
            return f.value()

        return fut.then(completed)

    def take(self) -> float:
        """The wait of the batch since the last call (0 when no bucket was all-reduced)."""
        wait = max(0.0, self.done - self.issued) if self.issued else 0.0
        self.issued = self.done = 0.0
        return wait


def time_ddp(model: Any) -> DdpWait | None:
    """Register the timing hook on ``model`` when it is a DistributedDataParallel (before its first
    backward); None for any other model."""
    from torch.nn.parallel import DistributedDataParallel

    if not isinstance(model, DistributedDataParallel):
        return None
    clock = DdpWait()
    model.register_comm_hook(None, clock.hook)
    return clock
