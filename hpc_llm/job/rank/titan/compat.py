"""What torchtitan 0.3.0 on torch 2.14 needs to train on CPU, and to load checkpoints that cannot
run code (docs/upstream-fixes.md, upstream fixes 23 to 25 and 27; in-job only).

Applied once per process (a node's agent does it in its warm start, so its ranks find it done).
torchtitan's modules take ``device_type`` and ``device_module`` by name from
``torchtitan.tools.utils`` when they are imported: those already imported are changed too.
"""

from __future__ import annotations

import os
import sys
import types
from typing import Any

_APPLIED = False


def on_cpu() -> bool:
    """The ranks train on the CPU: no GPU here, or the run says so (``HPC_LLM_DEVICE=cpu``, set
    by the rank from ``cluster.device``)."""
    import torch

    return os.environ.get("HPC_LLM_DEVICE") == "cpu" or not torch.cuda.is_available()


def _patch_cpu_device() -> None:
    """Upstream fix 23: torchtitan defaults its device to CUDA where it finds no accelerator
    (``get_device_info``: ``_get_available_device_type() or "cuda"``), and its memory monitor
    asks the device module for a name, properties and memory statistics, which ``torch.cpu``
    lacks. On CPU: device ``cpu`` and a module answering those questions (the machine's memory
    as capacity, no statistics)."""
    import torch
    from torchtitan.tools import utils

    def properties(device: Any = None) -> Any:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        return types.SimpleNamespace(total_memory=memory, name="cpu")

    cpu = types.SimpleNamespace(
        get_device_name=lambda device=None: "cpu",
        current_device=lambda: 0,
        get_device_properties=properties,
        reset_peak_memory_stats=lambda *a: None,
        empty_cache=lambda: None,
        memory_stats=lambda *a: {},
        device_count=lambda: 1,
        set_device=lambda device: None,
        synchronize=lambda *a: None,
        is_available=lambda: True,
    )

    def local_device() -> Any:
        return torch.device("cpu")

    was = {"device_type": utils.device_type, "device_module": utils.device_module, "get_local_device": None}
    now = {"device_type": "cpu", "device_module": cpu, "get_local_device": local_device}
    was["get_local_device"] = utils.get_local_device
    # the modules of torchtitan imported before this (a warm agent imports them first) took the
    # names from utils: each gets the CPU's
    for name, module in list(sys.modules.items()):
        if module is None or not (name == "torchtitan" or name.startswith("torchtitan.")):
            continue
        for attr, old in was.items():
            if module.__dict__.get(attr) is old:
                setattr(module, attr, now[attr])


def _patch_cpu_attention() -> None:
    """Upstream fix 24: FlexAttention has no backward on CPU ("FlexAttention does not support
    backward on CPU"), and torchtitan 0.3 refuses SDPA for language models (it cannot take the
    per-document mask). On CPU the same block-causal mask, made dense from the BlockMask's own
    ``mask_mod``, goes to SDPA. The parameter names stay torchtitan's: its local-map wrapper
    reads them."""
    import torch.nn.functional as F
    from torch.nn.attention.flex_attention import create_mask
    from torchtitan.models.common import attention

    def forward(
        self: Any,
        q_BLNH: Any,
        k_BLNH: Any,
        v_BLNH: Any,
        *,
        attention_masks: Any,
        score_mod: Any = None,
        scale: float | None = None,
        enable_gqa: bool = False,
        out_transform: Any = None,
        **kwargs: Any,
    ) -> Any:
        if score_mod is not None or out_transform is not None:
            raise NotImplementedError("hpc_llm's CPU attention takes neither score_mod nor out_transform")
        b, q_len, kv_len = q_BLNH.shape[0], q_BLNH.shape[1], k_BLNH.shape[1]
        mask = create_mask(attention_masks.mask_mod, b, 1, q_len, kv_len, device=q_BLNH.device)
        out = F.scaled_dot_product_attention(
            q_BLNH.transpose(1, 2),
            k_BLNH.transpose(1, 2),
            v_BLNH.transpose(1, 2),
            attn_mask=mask,
            scale=scale,
            enable_gqa=enable_gqa,
        )
        return out.transpose(1, 2)

    attention.FlexAttention.forward = forward


def _patch_safe_dcp_loads() -> None:
    """Upstream fix 25 (fix 22 for torch 2.14): DCP still reads ``.metadata`` with
    ``pickle.load`` and every non-tensor entry (torchtitan's train state, its dataloader's
    state) with ``torch.load(weights_only=False)``. Both go through
    :mod:`hpc_llm.job.rank.safe_load`; the bodies around them are torch 2.14's own."""
    from hpc_llm.job.rank import safe_load

    # torch 2.14's reader asks for the path of a rank's own metadata, where it has one
    safe_load.patch_dcp_reads(lambda reader, kwargs: reader._get_metadata_path(kwargs.get("rank")))


def _patch_safe_dataloader_state() -> None:
    """Upstream fix 27: torchtitan 0.3 pickles its dataloader's state into the checkpoint and, at
    a resume, unpickles those bytes with ``pickle.loads`` (``ParallelAwareDataloader.load_state_dict``);
    DCP hands them through intact. They are unpickled with nothing but containers, numbers and
    strings allowed (:func:`hpc_llm.job.rank.safe_load.dataloader_state`); the rest of the
    method is torchtitan's own, its warning and check included."""
    from torchdata.stateful_dataloader import StatefulDataLoader
    from torchtitan.components.dataloader import ParallelAwareDataloader
    from torchtitan.tools.logging import logger

    from hpc_llm.job.rank import safe_load

    def load_state_dict(self: Any, state_dict: dict[str, Any]) -> None:
        if not state_dict:  # state being empty is valid
            return
        if self._rank_id not in state_dict:
            logger.warning(f"DataLoader state is empty for dp rank {self.dp_rank}, expected key {self._rank_id}")
            return
        assert self.dp_world_size == state_dict["world_size"], (
            "dp_degree is inconsistent before and after checkpoint, dataloader resharding is not supported yet."
        )
        where = safe_load.reading(f"dataloader.{self._rank_id}")
        StatefulDataLoader.load_state_dict(self, safe_load.dataloader_state(state_dict[self._rank_id], where))

    ParallelAwareDataloader.load_state_dict = load_state_dict


def apply() -> None:
    global _APPLIED
    if _APPLIED:
        return
    if on_cpu():
        _patch_cpu_device()
        _patch_cpu_attention()
    _patch_safe_dcp_loads()
    _patch_safe_dataloader_state()
    _APPLIED = True
