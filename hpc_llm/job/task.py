"""The in-job task: one rank of one training run.

Every launcher (local processes, Slurm tasks, containers) ends up calling
:func:`run` once per rank with the composed config. It wires the rank's
distributed environment, moves into node-local scratch, asks the plugins for
the LLM Foundry train config, trains with ``llmfoundry.command_utils.train``
and, on global rank 0, writes ``results.json``.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import yaml
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from hpc_llm.config.validate import ResolvedJob, resolve_job
from hpc_llm.job import distenv
from hpc_llm.job.context import JobContext
from hpc_llm.job.results import collect_results, failed_results, write_results
from hpc_llm.trainconfig import build_train_config

log = logging.getLogger(__name__)


def node_local_dir(cfg: DictConfig, run_dir: Path, dist: distenv.DistEnv) -> Path:
    """Per-node working directory outside the shared run dir (DESIGN.md hazard 1)."""
    base = cfg.cluster.scratch or os.environ.get("TMPDIR") or tempfile.gettempdir()
    job = os.environ.get("SLURM_JOB_ID") or hashlib.sha1(str(run_dir).encode()).hexdigest()[:10]
    path = Path(base) / f"hpc_llm-{job}" / f"node{dist.node_rank}"
    path.mkdir(parents=True, exist_ok=True)
    return path


def run_name(plan_experiment: str, run_dir: Path) -> str:
    """Stable across requeues of the same run (autoresume keys on it)."""
    return f"{plan_experiment}-{run_dir.parent.name}-{run_dir.name}"


def run(cfg: DictConfig) -> dict[str, Any]:
    started = time.time()
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    dist = distenv.from_environ(os.environ)
    os.environ.update(dist.as_environ())
    job = resolve_job(cfg, str(run_dir))
    if dist.world_size != job.plan.world_size:
        raise RuntimeError(
            f"launched {dist.world_size} ranks but the config asks for {job.plan.world_size} "
            f"({job.plan.nodes} node(s) x {job.plan.tasks_per_node} tasks)"
        )
    ctx = JobContext(job.plan, dist, run_dir, node_local_dir(cfg, run_dir, dist))
    try:
        return _train(cfg, job, ctx, started)
    except BaseException as exc:
        if dist.rank == 0:
            write_results(run_dir, failed_results(job.plan, ctx, f"{type(exc).__name__}: {exc}"))
            log.error("training failed:\n%s", traceback.format_exc())
        raise


def _train(cfg: DictConfig, job: ResolvedJob, ctx: JobContext, started: float) -> dict[str, Any]:
    os.chdir(ctx.node_dir)
    os.environ.update({k: str(v) for k, v in cfg.cluster.env.items()})
    os.environ.update(job.parallelism.env(cfg.parallelism, job.plan))
    train_cfg = build_train_config(cfg, job, run_name=run_name(job.plan.experiment, ctx.run_dir))
    if ctx.dist.rank == 0:
        (ctx.run_dir / "train_config.yaml").write_text(yaml.safe_dump(train_cfg, sort_keys=False))

    job.data.prepare(cfg.data, ctx)
    job.parallelism.prepare(cfg.parallelism, ctx)
    job.checkpoint.prepare(cfg.checkpoint, ctx)
    for ev in job.evaluators:
        ev.prepare(cfg.eval, ctx)

    # The training stack is imported only here, inside the job.
    from hpc_llm.job import compat, results_logger

    compat.apply()
    results_logger.CURRENT = ctx
    results_logger.register()
    from llmfoundry.command_utils import train

    t0 = time.time()
    trainer = train(OmegaConf.create(train_cfg))
    train_s = time.time() - t0

    eval_metrics: dict[str, Any] = {}
    for ev in job.evaluators:
        eval_metrics.update(ev.after_train(cfg.eval, trainer, ctx))
    results = collect_results(
        cfg, job, ctx, trainer, eval_metrics=eval_metrics, train_s=train_s, job_s=time.time() - started
    )
    if ctx.dist.rank == 0:
        write_results(ctx.run_dir, results)
    trainer.close()
    return results
