"""Fixes for upstream bugs that a real multi-node cluster hits (in-job only).

Each patch names the upstream version it was written against and is applied
once, explicitly, by the task before training (never at import).

1. Composer 0.32 ``dist.get_node_signal_file_name()`` broadcasts rank 0's
   file name (``._signal_file_node0_<rand>``) to every rank, so when the file
   lands in a shared directory (save_folder on autoresume / checkpoint load)
   the local rank 0 of every node writes and deletes the *same* file:
   ``FileNotFoundError``. We keep the broadcast random part (all ranks must
   agree on it) and put the real node rank in the name (docs/design.md, hazard 1).
2. Composer 0.32 ``FSDP2Config.from_compatible_attrs`` drops
   ``data_parallel_shard_degree`` / ``data_parallel_replicate_degree`` with a
   warning, so HSDP under FSDP2 silently trains as FULL_SHARD. We return a
   subclass that carries the degrees, so Composer builds the 2-D
   (replicate, shard) device mesh and ``fully_shard`` does HSDP.
3. torch 2.7 FSDP2 averages gradients with ``ReduceOp.AVG`` for fp32/bf16,
   which Gloo does not implement; FULL_SHARD gets away with it but HSDP's
   replica all-reduce fails on CPU ("Cannot use ReduceOp.AVG with Gloo").
   On Gloo process groups only, we make FSDP2 sum and divide afterwards (the
   path torch itself takes for fp16). NCCL runs are untouched.
4. torch 2.7 ``torch.cpu.Stream.record_event()`` (a stub "to facilitate
   device-agnostic code") returns None, and FSDP2's HSDP path asserts that the
   all-reduce event is not None. CPU work is synchronous, so an always-complete
   ``torch.cpu.Event`` is the faithful answer. Affects CPU devices only.
5. Composer 0.32 cannot autoresume from a sharded (torch.distributed.checkpoint)
   checkpoint of an MPT model with a Hugging Face tokenizer: the checkpoint's
   ``state/integrations`` holds the tokenizer's files as they were when saved
   (``tokenizer.json`` with truncation/padding as training set them), the
   fresh trainer's as they are now, and DCP's strict load plan fails on the
   difference ("Missing key in checkpoint state_dict:
   state.integrations.huggingface.tokenizer.tokenizer.json.content.truncation").
   Autoresume also drops ``load_ignore_keys``. The integrations are metadata
   for exporting the model, not training state, so a sharded load leaves them
   out of the state it asks for (found by tests/test_faults.py, FSDP and HSDP).
6. Composer 0.32 autoresume asks every logger destination for the latest
   checkpoint before the loggers are initialised; ``WandBLogger.download_file``
   then raises ``RuntimeError("get_file_artifact can only be called after
   running init()")`` (only FileNotFoundError / NotImplementedError are
   caught), and otherwise calls ``wandb.Api()``, which needs the network. hpc_llm
   keeps checkpoints in its checkpoint backend, never in W&B (no
   ``log_artifacts``), so W&B answers "not here" (found by tests/test_trackers.py).
7. mosaicml-streaming 0.12 ``StreamingDataset.state_dict`` at an epoch
   boundary: Composer saves the end-of-epoch checkpoint after the epoch's
   iteration finished and before the next one starts, asking for the state
   at sample 0 of the epoch; Streaming answers with the epoch just *finished*
   (``next_epoch - 1``) at sample 0, so a run resumed from it replays that
   epoch's sample order and every later epoch is one behind the
   uninterrupted run (found by tests/test_faults.py: a preemption killed a
   run unsaved just after ``ep1-ba78``, and its final loss was 1.83 where the
   uninterrupted run reached 1.43). At sample 0 we name the epoch that comes
   next, which is what the uninterrupted run iterates.
"""

from __future__ import annotations

import random
import string
from dataclasses import dataclass, fields
from typing import Any

_APPLIED = False


def _patch_signal_file_name() -> None:
    from composer.utils import dist

    def get_node_signal_file_name(rng: random.Random | None = None) -> str:
        rng = rng or random.Random()
        token = ["".join(rng.choices(string.ascii_letters + string.digits, k=6))]
        dist.broadcast_object_list(token, src=0)
        return f"._signal_file_node{dist.get_node_rank()}_{token[0]}"

    dist.get_node_signal_file_name = get_node_signal_file_name


def _patch_fsdp2_hsdp() -> None:
    from composer.utils import parallelism

    base = parallelism.FSDP2Config
    if getattr(base, "_hpc_llm_hsdp", False):
        return

    @dataclass
    class HSDP2Config(base):  # type: ignore[misc, valid-type]
        hsdp_shard_degree: int = -1
        hsdp_replicate_degree: int | None = None

        @property
        def data_parallel_shard_degree(self) -> int:  # type: ignore[override]
            return self.hsdp_shard_degree

        @property
        def data_parallel_replicate_degree(self) -> int | None:  # type: ignore[override]
            return self.hsdp_replicate_degree

    original = base.from_compatible_attrs.__func__

    def from_compatible_attrs(cls: type, attrs: dict[str, Any]) -> Any:
        attrs = dict(attrs)
        shard = attrs.pop("data_parallel_shard_degree", None)
        replicate = attrs.pop("data_parallel_replicate_degree", None)
        cfg = original(cls, attrs)
        if replicate is None:
            return cfg
        kwargs = {f.name: getattr(cfg, f.name) for f in fields(cfg) if f.init}
        return HSDP2Config(**kwargs, hsdp_shard_degree=shard or -1, hsdp_replicate_degree=replicate)

    base.from_compatible_attrs = classmethod(from_compatible_attrs)
    base._hpc_llm_hsdp = True


def _patch_fsdp2_gloo_average() -> None:
    import torch.distributed as tdist
    from torch.distributed.fsdp._fully_shard import _fsdp_collectives as coll

    original = coll._get_gradient_divide_factors
    if getattr(original, "_hpc_llm", False):
        return

    def divide_factors(reduce_scatter_group, all_reduce_group, reduce_dtype, device_type=""):  # type: ignore[no-untyped-def]
        if tdist.get_backend(reduce_scatter_group) == "gloo":
            n = reduce_scatter_group.size() * (all_reduce_group.size() if all_reduce_group else 1)
            # predivide 1.0 (a no-op) selects ReduceOp.SUM; postdivide by n averages.
            return 1.0, float(n)
        return original(reduce_scatter_group, all_reduce_group, reduce_dtype, device_type)

    divide_factors._hpc_llm = True  # type: ignore[attr-defined]
    coll._get_gradient_divide_factors = divide_factors

    import torch

    if torch.cpu.Stream().record_event() is None:
        torch.cpu.Stream.record_event = lambda self: torch.cpu.Event()  # type: ignore[method-assign]


def _patch_sharded_load_integrations() -> None:
    from composer.utils import checkpoint

    original = checkpoint.load_sharded_checkpoint
    if getattr(original, "_hpc_llm", False):
        return

    def load_sharded_checkpoint(*args: Any, **kwargs: Any) -> Any:
        user = kwargs.get("ignore_keys")
        user_filter = checkpoint.glob_filter(user) if isinstance(user, list) else user

        def ignore(state_dict: dict) -> None:
            state_dict.get("state", {}).pop("integrations", None)
            if user_filter is not None:
                user_filter(state_dict)

        kwargs["ignore_keys"] = ignore
        return original(*args, **kwargs)

    load_sharded_checkpoint._hpc_llm = True  # type: ignore[attr-defined]
    checkpoint.load_sharded_checkpoint = load_sharded_checkpoint


def _patch_wandb_download() -> None:
    from composer.loggers import wandb_logger

    cls = wandb_logger.WandBLogger
    if getattr(cls.download_file, "_hpc_llm", False):
        return

    def download_file(self: Any, remote_file_name: str, *args: Any, **kwargs: Any) -> None:
        raise FileNotFoundError(f"{remote_file_name}: hpc_llm keeps checkpoints in its checkpoint backend, not W&B")

    download_file._hpc_llm = True  # type: ignore[attr-defined]
    cls.download_file = download_file  # type: ignore[method-assign]


def _patch_streaming_epoch_boundary() -> None:
    from streaming.base.dataset import StreamingDataset

    original = StreamingDataset.state_dict
    if getattr(original, "_hpc_llm", False):
        return

    def state_dict(self: Any, num_samples: int, from_beginning: bool) -> dict[str, Any]:
        state = original(self, num_samples, from_beginning)
        # next_epoch is set when an epoch's iteration starts: past the reported epoch means
        # that epoch is done, and sample 0 is the start of the next one
        if from_beginning and num_samples == 0 and self.next_epoch > state["epoch"]:
            state = dict(state, epoch=self.next_epoch)
        return state

    state_dict._hpc_llm = True  # type: ignore[attr-defined]
    StreamingDataset.state_dict = state_dict  # type: ignore[method-assign]


def apply() -> None:
    global _APPLIED
    if _APPLIED:
        return
    _patch_signal_file_name()
    _patch_fsdp2_hsdp()
    _patch_fsdp2_gloo_average()
    _patch_sharded_load_integrations()
    _patch_wandb_download()
    _patch_streaming_epoch_boundary()
    _APPLIED = True
