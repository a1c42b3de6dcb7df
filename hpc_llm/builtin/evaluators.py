"""Built-in evaluator: loss, perplexity and token accuracy on the held-out split.

Composer evaluates the data source's ``eval_loader`` with the model's own
metrics (LanguageCrossEntropy, LanguagePerplexity, TokenAccuracy for MPT) at
``eval.interval`` and at the end of training; the values are read from what
Composer logged, so no extra pass over the data is made.
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig

from hpc_llm import hookimpl
from hpc_llm.errors import ConfigError
from hpc_llm.plan import JobPlan
from hpc_llm.plugins.base import Evaluator

METRICS = {
    "LanguageCrossEntropy": "loss",
    "LanguagePerplexity": "perplexity",
    "TokenAccuracy": "token_accuracy",
}


class HeldOut(Evaluator):
    name = "heldout"
    description = "held-out loss, perplexity and token accuracy (Composer eval metrics)"

    def train_config(self, section: DictConfig, plan: JobPlan, data: dict[str, Any]) -> dict[str, Any]:
        if "eval_loader" not in data:
            raise ConfigError(
                "evaluator 'heldout' needs a held-out split, and the data source provides none; "
                "remove it with eval=none"
            )
        return {
            "eval_loader": data["eval_loader"],
            "eval_interval": section.interval,
            "eval_subset_num_batches": section.subset_num_batches,
        }

    def after_train(self, section: DictConfig, trainer: Any, ctx: Any) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in ctx.metrics.items():
            if not key.startswith("metrics/eval/"):
                continue
            metric = key.rsplit("/", 1)[-1]
            if metric in METRICS:
                out[METRICS[metric]] = value
        return out


@hookimpl
def hpc_llm_register_evaluators(register) -> None:
    register(HeldOut())
