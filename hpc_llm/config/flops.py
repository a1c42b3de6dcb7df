"""Model size and FLOPs of an LLM Foundry ``model:`` section, the same accounting as LLM Foundry's (pure).

LLM Foundry 0.22 counts FLOPs for its own MPT only: ``ComposerMPTCausalLM.flops_per_batch``
is, per sequence, ``3 * (2 * n_active_params * T + n_layers * 2 * 2 * d_model * T**2)``: a MAC
(2 FLOPs) per parameter per token plus the attention score/value products, times 3 for the
forward, backward and weight-gradient passes. Per token that is ``6 N + 12 L d T``, where N is
``n_active_params``: every parameter (``sum(p.numel())``, learned positions included), less the
input embedding when it is not tied to the output (a lookup, not a matmul). ``hf_causal_lm``
models (``ComposerHFCausalLM``) have no ``flops_per_batch`` there, so Composer logs no MFU for
them; hpc_llm applies the same rule to them, so that an MPT counts the same whether it is built
as ``mpt_causal_lm`` or loaded as ``hf_causal_lm``, and d is the residual width (``d_model``,
``hidden_size``) as in LLM Foundry's attention term.

The parameter count itself (``ModelSize.n_params``) is ``sum(p.numel())`` of the model LLM
Foundry or transformers builds from the config: tests/test_flops.py builds them and compares.
Sizes come from the ``model:`` section (``mpt_causal_lm``); from the ``config.json`` of a local
``pretrained_model_name_or_path`` with the section's ``config_overrides`` applied over it
(``hf_causal_lm``: MPT and the Llama family); for a hub id that cannot be read offline, from
the MPT preset it was released as (``HUB_MODELS``); else from the ``--params`` the user gives.
Nothing here imports transformers or torch: config.json is read as JSON.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpc_llm.errors import ConfigError

#: Peak dense bf16 FLOP/s per GPU (Composer's GPU_AVAILABLE_FLOPS).
PEAK_FLOPS = {
    "h100-sxm": 989e12,
    "h100-pcie": 756e12,
    "h200": 989e12,
    "a100": 312e12,
}

#: MPTConfig's defaults (llmfoundry/models/mpt/configuration_mpt.py) for what a section leaves out.
MPT_DEFAULTS: dict[str, Any] = {
    "d_model": 2048,
    "n_heads": 16,
    "n_layers": 24,
    "expansion_ratio": 4,
    "max_seq_len": 2048,
    "vocab_size": 50368,
    "learned_pos_emb": True,
    "no_bias": False,
    "norm_type": "low_precision_layernorm",
    "tie_word_embeddings": True,
}
#: LLM Foundry's own FFNs; the MoE ones (torch_dmoe, mb_moe, mb_dmoe) activate a subset of
#: their experts per token, which the 6N rule does not describe.
MPT_FFNS = ("mptmlp", "mptglu")

#: Hub ids that hpc_llm's presets load (conf/model/*_hf.yaml) -> the MPT preset
#: (conf/model/<preset>.yaml) the model was released as, and where the released config.json
#: differs from the preset (LLM Foundry's pretraining yaml): the vocabulary is padded to 50432,
#: the weights have no biases, and ALiBi replaces learned positions ("vocab_size": 50432,
#: "no_bias": true, "attn_config": {"alibi": true}). Layers, width and heads are the preset's.
HUB_MODELS: dict[str, tuple[str, dict[str, Any]]] = {
    "mosaicml/mpt-7b": ("mpt-7b", {"vocab_size": 50432, "no_bias": True, "attn_config": {"alibi": True}}),
    "mosaicml/mpt-30b": ("mpt-30b", {"vocab_size": 50432, "no_bias": True, "attn_config": {"alibi": True}}),
}

#: transformers' class defaults for the keys a hand-written config.json may leave out
#: (save_pretrained writes them all); None: num_key_value_heads = num_attention_heads,
#: head_dim = hidden_size // num_attention_heads.
HF_DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": {"num_key_value_heads": None, "head_dim": None},
    "mistral": {"num_key_value_heads": 8, "head_dim": None},
    "qwen2": {"num_key_value_heads": 32, "head_dim": None},
    "qwen3": {"num_key_value_heads": 32, "head_dim": 128},
}
HF_FAMILIES = {"llama": "Llama", "mistral": "Mistral", "qwen2": "Qwen2", "qwen3": "Qwen3", "mpt": "MPT"}


@dataclass(frozen=True)
class ModelSize:
    """What the estimator, MFU and the checkpoint plan need to know of a model."""

    #: sum(p.numel()) of the model built from the config
    n_params: int
    #: the parameters LLM Foundry's FLOPs count (n_active_params)
    n_flop_params: int
    #: layers and residual width for the attention term; None when only --params is known
    n_layers: int | None
    d_model: int | None
    #: MPT, Llama, ...; or the hub id when only --params is known
    family: str
    #: where the numbers came from
    source: str

    @property
    def label(self) -> str:
        size = human_params(self.n_params)
        return f"{self.family}-{size}" if self.family in HF_FAMILIES.values() else f"{self.family} ({size})"

    def flops_per_token(self, seq_len: int) -> float:
        if self.n_layers is None or self.d_model is None:
            return 6.0 * self.n_flop_params
        return flops_per_token(self.n_flop_params, self.n_layers, self.d_model, seq_len)

    @property
    def formula(self) -> str:
        if self.n_layers is None:
            return "6N; no attention term without the model's config.json"
        return "6N + 12 L d T"


def _merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """``over`` on ``base``, nested mappings key by key (as LLM Foundry's set_config_overrides)."""
    out = dict(base)
    for k, v in over.items():
        out[k] = {**out[k], **v} if isinstance(out.get(k), Mapping) and isinstance(v, Mapping) else v
    return out


def _norm_params(norm_type: str, size: int, bias: bool) -> int:
    return size if "rms" in norm_type.lower() else size + (size if bias else 0)


def mpt_counts(model: Mapping[str, Any], max_seq_len: int | None = None) -> tuple[int, int]:
    """(sum(p.numel()), n_active_params) of the MPT LLM Foundry builds from ``model``.

    ``max_seq_len`` stands in for a section without one (learned positions are sized by it)."""
    cfg = {**MPT_DEFAULTS, **{k: v for k, v in model.items() if v is not None}}
    if "max_seq_len" not in model and max_seq_len:
        cfg["max_seq_len"] = max_seq_len
    if cfg.get("block_overrides"):
        raise ConfigError("model.block_overrides: LLM Foundry counts no FLOPs for such an MPT; give --params N")
    attn = dict(cfg.get("attn_config") or {})
    ffn = dict(cfg.get("ffn_config") or {})
    ffn_type = ffn.get("ffn_type", "mptmlp")
    if ffn_type not in MPT_FFNS:
        raise ConfigError(
            f"model.ffn_config.ffn_type={ffn_type}: hpc_llm counts {', '.join(MPT_FFNS)}; give --params N"
        )
    d, layers, vocab = int(cfg["d_model"]), int(cfg["n_layers"]), int(cfg["vocab_size"])
    heads = int(cfg["n_heads"])
    head_dim = int(cfg.get("head_dim") or d // heads)
    kv_heads = {"multihead_attention": heads, "multiquery_attention": 1}.get(
        attn.get("attn_type", "multihead_attention"), attn.get("kv_n_heads")
    )
    if kv_heads is None:
        raise ConfigError("model.attn_config.kv_n_heads is not set (attn_type grouped_query_attention needs it)")
    kv_heads = int(kv_heads)
    no_bias = bool(cfg["no_bias"])
    bias = not no_bias
    attention_bias = bias if cfg.get("attention_bias") is None else bool(cfg["attention_bias"])
    ffn_size = int(ffn.get("ffn_hidden_size") or int(d * float(cfg["expansion_ratio"])))
    q, kv = heads * head_dim, kv_heads * head_dim
    # Wqkv (attention_bias) and out_proj (bias), as LLM Foundry's GroupedQueryAttention
    per_layer = d * (q + 2 * kv) + (q + 2 * kv if attention_bias else 0) + q * d + (d if bias else 0)
    if attn.get("qk_ln") or attn.get("qk_gn"):
        # the attention's own norms take its norm_type, not the block's; no_bias strips norm biases
        qk_norm = str(attn.get("norm_type", "low_precision_layernorm"))
        q_size, k_size = (head_dim, head_dim) if attn.get("qk_gn") else (q, kv)
        per_layer += _norm_params(qk_norm, q_size, bias) + _norm_params(qk_norm, k_size, bias)
    matrices = 3 if ffn_type == "mptglu" else 2
    per_layer += matrices * d * ffn_size + ((matrices - 1) * ffn_size + d if bias else 0)
    norm = str(cfg["norm_type"])
    per_layer += 2 * _norm_params(norm, d, bias)  # norm_1, norm_2
    total = vocab * d + layers * per_layer + _norm_params(norm, d, bias)  # wte, blocks, norm_f
    # MPTConfig turns learned positions off under ALiBi or RoPE
    if bool(cfg["learned_pos_emb"]) and not attn.get("alibi") and not attn.get("rope"):
        total += int(cfg["max_seq_len"]) * d
    tied = bool(cfg["tie_word_embeddings"])
    if not tied:
        total += vocab * d  # lm_head, no bias
    return total, total - (0 if tied else vocab * d)


def mpt_params(model: Mapping[str, Any], max_seq_len: int | None = None) -> int:
    """``sum(p.numel())`` of the MPT LLM Foundry builds from ``model``, e.g. 1,315,950,592 for mpt-1b."""
    return mpt_counts(model, max_seq_len)[0]


def llama_counts(config: Mapping[str, Any], where: str) -> tuple[int, int]:
    """(sum(p.numel()), n_active_params) of a Llama-family ``*ForCausalLM`` built from ``config``."""
    model_type = str(config.get("model_type"))
    cfg = {**HF_DEFAULTS[model_type], "tie_word_embeddings": False, "attention_bias": False, "mlp_bias": False}
    cfg.update(config)
    try:
        d, layers = int(cfg["hidden_size"]), int(cfg["num_hidden_layers"])
        heads, vocab, inter = int(cfg["num_attention_heads"]), int(cfg["vocab_size"]), int(cfg["intermediate_size"])
    except KeyError as exc:
        raise ConfigError(f"{where} has no {exc.args[0]} (model_type {model_type})") from None
    kv_heads = int(cfg["num_key_value_heads"] or heads)
    head_dim = int(cfg["head_dim"] or d // heads)
    q, kv = heads * head_dim, kv_heads * head_dim
    # which projections carry a bias differs by family (transformers' modeling_<type>.py)
    if model_type == "qwen2":  # q, k, v always; o never
        attn_bias = q + 2 * kv
    elif model_type in ("llama", "qwen3") and cfg["attention_bias"]:  # q, k, v and o
        attn_bias = q + 2 * kv + d
    else:  # mistral: none
        attn_bias = 0
    mlp_bias = model_type == "llama" and bool(cfg["mlp_bias"])
    per_layer = d * (q + 2 * kv) + q * d + attn_bias
    per_layer += 3 * d * inter + (2 * inter + d if mlp_bias else 0)  # gate, up, down
    per_layer += 2 * d  # input / post-attention RMSNorm weights
    if model_type == "qwen3":
        per_layer += 2 * head_dim  # q_norm, k_norm over the head dimension
    total = vocab * d + layers * per_layer + d  # embed_tokens, layers, final norm
    tied = bool(cfg["tie_word_embeddings"])
    if not tied:
        total += vocab * d  # lm_head, no bias
    return total, total - (0 if tied else vocab * d)


def _hub_preset(model_id: str) -> dict[str, Any] | None:
    """The config of a known hub model: its MPT preset with the released config's differences."""
    import yaml

    from hpc_llm.paths import conf_dir

    known = HUB_MODELS.get(model_id)
    if known is None:
        return None
    preset, differences = known
    section = yaml.safe_load((conf_dir() / "model" / f"{preset}.yaml").read_text())
    return {**_merge(section, differences), "model_type": "mpt"}


def _hf_config(model: Mapping[str, Any]) -> tuple[dict[str, Any], str] | None:
    """The config an ``hf_causal_lm`` section builds: config.json (or a known hub model's) with
    ``config_overrides`` over it, and where it came from; None for a hub id hpc_llm cannot read."""
    name = model.get("pretrained_model_name_or_path")
    if not name:
        raise ConfigError("model.pretrained_model_name_or_path is not set (hf_causal_lm needs it)")
    path = Path(str(name)).expanduser()
    if path.is_dir():
        config_json = path / "config.json"
        try:
            config = json.loads(config_json.read_text())
        except OSError:
            raise ConfigError(f"model.pretrained_model_name_or_path={name}: {config_json} cannot be read") from None
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{config_json} is not JSON: {exc}") from None
        source = f"{config_json}"
    else:
        preset = _hub_preset(str(name))
        if preset is None:
            return None
        config, source = preset, f"{name}: conf/model/{HUB_MODELS[str(name)][0]}.yaml as released on the hub"
    overrides = model.get("config_overrides") or {}
    if overrides:
        config = _merge(config, overrides)
        source += " + model.config_overrides"
    return config, source


def _hf_size(model: Mapping[str, Any], seq: int | None) -> ModelSize | None:
    found = _hf_config(model)
    if found is None:
        return None
    config, source = found
    model_type = str(config.get("model_type"))
    if model_type == "mpt":
        return _mpt_size(config, seq, source)
    if model_type in HF_DEFAULTS:
        total, active = llama_counts(config, source)
        d, layers = int(config["hidden_size"]), int(config["num_hidden_layers"])
        return ModelSize(total, active, layers, d, HF_FAMILIES[model_type], source)
    raise ConfigError(
        f"model_type {model_type!r} ({source}): hpc_llm counts {', '.join(sorted(HF_FAMILIES))}; give --params N"
    )


#: trainer=torchtitan's Llama 3, described by Hugging Face's LlamaConfig names (conf/model/llama3_tiny.yaml)
TITAN_LLAMA = "torchtitan_llama3"


def _titan_size(model: Mapping[str, Any]) -> ModelSize:
    """torchtitan's Llama 3 (fused QKV, SwiGLU, RMSNorm, untied output): the same count as
    transformers' LlamaForCausalLM of those sizes (the tiny one: 196,928, as torchtitan logs)."""
    config = {k: v for k, v in model.items() if k != "name"}
    total, active = llama_counts({**config, "model_type": "llama"}, f"train.model ({TITAN_LLAMA})")
    d, layers = int(model["hidden_size"]), int(model["num_hidden_layers"])
    return ModelSize(total, active, layers, d, "Llama", f"train.model ({TITAN_LLAMA})")


def _mpt_size(model: Mapping[str, Any], seq: int | None, source: str) -> ModelSize:
    total, active = mpt_counts(model, seq)
    cfg = {**MPT_DEFAULTS, **model}
    return ModelSize(total, active, int(cfg["n_layers"]), int(cfg["d_model"]), "MPT", source)


def model_size(model: Mapping[str, Any], max_seq_len: int | None = None, params: float | None = None) -> ModelSize:
    """The size of the model an LLM Foundry ``model:`` section builds. ``params`` (``--params``)
    is the user's own count: it wins, and the config, where readable, still gives L and d."""
    if params is not None and params <= 0:
        raise ConfigError(f"--params={params:g}: must be a parameter count > 0")
    name = model.get("name")
    size: ModelSize | None = None
    try:
        if name == "mpt_causal_lm":
            size = _mpt_size(model, max_seq_len, "train.model (mpt_causal_lm)")
        elif name == "hf_causal_lm":
            size = _hf_size(model, max_seq_len)
        elif name == TITAN_LLAMA:
            size = _titan_size(model)
        elif params is None:
            raise ConfigError(
                f"model.name={name}: hpc_llm counts mpt_causal_lm, hf_causal_lm and {TITAN_LLAMA} models; "
                "give --params N"
            )
    except ConfigError:
        if params is None:
            raise
    if params is not None:
        n = int(params)
        if size is not None:
            return ModelSize(n, n, size.n_layers, size.d_model, size.family, "--params")
        return ModelSize(n, n, None, None, str(model.get("pretrained_model_name_or_path") or name), "--params")
    if size is None:
        where = model.get("pretrained_model_name_or_path")
        raise ConfigError(
            f"model.pretrained_model_name_or_path={where} is not a local directory and not a hub model "
            f"hpc_llm knows ({', '.join(sorted(HUB_MODELS))}): give its size with --params N, "
            "or point it at a local model directory with its config.json"
        )
    return size


def flops_per_token(n_params: int, n_layers: int, d_model: int, seq_len: int) -> float:
    """Training FLOPs per token: 6 N + 12 L d T (forward + backward + weight grads)."""
    return 6.0 * n_params + 12.0 * n_layers * d_model * seq_len


def train_seq_len(train: Mapping[str, Any]) -> int:
    model = train["model"]
    return int(train.get("max_seq_len") or model.get("max_seq_len") or MPT_DEFAULTS["max_seq_len"])


def model_flops_per_token(train: Mapping[str, Any], params: float | None = None) -> tuple[int, float]:
    """(n_params, FLOPs per token) of the model in an LLM Foundry train config."""
    seq = train_seq_len(train)
    size = model_size(train["model"], seq, params)
    return size.n_params, size.flops_per_token(seq)


def human_params(n: float) -> str:
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            value = n / scale
            return f"{value:.0f}{unit}" if value >= 10 else f"{value:.1f}{unit}"
    return str(int(n))
