"""One rank of a torchtitan run (``trainer=torchtitan``; in-job only, torchtitan's environment).

torchtitan's own ``Trainer`` trains; hpc_llm subclasses it only to keep the trainer contract
(docs/reference/trainers.md) at its two seams, the end of each step and its checkpoint save:

* every step: the fence, the heartbeat's batch, the loss into the run's record and progress
  file, and one all-reduce of "a stop was asked" (the Slurm signal reached some rank);
* a stop: a full synchronous save at that step (torchtitan's ``last_step`` save, after any
  async save in flight), every rank waits, then :class:`~hpc_llm.job.rank.preemption.Preempted`;
* every save: the fence first (a rank of an ended generation writes nothing).

Resuming is torchtitan's: ``checkpointer.load()`` takes the newest complete ``step-N`` in the
run's checkpoint folder (model, optimizer, LR schedule, train state and the dataloader's
position), so a resumed run sees the batches the uninterrupted one would.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from hpc_llm.config import titan_config
from hpc_llm.job import heartbeat
from hpc_llm.job.rank import preemption
from hpc_llm.job.rank.context import JobContext
from hpc_llm.job.rank.measure import kept_figures, peak_memory_bytes, placement, progress_figures
from hpc_llm.job.rank.step_duties import StepDuties
from hpc_llm.paths import size_bytes
from hpc_llm.plugins.base import Trained

log = logging.getLogger(__name__)

#: the names the run's splits get in torchtitan's dataset table
TRAIN_SET, EVAL_SET = "hpc_llm_train", "hpc_llm_eval"


def checkpoint_folder(cfg: DictConfig, job: Any) -> str:
    """The folder backend's folder (``checkpoint.location``, else ``<run dir>/checkpoints``)."""
    return str(job.checkpoint.train_config(cfg.checkpoint, job.plan)["save_folder"])


def train(cfg: DictConfig, job: Any, ctx: JobContext) -> TitanTrained:
    from hpc_llm.job.rank.titan import compat

    compat.apply()
    heartbeat.phase("data")
    data = job.data.text_data(cfg.data, ctx)
    folder = checkpoint_folder(cfg, job)
    if ctx.dist.rank == 0 and folder.startswith("s3://"):
        from hpc_llm.job.rank import store_check

        # a store that is down is waited for, a wrong key or a missing bucket is one line,
        # before torchtitan's first listing of the folder fails on it
        store_check.wait_for_store("checkpoint.location", folder)
    flat = titan_config.titan_config(cfg, job.plan, folder)
    model = titan_config.model_section(cfg)
    _register_datasets(data)
    options = titan_config.trainer_options(cfg)
    heldout = bool(options.get("heldout", True))
    config = build_config(flat, model, data, heldout=heldout, heldout_batches=int(options.get("heldout_batches", 4)))
    config.dump_folder = str(ctx.node_dir)
    heartbeat.phase("build")
    from torchtitan.tools.logging import init_logger

    init_logger()
    trainer = _trainer_class()(config, ctx)
    t0 = time.time()
    try:
        trainer.train()
    except preemption.Preempted as stop:
        stop.checkpoint = saved_at(trainer.checkpointer.folder, stop.batch)
        raise
    if trainer.duties.first_step is None:
        # an attempt that resumed at the last step (a stop after the run's last save, in the
        # held-out measure or on the way out): torchtitan's loop ran no step, and no measure
        trainer.duties.started(trainer.step)
        if heldout and getattr(trainer, "validator", None) is not None:
            trainer.validator.validate(trainer.model_parts, trainer.step)
    train_s = time.time() - t0
    trained = TitanTrained(trainer, train_s)
    trainer.duties.ended(trainer.step)
    if ctx.record is not None:
        ctx.record.trained(kept_figures(ctx, tokens=trained.tokens, train_s=train_s))
    return trained


def saved_at(folder: str, step: int) -> str:
    """Where torchtitan saved ``step`` (a folder, or an s3:// prefix)."""
    from torchtitan.tools import filesystem

    return str(filesystem.join(folder, f"step-{step}"))


def saved_bytes(path: str) -> int | None:
    """The bytes of one save (a folder's files, or an object-store prefix's objects)."""
    from torchtitan.tools import filesystem

    if not filesystem.is_remote(path):
        return size_bytes(Path(path)) or None
    from fsspec.core import url_to_fs

    fs, where = url_to_fs(path)
    return int(fs.du(where)) or None


def _register_datasets(data: Any) -> None:
    """The data source's JSON-lines splits as torchtitan datasets (its table is a module dict)."""
    from datasets import load_dataset
    from torchtitan.hf_datasets import DatasetConfig, text_datasets

    def loader(path: str) -> Any:
        # datasets' Arrow cache beside the files (hpc_llm's cache), not in the user's ~/.cache
        return load_dataset("json", data_files=path, split="train", cache_dir=str(Path(path).parent / ".hf_datasets"))

    for name, path in ((TRAIN_SET, data.train), (EVAL_SET, data.eval)):
        text_datasets.DATASETS[name] = DatasetConfig(path=path, loader=loader, sample_processor=lambda s: s["text"])


def build_config(flat: dict[str, Any], model: dict[str, Any], data: Any, heldout: bool, heldout_batches: int) -> Any:
    """torchtitan's ``Trainer.Config`` for this run: a Llama 3 of ``model``'s sizes, the data
    source's text, and every dotted key of ``flat`` set where it points."""
    from torchtitan.components.loss import ChunkedLossWrapper, CrossEntropyLoss
    from torchtitan.components.optimizer import default_adamw
    from torchtitan.hf_datasets.text_datasets import HuggingFaceTextDataLoader
    from torchtitan.trainer import Trainer

    config = Trainer.Config(
        loss=ChunkedLossWrapper.Config(loss_fn=CrossEntropyLoss.Config(global_vocab_size=int(model["vocab_size"]))),
        hf_assets_path=data.tokenizer,
        model_spec=model_spec(model),
        dataloader=HuggingFaceTextDataLoader.Config(dataset=TRAIN_SET),
    )
    adamw = dict(flat.pop(titan_config.ADAMW))
    config.optimizer = default_adamw(**{**adamw, "betas": tuple(adamw["betas"])})
    config.validator.enable = heldout
    config.validator.dataloader = HuggingFaceTextDataLoader.Config(dataset=EVAL_SET, infinite=False)
    config.validator.freq = int(flat["training.steps"])
    # a fixed count: with -1 (the whole split) the ranks' shares differ and one waits in a
    # collective for a peer that ran out ("might cause hangs", torchtitan warns)
    config.validator.steps = heldout_batches
    for key, value in flat.items():
        set_dotted(config, key, value)
    return config


def set_dotted(config: Any, key: str, value: Any) -> None:
    """``config.a.b = value`` for ``key`` ``a.b``; an unknown key: one line with the closest."""
    *path, last = key.split(".")
    node = config
    for i, part in enumerate(path):
        node = getattr(node, part, None) if part in field_names(node) else None
        if node is None:
            raise KeyError(unknown_key(config, ".".join(path[: i + 1])))
    if last not in field_names(node):
        raise KeyError(unknown_key(config, key))
    current = getattr(node, last)
    if isinstance(current, tuple) and isinstance(value, list):
        value = tuple(value)
    setattr(node, last, value)


def field_names(node: Any) -> list[str]:
    return [f.name for f in dataclasses.fields(node)] if dataclasses.is_dataclass(node) else []


def every_key(node: Any, prefix: str = "") -> list[str]:
    out: list[str] = []
    for name in field_names(node):
        if name.startswith("_"):
            continue
        value = getattr(node, name)
        key = f"{prefix}{name}"
        out.append(key)
        if dataclasses.is_dataclass(value):
            out += every_key(value, f"{key}.")
    return out


def unknown_key(config: Any, key: str) -> str:
    import difflib

    known = every_key(config)
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]}?" if close else ""
    return f"trainer.options.overrides.{key}: not a key of torchtitan's Trainer.Config{hint}"


def model_spec(model: dict[str, Any]) -> Any:
    """torchtitan's Llama 3 spec with ``model``'s sizes (torchtitan's own builders and inits)."""
    from torchtitan.models import llama3
    from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm

    dim, heads, vocab = int(model["hidden_size"]), int(model["num_attention_heads"]), int(model["vocab_size"])
    kv = model.get("num_key_value_heads")
    config = llama3.Llama3Model.Config(
        dim=dim,
        vocab_size=vocab,
        tok_embeddings=Embedding.Config(num_embeddings=vocab, embedding_dim=dim, param_init=llama3._EMBEDDING_INIT),
        norm=RMSNorm.Config(normalized_shape=dim, param_init=llama3._NORM_INIT),
        lm_head=Linear.Config(in_features=dim, out_features=vocab, param_init=llama3._output_linear_init(dim)),
        layers=llama3._build_llama3_layers(
            n_layers=int(model["num_hidden_layers"]),
            dim=dim,
            n_heads=heads,
            n_kv_heads=int(kv) if kv else None,
            hidden_dim=int(model["intermediate_size"]),
            rope=ComplexRoPE.Config(
                dim=dim // heads, max_seq_len=131072, theta=float(model.get("rope_theta", 500000)), scaling="llama"
            ),
            attn_backend="flex",
        ),
    )
    base = llama3.model_registry("debugmodel")
    return dataclasses.replace(base, flavor="hpc_llm", model=config)


_CLASS: Any = None


def _trainer_class() -> Any:
    """torchtitan's Trainer with hpc_llm's two seams (made once: torchtitan is imported here)."""
    global _CLASS
    if _CLASS is not None:
        return _CLASS
    import torch
    import torch.distributed as tdist
    from torchtitan.trainer import Trainer

    class HpcLlmTrainer(Trainer):
        def __init__(self, config: Any, ctx: JobContext) -> None:
            self.hpc_ctx = ctx
            super().__init__(config)
            tokens = int(config.training.global_batch_size) * int(config.training.seq_len)
            # MFU as torchtitan computes it (its FLOPs per token, its table of peak bf16 FLOPs by
            # device name); on a CPU there is no peak to measure against
            on_gpu = self.device.type == "cuda"
            self.duties = StepDuties(
                ctx,
                int(config.training.steps),
                tokens,
                flops_per_token=float(self.metrics_processor.num_flops_per_token) if on_gpu else None,
                peak_flops=float(self.metrics_processor.gpu_peak_flops) if on_gpu else None,
            )
            self.heldout_loss: float | None = None
            save, log_metrics = self.checkpointer.save, self.metrics_processor.log
            log_validation = self.metrics_processor.log_validation

            def fenced_save(curr_step: int, last_step: bool = False) -> bool:
                self.duties.before_save()
                saved = bool(save(curr_step, last_step=last_step))
                if saved:
                    self.duties.saved(curr_step)
                return saved

            def logged(step: int, loss: float, *args: Any, **kwargs: Any) -> Any:
                self.duties.loss(step, loss)
                return log_metrics(step, loss, *args, **kwargs)

            def validated(loss: Any, step: int) -> Any:
                self.heldout_loss = float(loss)
                return log_validation(loss=loss, step=step)

            if getattr(self, "validator", None) is not None:
                # the held-out loss once, at the last step (torchtitan also measures at step 1)
                last = int(config.training.steps)
                self.validator.should_validate = lambda step: step == last
            self.checkpointer.save = fenced_save
            self.metrics_processor.log = logged
            self.metrics_processor.log_validation = validated

        def train_step(self, data_iterator: Any) -> None:
            if self.duties.first_step is None:  # the checkpoint, if any, is loaded by now
                self.duties.started(self.step - 1)
            super().train_step(data_iterator)

        def should_continue_training(self) -> bool:
            # asked after each step's save (and validation) and before the first step
            first = self.duties.first_step
            if first is not None and self.step > first:
                self.duties.step_ended(
                    self.step, self._stop_save, self._start_reduce, self.checkpointer.maybe_wait_for_saving
                )
            return bool(super().should_continue_training())

        def _stop_save(self, step: int) -> None:
            # torchtitan's last-step save: full state (last_save_model_only=false), synchronous,
            # after any async save in flight
            self.checkpointer.save(step, last_step=True)

        def _start_reduce(self, value: int) -> Any:
            flag = torch.tensor([value], dtype=torch.int64, device=self.device)
            if not tdist.is_initialized():
                return lambda: value
            work = tdist.all_reduce(flag, op=tdist.ReduceOp.MAX, async_op=True)

            def result() -> int:
                work.wait()
                return int(flag.item())

            return result

        @property
        def tokens_per_step(self) -> int:
            return self.duties.tokens_per_step

    _CLASS = HpcLlmTrainer
    return _CLASS


class TitanTrained(Trained):
    """torchtitan's Trainer after ``train``."""

    def __init__(self, trainer: Any, train_s: float) -> None:
        self.handle = trainer
        self.batch = int(trainer.step)
        self.train_s = train_s
        self.tokens = trainer.duties.trained_tokens(trainer.step) if trainer.duties.first_step is not None else 0

    def figures(self, ctx: JobContext, job_s: float) -> dict[str, Any]:
        """Throughput, loss and memory (a collective: every rank gathers placement and memory)."""
        import torch.distributed as tdist

        out = progress_figures(ctx)
        trainer = self.handle
        out.update(
            batches_done=self.batch,
            tokens_done=int(self.batch * trainer.tokens_per_step),
            train_s=round(self.train_s, 3),
            wallclock_s=round(job_s, 3),
            tokens_per_sec=ctx.metrics.get("throughput/tokens_per_sec")
            or (self.tokens / self.train_s if self.tokens and self.train_s else None),
            mfu=ctx.metrics.get("throughput/device/mfu"),
        )
        if ctx.loss_history:
            out["train_loss_first"] = ctx.loss_history[0][1]
        if trainer.heldout_loss is not None:
            out["eval"] = {"loss": trainer.heldout_loss}  # the heldout evaluator's key
        duties = trainer.duties
        if duties.saved_step is not None or duties.first_step:
            step = duties.saved_step if duties.saved_step is not None else duties.first_step
            out["checkpoint"] = saved_at(trainer.checkpointer.folder, step)
            out["checkpoint_bytes"] = saved_bytes(out["checkpoint"])
        mine = {**placement(ctx), "peak_memory_bytes": peak_memory_bytes()}
        per_rank = [mine]
        if tdist.is_initialized() and tdist.get_world_size() > 1:
            gathered: list[Any] = [None] * tdist.get_world_size()
            tdist.all_gather_object(gathered, mine)
            per_rank = gathered
        out["ranks"] = per_rank
        out["peak_memory_bytes_per_rank"] = [r["peak_memory_bytes"] for r in per_rank]
        out["peak_memory_bytes"] = max(out["peak_memory_bytes_per_rank"])
        return out

    def close(self) -> None:
        self.handle.close()
