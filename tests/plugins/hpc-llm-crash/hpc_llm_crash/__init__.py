"""Test plugin: user code that raises at a fixed batch.

Used by hpc_llm's tests to stand for a bug in user code (a model, a loss, a
callback) that fails deterministically: ``eval.evaluators=[crash]`` adds a
Composer callback that raises ``RuntimeError`` at the end of batch
``eval.options.crash.at_batch`` on rank ``eval.options.crash.rank``. It is a
real third-party package, installed with pip and found through its entry
point, so the code under test needs no fault-injection hook.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hpc_llm import hookimpl
from hpc_llm.plugins.base import Evaluator
from hpc_llm.plugins.registry import Registry

CALLBACK = "hpc_llm_test_crash"


def _callback_class() -> type:
    from composer.core import Callback
    from composer.utils import dist

    class Crash(Callback):
        def __init__(self, at_batch: int, rank: int) -> None:
            self.at_batch, self.rank = at_batch, rank

        def batch_end(self, state: Any, logger: Any) -> None:
            batch = int(state.timestamp.batch)
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

    def train_config(self, section: Any, plan: Any, data: dict[str, Any]) -> dict[str, Any]:
        opts = self.options(section)
        return {"callbacks": {CALLBACK: {"at_batch": int(opts.at_batch), "rank": int(opts.rank)}}}

    def prepare(self, section: Any, ctx: Any) -> None:
        from llmfoundry.registry import callbacks

        if CALLBACK not in callbacks.get_all():
            callbacks.register(CALLBACK, func=_callback_class())


@hookimpl
def hpc_llm_register_evaluators(register: Registry) -> None:
    register(CrashAt())
