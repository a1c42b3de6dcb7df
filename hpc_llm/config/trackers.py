"""Experiment trackers (``logger=mlflow``, ``logger=wandb``) as Composer's own loggers.

LLM Foundry builds loggers by name from the train config's ``loggers:``
section; this module writes that section (pure, login side) so that:

- every attempt of a run (requeues, restarts in place) logs to ONE tracker
  run: MLflow's logger resumes the run tagged with the Composer run name
  (``resume: true``; hpc_llm's run name is stable across attempts), W&B's is
  given a run id derived from that name with ``resume: allow``;
- a sweep is one MLflow experiment / one W&B group (its directory's name);
- tags name the hpc_llm run, the sweep, the nodes and, added in the job by
  :func:`add_job_tags`, the Slurm job id(s), the attempt and the git commit.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from hpc_llm.errors import ConfigError

KNOWN = ("none", "mlflow", "wandb")
WANDB_MODES = ("online", "offline", "disabled")


def validate(cfg: DictConfig) -> None:
    """One line for a tracker that cannot work."""
    lg = cfg.logger
    if lg.name not in KNOWN:
        raise ConfigError(f"logger.name={lg.name!r} is not a tracker hpc_llm knows; allowed: {', '.join(KNOWN)}")
    if lg.name == "mlflow" and not lg.tracking_uri:
        raise ConfigError(
            "logger=mlflow needs a tracking server: set logger.tracking_uri or MLFLOW_TRACKING_URI "
            "(http://host:port, file:///shared/mlruns or databricks)"
        )
    if lg.name == "wandb" and lg.mode not in WANDB_MODES:
        raise ConfigError(f"logger.mode={lg.mode!r} is not a W&B mode; allowed: {', '.join(WANDB_MODES)}")


def sweep_of(run_dir: str | None) -> str | None:
    return Path(run_dir).parent.name if run_dir else None


def wandb_id(run_name: str) -> str:
    """A W&B run id for this run name: W&B allows letters, digits, - and _ (64 at most)."""
    clean = re.sub(r"[^A-Za-z0-9_-]", "-", run_name)
    if len(clean) <= 64:
        return clean
    return clean[:47] + "-" + hashlib.sha1(run_name.encode()).hexdigest()[:16]


def train_loggers(cfg: DictConfig, run_dir: str | None, run_name: str, nodes: int) -> dict[str, Any]:
    """The ``loggers:`` entries for ``cfg.logger`` (empty for ``none``)."""
    validate(cfg)
    lg = cfg.logger
    sweep = sweep_of(run_dir)
    tags = {
        "hpc_llm.run": run_name,
        "hpc_llm.sweep": sweep or "-",
        "hpc_llm.nodes": str(nodes),
        **{str(k): str(v) for k, v in (lg.tags or {}).items()},
    }
    if lg.name == "mlflow":
        return {
            "mlflow": {
                "experiment_name": lg.experiment or (f"{cfg.experiment}-{sweep}" if sweep else str(cfg.experiment)),
                "tracking_uri": str(lg.tracking_uri),
                "resume": True,  # the run tagged with this run name, if there is one
                "tags": tags,
                "synchronous": bool(lg.synchronous),
                "log_system_metrics": False,  # psutil sampling threads; the job measures itself
                "model_registry_uri": None,
                # LLM Foundry logs the train config as params, which MLflow never lets change
                # within a run: this section (its tags name the attempt) differs per attempt
                "ignore_hyperparameters": ["loggers"],
            }
        }
    if lg.name == "wandb":
        return {
            "wandb": {
                "project": lg.project or "hpc_llm",
                "entity": lg.entity,
                "group": sweep,
                "name": run_name,
                "tags": [f"{k}={v}" for k, v in tags.items()],
                "init_kwargs": {"id": wandb_id(run_name), "resume": "allow", "mode": str(lg.mode)},
            }
        }
    return {}


def add_job_tags(train_cfg: dict[str, Any], *, job_ids: list[str], attempt: int, commit: str | None) -> None:
    """What only the job knows: the Slurm job id(s) so far, this attempt, the git commit."""
    extra = {"hpc_llm.slurm_job_ids": ",".join(job_ids) or "-", "hpc_llm.attempt": str(attempt)}
    if commit:
        extra["hpc_llm.git_commit"] = commit
    loggers = train_cfg.get("loggers") or {}
    if "mlflow" in loggers:
        loggers["mlflow"].setdefault("tags", {}).update(extra)
    if "wandb" in loggers:
        loggers["wandb"].setdefault("tags", []).extend(f"{k}={v}" for k, v in extra.items())
