"""hpc_llm config + plugins -> the LLM Foundry train config the job runs.

Pure (login node: ``hpc-llm config`` prints it; in the job: it is what
``llmfoundry.command_utils.train`` receives). Plugin fragments form the base,
the user's ``train.*`` keys are merged on top (so an experiment can still
override any loader or FSDP key), then interpolations such as
``${max_seq_len}`` are resolved against the result.
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, OmegaConf

from hpc_llm.config.validate import ResolvedJob, check_train_keys
from hpc_llm.errors import ConfigError

RESULTS_LOGGER = "hpc_llm_results"


def build_train_config(cfg: DictConfig, job: ResolvedJob, *, run_name: str) -> dict[str, Any]:
    plan = job.plan
    data = job.data.train_config(cfg.data, plan)
    fragments: list[dict[str, Any]] = [
        data,
        job.parallelism.train_config(cfg.parallelism, plan),
        job.checkpoint.train_config(cfg.checkpoint, plan),
    ]
    eval_fragments = [ev.train_config(cfg.eval, plan, data) for ev in job.evaluators]
    if not any("eval_loader" in f for f in eval_fragments):
        # The data source's held-out loader is used only when an evaluator asks for it.
        data.pop("eval_loader", None)
    fragments.extend(eval_fragments)
    fragments.append({"run_name": run_name, "loggers": {RESULTS_LOGGER: {}}})
    merged = OmegaConf.merge(*[OmegaConf.create(f) for f in fragments], cfg.train)
    out = OmegaConf.to_container(merged, resolve=True)
    assert isinstance(out, dict)
    check_train_keys(OmegaConf.create(out))
    for key in ("model", "tokenizer", "train_loader", "max_duration", "max_seq_len"):
        if key not in out:
            raise ConfigError(
                f"train.{key} is required by LLM Foundry and neither the experiment nor "
                f"data source '{job.data.name}' sets it"
            )
    return out  # type: ignore[return-value]
