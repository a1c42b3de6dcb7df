"""What the agent loads once, so that every generation of ranks it forks starts warm.

Importing torch, Composer, Streaming and LLM Foundry costs 6-10 s here (a cold
rank's start is mostly that); the payload (the task function and the job's
config) is unpickled once too, and so is any module named in ``HPC_LLM_AGENT_WARM``
(comma-separated: another Hydra app's heavy imports). For hpc_llm's own task function the
run's trainer (``trainer.name``) names the modules to import (``warm_modules``) and sets up
what every rank would (``warm``: LLM Foundry's upstream fixes and hpc_llm's Composer
callbacks, or torchtitan's CPU fixes), so a forked rank finds them done. Any other
Hydra task function gets only its own module (from the unpickling).

Fork after imports is safe only if nothing has started what a fork cannot
copy; :func:`check_fork_safe` is asserted before every fork: CUDA not
initialised (a forked child cannot use a CUDA context), no Python thread but
the agent's own (a lock held by another thread stays held in the child). The
native threads the imports start (OpenBLAS' pool, jemalloc's background
thread) register fork handlers; tests/test_agent.py shows ranks forked from
a warm agent running multi-threaded torch (OpenMP), the tokenizers library's
thread pool and a gloo process group.
"""

from __future__ import annotations

import gc
import importlib
import os
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hpc_llm.rundir.payload import Payload


def is_hpc_llm_task(payload: Payload) -> bool:
    return getattr(payload.task_function, "__module__", "") == "hpc_llm.app"


#: modules to import once besides (comma-separated): another Hydra app's own heavy imports
EXTRA_ENV = "HPC_LLM_AGENT_WARM"


def warm(payload_path: Path | str) -> tuple[Payload, float]:
    """The payload, and the seconds spent loading it and what its ranks will import."""
    t0 = time.monotonic()
    # the payload (cloudpickle, hydra) loads here, with the rest: the agent's control loop imports
    # nothing third-party (tests/test_layers.py)
    from hpc_llm.rundir.payload import read_payload

    payload = read_payload(payload_path)
    for name in filter(None, (m.strip() for m in os.environ.get(EXTRA_ENV, "").split(","))):
        importlib.import_module(name)
    if is_hpc_llm_task(payload):
        # the run's trainer says what its ranks import and what it sets up once
        # (hpc_llm.builtin.trainers: LLM Foundry's stack, or torchtitan's)
        trainer = trainer_of(payload)
        for name in trainer.warm_modules:
            importlib.import_module(name)
        trainer.warm()
    # Everything loaded so far lives as long as the agent: out of the garbage collector's reach
    # (CPython's gc.freeze, made for fork servers). Without it every forked rank's first full
    # collection (LLM Foundry's train() runs one before fit) walks the millions of objects the
    # imports made, about a second here, and writes to each of them: the pages the ranks would
    # share with the agent are copied.
    gc.collect()
    gc.freeze()
    return payload, time.monotonic() - t0


def trainer_of(payload: Payload) -> Any:
    """The trainer plugin the payload's run picked (``trainer.name``)."""
    from omegaconf import OmegaConf

    from hpc_llm.config.validate import trainer_name
    from hpc_llm.plugins.manager import get_plugins

    block = OmegaConf.select(payload.config, "plugins.block", default=None) or []
    return get_plugins(block).get("trainer", trainer_name(payload.config))


def check_fork_safe() -> None:
    """Raise when forking now would hand the ranks something broken (see the module docstring)."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        raise RuntimeError("the agent initialised CUDA: a rank forked from it could not use the GPU")
    others = [t.name for t in threading.enumerate() if t is not threading.current_thread()]
    if others:
        raise RuntimeError(f"the agent runs other Python threads ({', '.join(others)}): forking could deadlock a rank")


def scratch_dir(payload: Any, run_dir: Path, job_id: str | None, node_rank: int) -> Path | None:
    """The node-local scratch the ranks of hpc_llm's task use on this node (None for another
    task function: the agent knows nothing of its files)."""
    if payload is None or not is_hpc_llm_task(payload):
        return None
    from omegaconf import OmegaConf

    from hpc_llm.job.rank.task import scratch_path

    task_cfg = payload.config
    if OmegaConf.select(task_cfg, "cluster", default=None) is None:
        return None
    return scratch_path(task_cfg, run_dir, job_id, node_rank)


def describe(payload: Any) -> str:
    fn = payload.task_function
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"
