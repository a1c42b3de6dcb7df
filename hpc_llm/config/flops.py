"""Model FLOPs, the same accounting as LLM Foundry's MPT (pure).

LLM Foundry's ``ComposerMPTCausalLM.flops_per_batch`` counts, per sequence,
``3 * (2 * n_params * T + n_layers * 2 * 2 * d_model * T**2)``: a MAC (2 FLOPs)
per parameter per token, the attention score/value products, times 3 for the
forward, backward and weight-gradient passes. Per token that is
``6 N + 12 L d T``; Composer's SpeedMonitor divides it by the GPUs' peak to
get MFU. ``mpt_params`` reproduces ``sum(p.numel())`` of an MPT from its
config (embeddings tied with the output, learned positions unless ALiBi,
biases unless ``no_bias``), e.g. 1,315,950,592 for LLM Foundry's mpt-1b.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: Peak dense bf16 FLOP/s per GPU (Composer's GPU_AVAILABLE_FLOPS).
PEAK_FLOPS = {
    "h100-sxm": 989e12,
    "h100-pcie": 756e12,
    "h200": 989e12,
    "a100": 312e12,
}


def mpt_params(model: Mapping[str, Any], max_seq_len: int | None = None) -> int:
    d = int(model["d_model"])
    layers = int(model["n_layers"])
    vocab = int(model["vocab_size"])
    e = float(model.get("expansion_ratio", 4))
    seq = int(max_seq_len or model["max_seq_len"])
    attn = model.get("attn_config") or {}
    no_bias = bool(model.get("no_bias", False))
    ffn = int(e * d)
    per_layer = 4 * d * d + 2 * ffn * d  # Wqkv + out_proj, up + down
    per_layer += 2 * d if no_bias else 2 * 2 * d + 3 * d + d + ffn + d  # norms (+ linear biases)
    learned_pos = bool(model.get("learned_pos_emb", True)) and not bool(attn.get("alibi", False))
    total = vocab * d + layers * per_layer + (d if no_bias else 2 * d)
    if learned_pos:
        total += seq * d
    return total


def flops_per_token(n_params: int, n_layers: int, d_model: int, seq_len: int) -> float:
    """Training FLOPs per token: 6 N + 12 L d T (forward + backward + weight grads)."""
    return 6.0 * n_params + 12.0 * n_layers * d_model * seq_len


def model_flops_per_token(train: Mapping[str, Any]) -> tuple[int, float]:
    """(n_params, FLOPs per token) of the MPT in an LLM Foundry train config."""
    model = train["model"]
    seq = int(train.get("max_seq_len") or model["max_seq_len"])
    n = mpt_params(model, seq)
    return n, flops_per_token(n, int(model["n_layers"]), int(model["d_model"]), seq)


def human_params(n: float) -> str:
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            value = n / scale
            return f"{value:.0f}{unit}" if value >= 10 else f"{value:.1f}{unit}"
    return str(int(n))
