"""What a launcher hands to the ranks of a job, as Hydra's own launchers do.

The launcher writes ``<run dir>/.hpc_llm/job.pkl`` once per job: the task
function, the job's composed config, Hydra's singleton state (config store,
registered OmegaConf resolvers, the runtime; what hydra-submitit-launcher
and the joblib/ray launchers hand their jobs) and, when the ranks are to run
Hydra's ``run_job`` themselves (the Slurm launcher), the Hydra context.
Every rank runs :mod:`hpc_llm.job.rank.entry` on it, and global rank 0 leaves the
result in ``return.pkl`` for the launcher: a ``JobReturn`` when it ran
``run_job``, else the task function's return value. Both sides: the launcher
writes it, :mod:`hpc_llm.job.rank.entry` reads it; nothing here imports the job side.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cloudpickle
from hydra.core.singleton import Singleton

from hpc_llm.rundir.layout import RunDir


@dataclass
class Payload:
    task_function: Any
    #: the job's composed config, hydra node included
    config: Any
    #: Hydra's Singleton.get_state() in the launching process
    singleton_state: Any
    #: set when the ranks run Hydra's run_job (output dir, job logging, env_set, callbacks)
    hydra_context: Any = None


def shared_part(task_function: Any, hydra_context: Any = None) -> bytes:
    """What every job of a sweep shares (task function, Hydra's singleton state and context),
    pickled once per sweep: ~10 ms a job otherwise, a second of a 100-point sweep."""
    return cloudpickle.dumps((task_function, Singleton.get_state(), hydra_context))


def write_payload(run_dir: Path | str, config: Any, shared: bytes) -> Path:
    """Pickle the job for its ranks: the sweep's ``shared`` part, then the job's config (two
    pickles, one after the other; cloudpickle: a Hydra app's own
    structured configs may live in its ``__main__``); clears the return value of an earlier launch."""
    rd = RunDir(run_dir)
    rd.private.mkdir(parents=True, exist_ok=True)
    rd.payload.write_bytes(shared + _dumps(config))
    rd.return_value.unlink(missing_ok=True)
    return rd.payload


def _dumps(config: Any) -> bytes:
    """``cloudpickle.dumps(config)``, from the C pickler where that gives the same thing: half the
    time (~2 ms a job). cloudpickle differs from pickle only for what cannot be imported by name
    in the job: a class of the app's ``__main__`` (pickled by value), which plain pickle would
    name and the job could not find; its pickle then contains the bytes ``__main__`` (the module
    name every by-name reference carries), and what plain pickle refuses raises. Both go to
    cloudpickle (a config value "__main__" only costs the slower path)."""
    try:
        data = pickle.dumps(config, protocol=cloudpickle.DEFAULT_PROTOCOL)
    except (pickle.PicklingError, AttributeError, TypeError):
        return cloudpickle.dumps(config)
    return cloudpickle.dumps(config) if b"__main__" in data else data


def read_payload(path: Path | str) -> Payload:
    with open(path, "rb") as f:
        task_function, state, hydra_context = cloudpickle.load(f)
        config = cloudpickle.load(f)
    return Payload(task_function, config, state, hydra_context)


def read_return(run_dir: Path | str) -> tuple[bool, Any]:
    """(found, value) of what rank 0 left: a JobReturn (ranks ran run_job) or the return value."""
    path = RunDir(run_dir).return_value
    if not path.exists():
        return False, None
    return True, cloudpickle.loads(path.read_bytes())
