"""Built-in evaluators.

* ``heldout``: loss, perplexity and token accuracy on the held-out split, and
  the metrics of LLM Foundry's in-context-learning tasks when ``train.icl_tasks``
  is configured (under ``icl``).
  Composer evaluates the data source's ``eval_loader`` with the model's own
  metrics (LanguageCrossEntropy, LanguagePerplexity, TokenAccuracy for MPT) at
  ``eval.interval`` and at the end of training; the values are read from what
  Composer logged, so no extra pass over the data is made.
* ``hf_convert``: the final weights as a Hugging Face model directory
  (``conversion_ok``, ``hf_model_dir`` in results.json).
* ``inference``: that directory loaded with plain ``transformers`` and asked
  to generate (``inference_ok``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from hpc_llm import hookimpl
from hpc_llm.config.plan import JobPlan
from hpc_llm.errors import ConfigError
from hpc_llm.paths import size_bytes
from hpc_llm.plugins.base import Evaluator

log = logging.getLogger(__name__)

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
        icl: dict[str, Any] = {}
        gauntlet: dict[str, Any] = {}
        for key, value in ctx.metrics.items():
            if key.startswith("icl/metrics/eval_gauntlet/"):  # LLM Foundry's EvalGauntlet (train.eval_gauntlet)
                gauntlet[key.removeprefix("icl/metrics/eval_gauntlet/")] = value
            elif key.startswith("metrics/eval/"):
                metric = key.rsplit("/", 1)[-1]
                if metric in METRICS:
                    out[METRICS[metric]] = value
            elif key.startswith("metrics/") and not key.startswith("metrics/train/"):
                # LLM Foundry's ICL evaluators (train.icl_tasks): metrics/<label>/<n>-shot/<metric>
                icl[key.removeprefix("metrics/")] = value
        if icl:
            out["icl"] = icl
        if gauntlet:
            out["gauntlet"] = gauntlet
        return out


class HfConvert(Evaluator):
    name = "hf_convert"
    description = "final weights -> Hugging Face model dir (LLM Foundry's HuggingFaceCheckpointer)"
    top_level_keys = ("conversion_ok", "conversion_error", "hf_model_dir", "hf_model_bytes")

    @dataclass
    class Options:
        # Weights dtype of the exported model: float32, bfloat16 or float16.
        precision: str = "bfloat16"

    def validate(self, section: DictConfig, plan: JobPlan) -> None:
        opts = self.options(section)
        if opts.precision not in ("float32", "bfloat16", "float16"):
            raise ConfigError(
                f"eval.options.hf_convert.precision={opts.precision!r}; allowed: float32, bfloat16, float16"
            )

    def after_train(self, section: DictConfig, trainer: Any, ctx: Any) -> dict[str, Any]:
        from hpc_llm.builtin import hf_export

        # every rank: the full state dict is gathered collectively; a failure is
        # recorded, not fatal (training itself succeeded)
        path, error = hf_export.export(trainer, Path(ctx.run_dir), self.options(section).precision)
        if error is not None:
            return {"conversion_ok": False, "conversion_error": error}
        ctx.artifacts["hf_model_dir"] = str(path)
        ok = (path / "config.json").is_file()
        return {"conversion_ok": ok, "hf_model_dir": str(path), "hf_model_bytes": size_bytes(path) if ok else None}


class Inference(Evaluator):
    name = "inference"
    description = "load the converted model with transformers and generate a few tokens"
    top_level_keys = ("inference_ok",)

    @dataclass
    class Options:
        prompt: str = "The"
        max_new_tokens: int = 8

    def validate(self, section: DictConfig, plan: JobPlan) -> None:
        self.options(section)
        names = list(section.evaluators)
        if "hf_convert" not in names[: names.index(self.name)]:
            raise ConfigError(
                "eval.evaluators: 'inference' loads the model 'hf_convert' writes; list hf_convert before it "
                "(eval=full does)"
            )

    def after_train(self, section: DictConfig, trainer: Any, ctx: Any) -> dict[str, Any]:
        if ctx.dist.rank != 0:
            return {}
        model_dir = ctx.artifacts.get("hf_model_dir")
        if not model_dir:
            return {"inference_ok": False, "inference_error": "no converted model (hf_convert failed)"}
        from hpc_llm.builtin import hf_export

        opts = self.options(section)
        try:
            out = hf_export.generate_check(Path(model_dir), opts.prompt, opts.max_new_tokens)
        except Exception as exc:
            log.exception("inference check failed")
            return {"inference_ok": False, "inference_error": f"{type(exc).__name__}: {exc}"}
        return {"inference_ok": True, **out}


@hookimpl
def hpc_llm_register_evaluators(register) -> None:
    register(HeldOut())
    register(HfConvert())
    register(Inference())
