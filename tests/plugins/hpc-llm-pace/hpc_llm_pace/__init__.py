"""Test plugin: every training batch takes at least ``batch_s`` seconds.

hpc_llm's fault tests inject a fault "once the run passes batch 8", or need a
run to outlast several one-minute time limits. How far a run gets in a given
time depends on the machine (a newcomer's idle laptop trains mpt_tiny several
times faster than a loaded CI machine), so those tests pace their runs: each
batch is held to ``batch_s`` seconds (a sleep at the batch's end, on every
rank), which bounds how many batches a minute can train from above, whatever
the machine. It changes no number the run computes: the loss is the same as
an unpaced run's, so the tests compare against unpaced reference runs.

``stall_file``: when that file exists as rank ``stall_rank`` ends batch ``stall_at`` or
later, the rank removes it and stops for ``stall_s`` seconds, its heartbeat going on (the
other ranks then wait in the next all-reduce: a stuck collective, as the supervisor sees
one). Once: a restarted run finds no file.

``slow_file``: once that file exists and names this node (its Slurm name), the ranks on the node
hold each batch ``slow_factor`` times as long as it took them (a sleep at its end): the node is
that many times slower than the others, as a throttled GPU or a node under a CPU quota would be.
Its peers then wait for it inside the next batch's collectives (hpc_llm's straggler tests). A
spare that takes its place is another node: full speed.

``digest_file``: rank 0 writes one line per batch as it starts, ``<batch> <digest>``, to that
file (relative: to the run dir), the digest of every sample of the global batch (a hash of each sample's token ids
on each rank, gathered, sorted): the same digests batch by batch is the same sample sequence,
whatever the number of nodes it was split over (hpc_llm's min_nodes tests). A batch trained again
after a restart is written again: the last line of a batch counts.

Registered in LLM Foundry's callback registry through its ``llmfoundry_callbacks``
entry point; a run asks for it with ``++train.callbacks.hpc_llm_test_pace.batch_s=0.1``.
It is a real pip-installed package, so the code under test has no test hook.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import socket
import time
from pathlib import Path
from typing import Any

# Composer is importable wherever LLM Foundry loads this entry point (inside a job only)
from composer.core import Callback


class Pace(Callback):
    def __init__(
        self,
        batch_s: float = 0.1,
        stall_file: str | None = None,
        stall_at: int = 0,
        stall_s: float = 0.0,
        stall_rank: int = 0,
        slow_file: str | None = None,
        slow_factor: float = 3.0,
        digest_file: str | None = None,
    ) -> None:
        self.batch_s = float(batch_s)
        self.stall = (Path(stall_file), int(stall_at), float(stall_s), int(stall_rank)) if stall_file else None
        self._started = time.monotonic()
        self.here = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
        self.slow_file = Path(slow_file) if slow_file else None
        self.slow_factor = float(slow_factor)
        self.slow = False
        self.digest_file = digest_file
        self._samples: list[str] = []

    def batch_start(self, state: Any, logger: Any) -> None:
        self._started = time.monotonic()
        if self.digest_file:
            # the whole device batch is state.batch here (Composer splits it into micro-batches later)
            ids = state.batch["input_ids"]
            self._samples = [hashlib.sha1(row.numpy().tobytes()).hexdigest() for row in ids.cpu()]
            # here, not at the batch's end: a stop (a save on a signal) ends the batch before this
            # callback's batch_end runs, and that batch would go unwritten
            self._digest(state)

    def _digest(self, state: Any) -> None:
        from composer.utils import dist

        gathered = dist.all_gather_object(self._samples)
        if dist.get_global_rank() != 0:
            return
        path = Path(self.digest_file or "")
        if not path.is_absolute():
            from hydra.core.hydra_config import HydraConfig

            path = Path(HydraConfig.get().runtime.output_dir) / path
        everything = sorted(h for rank in gathered for h in rank)
        with path.open("a") as f:
            # the batch this one will be once done (the timestamp counts batches done)
            f.write(f"{int(state.timestamp.batch) + 1} {hashlib.sha1(' '.join(everything).encode()).hexdigest()}\n")

    def batch_end(self, state: Any, logger: Any) -> None:
        left = self.batch_s - (time.monotonic() - self._started)
        if left > 0:
            time.sleep(left)
        if self.slow_file is not None and not self.slow:
            with contextlib.suppress(OSError):
                self.slow = self.slow_file.read_text().strip() == self.here
        if self.slow:
            time.sleep((self.slow_factor - 1) * (time.monotonic() - self._started))
        if self.stall is not None:
            from composer.utils import dist

            path, at, seconds, rank = self.stall
            if int(state.timestamp.batch) >= at and dist.get_global_rank() == rank and path.exists():
                path.unlink()
                time.sleep(seconds)
