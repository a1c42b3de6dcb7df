"""results.json: the one record of a run that reports read.

Written atomically (temp file + rename) by global rank 0 at the end of a run,
or by the launcher when a run dies before it could. Pure (login node).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from hpc_llm.plan import JobPlan

RESULTS_FILE = "results.json"
SCHEMA_VERSION = 1


def base_results(plan: JobPlan, status: str) -> dict[str, Any]:
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
        "restarts": int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0),
        "slurm_job_ids": [os.environ["SLURM_JOB_ID"]] if os.environ.get("SLURM_JOB_ID") else [],
        "eval": {},
        "conversion_ok": None,
        "inference_ok": None,
        "device_mesh": None,
        "run_dir": plan.run_dir,
    }


def run_info(cfg: Any) -> dict[str, Any]:
    """What was trained, for reports: model, parameters, data, duration, eval interval."""
    from omegaconf import OmegaConf

    train = OmegaConf.to_container(cfg.train, resolve=True) if cfg.get("train") is not None else {}
    info: dict[str, Any] = {
        "model": None,
        "n_params": None,
        "flops_per_token": None,
        "data": str(cfg.data.name) + (f" ({cfg.data.path or cfg.data.remote})" if cfg.data.path or cfg.data.remote else ""),
        "max_duration": str(train.get("max_duration")) if isinstance(train, dict) else None,
        "eval_interval": str(cfg.eval.interval) if cfg.eval.evaluators else None,
        "global_train_batch_size": train.get("global_train_batch_size") if isinstance(train, dict) else None,
        "max_seq_len": train.get("max_seq_len") if isinstance(train, dict) else None,
    }
    model = train.get("model") if isinstance(train, dict) else None
    if isinstance(model, dict) and model.get("name") == "mpt_causal_lm":
        from hpc_llm.flops import human_params, model_flops_per_token

        try:
            n, fpt = model_flops_per_token(train)
        except (KeyError, TypeError, ValueError):
            pass
        else:
            info.update(model=f"MPT-{human_params(n)}", n_params=n, flops_per_token=fpt)
    return info


def write_results(run_dir: Path | str, data: dict[str, Any]) -> Path:
    path = Path(run_dir) / RESULTS_FILE
    tmp = path.with_suffix(f".json.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")
    os.replace(tmp, path)
    return path


def read_results(run_dir: Path | str) -> dict[str, Any] | None:
    path = Path(run_dir) / RESULTS_FILE
    if not path.is_file():
        return None
    return json.loads(path.read_text())
