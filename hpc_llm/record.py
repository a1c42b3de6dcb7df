"""A run's record: ``results.json`` and the attempts behind it. The one owner of both.

``results.json`` (in the run dir) is what reports, ``hpc-llm status`` and
the estimator read: the same fields whatever happened to the run (see
:func:`skeleton`). ``.hpc_llm/attempts.json`` lists every start of the run
(a Slurm requeue, a restart inside the allocation) and how each ended.

Inside a job, global rank 0 keeps a :class:`RunRecord`: it opens an attempt
when the rank starts, notes progress, and closes the attempt through exactly
one of :meth:`RunRecord.completed`, :meth:`RunRecord.failed` or
:meth:`RunRecord.stopped`, each of which writes results.json. Files are
replaced atomically (temp file + rename), so a reader never sees half a
record. Pure (login node): no training stack.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, cast

from hpc_llm.plan import JobPlan

RESULTS_FILE = "results.json"
ATTEMPTS_FILE = "attempts.json"
#: hpc_llm's private files in a run dir: payload, attempts, readiness markers
PRIVATE_DIR = ".hpc_llm"
SCHEMA_VERSION = 1


def skeleton(plan: JobPlan, status: str) -> dict[str, Any]:
    """Fields every results.json has, whatever happened to the run."""
    return {
        "schema_version": SCHEMA_VERSION,
        "experiment": plan.experiment,
        "status": status,
        "error": None,
        "nodes": plan.nodes,
        "tasks_per_node": plan.tasks_per_node,
        "gpus_per_node": plan.gpus_per_node,
        "world_size": plan.world_size,
        "device": plan.device,
        "parallelism": plan.parallelism,
        "batches_done": None,
        "tokens_done": None,
        "wallclock_s": None,
        "train_s": None,
        "fit_s": None,
        "tokens_per_sec": None,
        "mfu": None,
        "train_loss": None,
        "train_loss_first": None,
        "train_loss_history": [],
        "peak_memory_bytes": None,
        "peak_memory_bytes_per_rank": [],
        "checkpoint": None,
        "checkpoint_bytes": None,
        "restarts": 0,
        "slurm_job_ids": [],
        "eval": {},
        "conversion_ok": None,
        "inference_ok": None,
        "device_mesh": None,
        "run_dir": plan.run_dir,
    }


def run_info(cfg: Any) -> dict[str, Any]:
    """What was trained, for reports: model, parameters, data, duration, eval interval."""
    from omegaconf import OmegaConf

    container = OmegaConf.to_container(cfg.train, resolve=True) if cfg.get("train") is not None else {}
    train = cast("dict[str, Any]", container if isinstance(container, dict) else {})
    where = cfg.data.path or cfg.data.remote
    info: dict[str, Any] = {
        "model": None,
        "n_params": None,
        "flops_per_token": None,
        "data": str(cfg.data.name) + (f" ({where})" if where else ""),
        "max_duration": str(train.get("max_duration")),
        "eval_interval": str(cfg.eval.interval) if cfg.eval.evaluators else None,
        "global_train_batch_size": train.get("global_train_batch_size"),
        "max_seq_len": train.get("max_seq_len"),
    }
    model = train.get("model")
    if isinstance(model, dict) and model.get("name") == "mpt_causal_lm":
        from hpc_llm.flops import human_params, model_flops_per_token

        try:
            n, fpt = model_flops_per_token(train)
        except (KeyError, TypeError, ValueError):
            pass
        else:
            info.update(model=f"MPT-{human_params(n)}", n_params=n, flops_per_token=fpt)
    return info


def _write_json(path: Path, data: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")
    os.replace(tmp, path)
    return path


def write_results(run_dir: Path | str, data: dict[str, Any]) -> Path:
    return _write_json(Path(run_dir) / RESULTS_FILE, data)


def read_results(run_dir: Path | str) -> dict[str, Any] | None:
    path = Path(run_dir) / RESULTS_FILE
    if not path.is_file():
        return None
    data: dict[str, Any] = json.loads(path.read_text())
    return data


@dataclass
class Attempt:
    """One start of the run: how it began and how it ended."""

    job_id: str | None
    restart: int
    started_at: float
    resumed_at_batch: int = 0
    last_batch: int = 0
    #: running | completed | preempted | failed | preflight failed
    ended: str = "running"
    signal: str | None = None
    signal_time: float | None = None
    stopped_at_batch: int | None = None
    save_s: float | None = None
    signal_to_requeue_s: float | None = None
    requeued: bool = False

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Attempt:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


#: what results.json shows of each attempt
ATTEMPT_SUMMARY = (
    "job_id",
    "restart",
    "ended",
    "signal",
    "resumed_at_batch",
    "stopped_at_batch",
    "save_s",
    "signal_to_requeue_s",
)


@dataclass
class Attempts:
    path: Path
    items: list[Attempt] = field(default_factory=list)

    @classmethod
    def load(cls, run_dir: Path | str) -> Attempts:
        path = Path(run_dir) / PRIVATE_DIR / ATTEMPTS_FILE
        items = [Attempt.from_dict(a) for a in json.loads(path.read_text())] if path.is_file() else []
        return cls(path, items)

    def save(self) -> None:
        _write_json(self.path, [asdict(a) for a in self.items])

    @property
    def current(self) -> Attempt:
        return self.items[-1]

    def batches_lost(self) -> int:
        """Batches trained in an attempt but recomputed by the next one."""
        return sum(
            max(0, prev.last_batch - nxt.resumed_at_batch)
            for prev, nxt in zip(self.items, self.items[1:], strict=False)
        )

    def summary(self) -> list[dict[str, Any]]:
        return [{k: v for k, v in asdict(a).items() if k in ATTEMPT_SUMMARY} for a in self.items]


class RunRecord:
    """The record of one run, kept by global rank 0 of its job.

    Every way a run ends goes through :meth:`completed`, :meth:`failed` or
    :meth:`stopped`; each closes the current attempt first and then writes
    results.json, so the two files always agree.
    """

    def __init__(self, run_dir: Path, plan: JobPlan, info: dict[str, Any], attempts: Attempts) -> None:
        self.run_dir = Path(run_dir)
        self.plan = plan
        self.info = info
        self.attempts = attempts

    @classmethod
    def open(
        cls, run_dir: Path, plan: JobPlan, info: dict[str, Any], *, job_id: str | None, restart: int, started_at: float
    ) -> RunRecord:
        """Load the attempts so far and start a new one."""
        attempts = Attempts.load(run_dir)
        attempts.items.append(Attempt(job_id=job_id, restart=restart, started_at=started_at))
        attempts.save()
        return cls(run_dir, plan, info, attempts)

    @property
    def current(self) -> Attempt:
        return self.attempts.current

    def note(self, **changes: Any) -> None:
        """Update the current attempt (progress, where it resumed) and save it."""
        for key, value in changes.items():
            setattr(self.current, key, value)
        self.attempts.save()

    # -- the ways a run ends ----------------------------------------------------
    def completed(self, figures: dict[str, Any], *, batch: int) -> dict[str, Any]:
        """Training (and the post-train stage) finished: ``figures`` are the measurements."""
        return self._close("completed", "completed", figures, batch=batch)

    def failed(
        self, error: str, figures: dict[str, Any] | None = None, *, ended: str = "failed", batch: int | None = None
    ) -> dict[str, Any]:
        """The run stopped for good: ``error`` says why (one line)."""
        return self._close("failed", ended, {**(figures or {}), "error": error}, batch=batch)

    def stopped(
        self, figures: dict[str, Any], *, ended: str, batch: int, requeued: bool, error: str | None = None
    ) -> dict[str, Any]:
        """The run stopped on a signal (or a request) after saving; ``requeued``: it will go on."""
        status = "requeued" if requeued else "failed"
        return self._close(status, ended, {**figures, "error": error}, batch=batch)

    def _close(self, status: str, ended: str, figures: dict[str, Any], *, batch: int | None) -> dict[str, Any]:
        self.current.ended = ended
        if batch is not None:
            self.current.last_batch = batch
        self.attempts.save()
        results = skeleton(self.plan, status)
        results.update(self.info)
        results.update({k: v for k, v in figures.items() if v is not None or k not in results})
        if results.get("batches_done") is None and batch is not None:
            results["batches_done"] = batch
        items = self.attempts.items
        results["restarts"] = max(len(items) - 1, self.current.restart)
        results["batches_lost"] = self.attempts.batches_lost()
        results["attempts"] = self.attempts.summary()
        requeues = [a.signal_to_requeue_s for a in items if a.signal_to_requeue_s is not None]
        results["signal_to_requeue_s"] = requeues[-1] if requeues else None
        results["slurm_job_ids"] = sorted({a.job_id for a in items if a.job_id}, key=str)
        results["finished_at"] = time.time()
        write_results(self.run_dir, results)
        return results
