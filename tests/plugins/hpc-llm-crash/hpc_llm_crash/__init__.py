"""Test plugin: user code that raises at a fixed batch.

Used by hpc_llm's tests to stand for a bug in user code (a model, a loss, a
callback) that fails deterministically: ``eval.evaluators=[crash]`` adds a
Composer callback that raises ``RuntimeError`` at the end of batch
``eval.options.crash.at_batch`` on rank ``eval.options.crash.rank``. With
``eval.options.crash.node_file``, it stands for a bad GPU instead: every rank
on the node named in that file raises a CUDA ECC error ``after`` batches into
every attempt, wherever the attempt resumed. When the error is due, training
waits for the file (the test writes it once it knows the job's nodes): with no
wait, a file written late under load meant no error at all. It is a
real third-party package, installed with pip and found through its entry
point, so the code under test needs no fault-injection hook. ``post_s`` makes
its post-train step take that long on the first attempt that reaches it (a
70B held-out eval or HF export takes tens of minutes), so a test can preempt a
run there.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from hpc_llm import hookimpl
from hpc_llm.plugins.base import Evaluator
from hpc_llm.plugins.registry import Registry

CALLBACK = "hpc_llm_test_crash"


def _callback_class() -> type:
    from composer.core import Callback
    from composer.utils import dist

    class Crash(Callback):
        def __init__(self, at_batch: int, rank: int, node_file: str | None = None, after: int = 7) -> None:
            self.at_batch, self.rank, self.node_file, self.after = at_batch, rank, node_file, after
            self.resumed = 0

        def fit_start(self, state: Any, logger: Any) -> None:
            self.resumed = int(state.timestamp.batch)

        def batch_end(self, state: Any, logger: Any) -> None:
            batch = int(state.timestamp.batch)
            if self.node_file is not None:
                if batch != self.resumed + self.after:
                    return
                path, deadline = Path(self.node_file), time.monotonic() + 600
                while not path.exists():
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"test plugin: {path} was never written")
                    time.sleep(0.2)
                if path.read_text().strip() == os.environ.get("SLURMD_NODENAME"):
                    raise RuntimeError("CUDA error: uncorrectable ECC error encountered")
                return
            if batch == self.at_batch and dist.get_global_rank() == self.rank:
                raise RuntimeError(f"user code failed at batch {batch}")

    return Crash


class CrashAt(Evaluator):
    name = "crash"
    description = "test plugin: raises RuntimeError at a fixed batch"

    @dataclass
    class Options:
        at_batch: int = 7
        rank: int = 0
        node_file: Optional[str] = None  # noqa: UP045 - OmegaConf structured configs read Optional
        after: int = 7
        post_s: float = 0.0

    def train_config(self, section: Any, plan: Any, data: dict[str, Any]) -> dict[str, Any]:
        opts = self.options(section)
        args = {"at_batch": int(opts.at_batch), "rank": int(opts.rank), "after": int(opts.after)}
        if opts.node_file:
            args["node_file"] = str(opts.node_file)
        return {"callbacks": {CALLBACK: args}}

    def after_train(self, section: Any, trainer: Any, ctx: Any) -> dict[str, Any]:
        import time

        marker = Path(ctx.run_dir) / "crash_post_started"
        first = not marker.exists()
        marker.touch()
        if first:
            time.sleep(float(self.options(section).post_s))
        return {"crash_post_first_attempt": first}

    def prepare(self, section: Any, ctx: Any) -> None:
        from llmfoundry.registry import callbacks

        if CALLBACK not in callbacks.get_all():
            callbacks.register(CALLBACK, func=_callback_class())


@hookimpl
def hpc_llm_register_evaluators(register: Registry) -> None:
    register(CrashAt())
