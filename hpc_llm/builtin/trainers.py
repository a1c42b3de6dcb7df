"""hpc_llm's own trainers: LLM Foundry (the default) and torchtitan (docs/reference/trainers.md).

Each is a plugin like any other (``hpc_llm_register_trainers``). What they do in the job lives
beside the rest of the rank's code: :mod:`hpc_llm.job.rank.foundry_train` and
:mod:`hpc_llm.job.rank.titan`; this module is login-light (no torch, no stack).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from omegaconf import DictConfig

from hpc_llm import hookimpl
from hpc_llm.errors import ConfigError
from hpc_llm.plugins.base import Trained, Trainer

#: modules LLM Foundry's ranks import on their way to the first batch
FOUNDRY_STACK = (
    "torch",
    "torch.distributed",
    "composer",
    "composer.callbacks",
    "composer.trainer",
    "streaming",
    "streaming.base.util",
    "transformers",
    "llmfoundry",
    "llmfoundry.command_utils",
    "hpc_llm.job.rank.task",
    "hpc_llm.job.rank.compat",
    "hpc_llm.job.rank.foundry",
    "hpc_llm.job.rank.foundry_train",
    "hpc_llm.job.rank.fence",
    "hpc_llm.job.rank.measure",
)


class LlmFoundry(Trainer):
    name = "llmfoundry"
    description = "LLM Foundry 0.22 + Composer 0.32 (torch 2.7): the train config under `train` (default)"
    extra = "train"
    warm_modules = FOUNDRY_STACK
    check_module = "hpc_llm.job.rank.foundry_check"

    def stack_config(self, cfg: DictConfig, job: Any, run_name: str) -> dict[str, Any]:
        from hpc_llm.config.train_config import build_train_config

        return build_train_config(cfg, job, run_name=run_name)

    def warm(self) -> None:
        from hpc_llm.job.rank import compat, foundry

        compat.apply()
        foundry.register()
        _prepay_first_calls()

    def train(self, cfg: DictConfig, job: Any, ctx: Any) -> Trained:
        from hpc_llm.job.rank import foundry_train

        return foundry_train.train(cfg, job, ctx)


def _prepay_first_calls() -> None:
    """What a rank's start pays on first use, paid once in the agent (measured with py-spy on a
    restart in place: together about 1.5 s of its 3.5 s here):

    * Composer's ``HuggingFaceModel`` checks the model against every causal-LM class of
      transformers' auto mapping (``_is_registered_causal_lm``), which imports each of their
      modules lazily, hundreds of them;
    * the CPU model Composer's Trainer logs (upstream fix 20 keeps it: asked once here).
    """
    from composer.utils import collect_env
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    list(MODEL_FOR_CAUSAL_LM_MAPPING.values())
    collect_env.get_cpu_model()


#: what ``train.model.name`` is for a torchtitan Llama 3 built from the section's own sizes
TITAN_LLAMA = "torchtitan_llama3"
#: the model keys a torchtitan Llama 3 reads (Hugging Face's LlamaConfig names: the estimator
#: counts it with the same code as an ``hf_causal_lm`` Llama)
TITAN_MODEL_KEYS = (
    "name",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "intermediate_size",
    "vocab_size",
    "rope_theta",
)
#: hpc_llm's train keys a torchtitan run reads (LLM Foundry's names, one meaning in both)
TITAN_TRAIN_KEYS = (
    "seed",
    "max_seq_len",
    "global_train_batch_size",
    "device_train_microbatch_size",
    "device_eval_batch_size",
    "max_duration",
    "precision",
    "optimizer",
    "scheduler",
    "model",
    "algorithms",
)
#: train keys of hpc_llm's defaults that only LLM Foundry reads (logging and callbacks); a
#: torchtitan run leaves them aside (its own logging is torchtitan's)
FOUNDRY_ONLY_DEFAULTS = (
    "progress_bar",
    "python_log_level",
    "log_to_console",
    "console_log_interval",
    "callbacks",
    "eval_interval",
    "eval_first",
)


@dataclass
class TorchtitanOptions:
    # torchtitan's own config keys, by their dotted path in its Trainer.Config
    # (training.gc_freq: 10, compile.enable: true); checked before the queue in torchtitan's
    # environment: an unknown key is refused with the closest real one.
    overrides: dict[str, Any] = field(default_factory=dict)
    # torchtitan's asynchronous DCP save (checkpoint.async_mode=async): training goes on while
    # a save is written. false: the synchronous save.
    async_checkpoint: bool = True
    # The held-out loss at the end of training (torchtitan's Validator on data's eval split).
    heldout: bool = True
    # Batches per rank of that measure (the same on every rank, so none waits for a peer).
    heldout_batches: int = 4


class Torchtitan(Trainer):
    name = "torchtitan"
    description = "torchtitan 0.3 (torch 2.14) in an environment of its own: a Llama 3 from `train.model`"
    extra = "torchtitan"
    Options: ClassVar[type | None] = TorchtitanOptions
    warm_modules = (
        "torch",
        "torch.distributed",
        "torchtitan.tools.utils",
        "hpc_llm.job.rank.titan.compat",
        "torchtitan.trainer",
        "torchtitan.models.llama3",
        # what a rank's Trainer build reaches next: the data (Hugging Face datasets, ~1 s to
        # import here), the checkpointer
        "datasets",
        "torchtitan.hf_datasets.text_datasets",
        "torchtitan.components.checkpoint",
        "torchtitan.components.validate",
        "hpc_llm.job.rank.titan.run",
        "hpc_llm.job.rank.task",
        "hpc_llm.job.rank.fence",
    )
    check_module = "hpc_llm.job.rank.titan.check"

    def validate(self, section: DictConfig, plan: Any) -> None:
        self.options(section)

    def validate_job(self, cfg: DictConfig, plan: Any) -> None:
        """What a torchtitan run can be told, checked on the login node (its own keys are checked
        in its environment before the queue: :meth:`check_point`)."""
        train = cfg.train
        unknown = [k for k in train if k not in TITAN_TRAIN_KEYS and k not in FOUNDRY_ONLY_DEFAULTS]
        if unknown:
            raise ConfigError(
                f"train.{sorted(unknown)[0]}: not read by trainer=torchtitan; allowed under train: "
                f"{', '.join(TITAN_TRAIN_KEYS)} (torchtitan's own keys: trainer.options.overrides)"
            )
        model = train.get("model") or {}
        if model.get("name") != TITAN_LLAMA:
            raise ConfigError(
                f"train.model.name={model.get('name')}: trainer=torchtitan builds {TITAN_LLAMA} "
                f"(a Llama 3 from hidden_size, num_hidden_layers, ...: conf/model/llama3_tiny.yaml); "
                "or trainer=llmfoundry for LLM Foundry's models"
            )
        for key in model:
            if key not in TITAN_MODEL_KEYS:
                raise ConfigError(
                    f"train.model.{key}: not a key of {TITAN_LLAMA}; allowed: {', '.join(TITAN_MODEL_KEYS)}"
                )
        duration = str(train.get("max_duration", ""))
        if not duration.endswith("ba") or not duration[:-2].isdigit():
            raise ConfigError(
                f"train.max_duration={duration}: trainer=torchtitan counts steps; allowed: <N>ba, e.g. 40ba"
            )
        if cfg.data.get("remote"):
            raise ConfigError(
                f"data.remote={cfg.data.remote}: trainer=torchtitan reads the data source's local text files; "
                "allowed: data.remote=null"
            )
        location = str(cfg.checkpoint.get("location") or "")
        if cfg.checkpoint.name == "uri" and not location.startswith("s3://"):
            raise ConfigError(
                f"checkpoint.location={location}: trainer=torchtitan saves to an object store through "
                "fsspec with s3fs, which its environment has; allowed: s3://bucket/path, or checkpoint=folder"
            )
        if cfg.parallelism.name != "ddp" and plan.device == "cpu":
            raise ConfigError(
                f"parallelism={cfg.parallelism.name} with trainer=torchtitan on CPU: FSDP2's reduce-scatter "
                "averages with ReduceOp.PREMUL_SUM, which gloo lacks; allowed: parallelism=ddp on CPU, "
                f"{cfg.parallelism.name} with cluster.device=gpu"
            )

    def stack_config(self, cfg: DictConfig, job: Any, run_name: str) -> dict[str, Any]:
        from hpc_llm.config.titan_config import model_section, titan_config

        folder = str(job.checkpoint.train_config(cfg.checkpoint, job.plan)["save_folder"])
        flat = titan_config(cfg, job.plan, folder)
        return {"model": model_section(cfg), **{k: list(v) if isinstance(v, tuple) else v for k, v in flat.items()}}

    def check_point(self, cfg: DictConfig, plan: Any) -> dict[str, Any]:
        from hpc_llm.config.titan_config import overrides

        self.options(cfg.trainer)
        return {"overrides": overrides(cfg)}

    def warm(self) -> None:
        from hpc_llm.job.rank.titan import compat

        compat.apply()

    def train(self, cfg: DictConfig, job: Any, ctx: Any) -> Trained:
        from hpc_llm.job.rank.titan import run

        return run.train(cfg, job, ctx)


@hookimpl
def hpc_llm_register_trainers(register: Any) -> None:
    register(LlmFoundry())
    register(Torchtitan())
