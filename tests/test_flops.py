"""Model-FLOPs accounting: the same numbers as LLM Foundry's MPT, and parameter counts equal to
``sum(p.numel())`` of the models LLM Foundry and transformers build (MPT and Llama-shaped)."""

import json

import pytest
from omegaconf import OmegaConf

from hpc_llm.config.compose import compose
from hpc_llm.config.flops import flops_per_token, model_flops_per_token, model_size, mpt_params


@pytest.mark.parametrize(
    "size,published",
    # NumParams in LLM Foundry's H100 benchmark table (scripts/train/benchmarking/README.md), seq 2048
    [("760m", 760470528), ("1b", 1315950592), ("7b", 6658859008), ("30b", 29975214080), ("70b", 64862437376)],
)
def test_param_count_matches_llm_foundry_published(size, published):
    train = OmegaConf.to_container(compose([f"model=mpt-{size}"]).train, resolve=True)
    assert mpt_params(train["model"]) == published


def test_tiny_mpt_flops_by_hand():
    train = OmegaConf.to_container(compose(["+experiment=mpt_tiny"]).train, resolve=True)
    # vocab 512, d 64, 2 layers, seq 128, expansion 4, biases, learned positions:
    # N = 512*64 + 128*64 + 2*(12*64*64 + 13*64) + 2*64 = 141,056
    n, fpt = model_flops_per_token(train)
    assert n == 512 * 64 + 128 * 64 + 2 * (12 * 64 * 64 + 13 * 64) + 2 * 64 == 141056
    # 6N + 12 L d T = 846,336 + 196,608
    assert fpt == 6 * 141056 + 12 * 2 * 64 * 128 == 1042944
    assert flops_per_token(10, 1, 1, 1) == 72


@pytest.mark.train
def test_matches_llm_foundry_model_itself():
    """Build the real LLM Foundry MPT and compare with its own accounting."""
    pytest.importorskip("llmfoundry")
    import torch
    from llmfoundry.models.mpt import ComposerMPTCausalLM

    train = OmegaConf.to_container(compose(["+experiment=mpt_tiny"]).train, resolve=True)
    model_cfg = {k: v for k, v in train["model"].items() if k not in ("name", "init_device")}
    model = ComposerMPTCausalLM(**model_cfg)
    n, fpt = model_flops_per_token(train)
    assert model.n_active_params == n
    batch = {"input_ids": torch.zeros(3, train["max_seq_len"], dtype=torch.long)}
    assert model.flops_per_batch(batch) == pytest.approx(fpt * 3 * train["max_seq_len"])


TINY_MPT = {
    "d_model": 32,
    "n_heads": 4,
    "n_layers": 2,
    "expansion_ratio": 2,
    "max_seq_len": 16,
    "vocab_size": 64,
    "loss_fn": "torch_crossentropy",
}
MPT_VARIANTS = {
    "biases-learned-positions": {"attn_config": {"attn_impl": "torch"}},
    "no-bias-alibi": {"no_bias": True, "attn_config": {"attn_impl": "torch", "alibi": True}},
    "gqa-glu-rmsnorm-untied": {
        "attn_config": {"attn_impl": "torch", "attn_type": "grouped_query_attention", "kv_n_heads": 2},
        "ffn_config": {"ffn_type": "mptglu"},
        "norm_type": "low_precision_rmsnorm",
        "tie_word_embeddings": False,
    },
    "mqa-qk-ln-rope-ffn-size": {
        "attn_config": {
            "attn_impl": "torch",
            "attn_type": "multiquery_attention",
            "qk_ln": True,
            "rope": True,
            "rope_impl": "hf",
        },
        "ffn_config": {"ffn_type": "mptmlp", "ffn_hidden_size": 48},
    },
    "no-attention-bias-qk-gn-head-dim": {
        "attention_bias": False,
        "head_dim": 16,
        "attn_config": {"attn_impl": "torch", "qk_gn": True},
    },
    "no-bias-layernorm-gqa-qk-ln": {
        "no_bias": True,
        "norm_type": "layernorm",
        "attn_config": {"attn_impl": "torch", "attn_type": "grouped_query_attention", "kv_n_heads": 2, "qk_ln": True},
    },
}


@pytest.mark.train
@pytest.mark.parametrize("variant", sorted(MPT_VARIANTS))
def test_mpt_count_is_the_built_models_numel_and_flops_are_llm_foundrys(variant):
    import torch
    from llmfoundry.models.mpt import ComposerMPTCausalLM

    section = {**TINY_MPT, **MPT_VARIANTS[variant]}
    model = ComposerMPTCausalLM(**section)
    size = model_size({"name": "mpt_causal_lm", **section}, 16)
    assert size.n_params == sum(p.numel() for p in model.parameters())
    assert size.n_flop_params == model.n_active_params
    batch = {"input_ids": torch.zeros(3, 16, dtype=torch.long)}
    assert size.flops_per_token(16) * 3 * 16 == model.flops_per_batch(batch)


@pytest.mark.train
def test_an_mpt_in_hugging_face_format_counts_as_the_mpt_it_is(tmp_path):
    """hf_causal_lm over a local MPT directory (LLM Foundry's HF export writes model_type mpt)."""
    from llmfoundry.models.mpt import MPTConfig, MPTForCausalLM

    variant = MPT_VARIANTS["gqa-glu-rmsnorm-untied"]
    config = MPTConfig(**{k: v for k, v in TINY_MPT.items() if k != "loss_fn"}, **variant)
    MPTForCausalLM(config).save_pretrained(tmp_path / "mpt")
    assert json.loads((tmp_path / "mpt" / "config.json").read_text())["model_type"] == "mpt"
    built = MPTForCausalLM(MPTConfig.from_pretrained(tmp_path / "mpt"))
    size = model_size({"name": "hf_causal_lm", "pretrained_model_name_or_path": str(tmp_path / "mpt")}, 16)
    assert size.n_params == sum(p.numel() for p in built.parameters())
    assert size.n_flop_params == size.n_params - built.get_input_embeddings().weight.numel()  # untied
    assert size.label.startswith("MPT-")


TINY_LLAMA = {
    "vocab_size": 96,
    "hidden_size": 32,
    "intermediate_size": 80,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,  # GQA
}


@pytest.mark.train
@pytest.mark.parametrize(
    "family,extra",
    [
        ("llama", {"tie_word_embeddings": True}),
        ("llama", {"tie_word_embeddings": False}),
        ("llama", {"tie_word_embeddings": False, "attention_bias": True, "mlp_bias": True, "head_dim": 12}),
        ("mistral", {"tie_word_embeddings": False}),
        ("qwen2", {"tie_word_embeddings": True}),
        ("qwen3", {"tie_word_embeddings": False, "attention_bias": True, "head_dim": 16}),
    ],
    ids=["llama-tied", "llama-untied", "llama-biases-head-dim", "mistral", "qwen2-tied", "qwen3"],
)
def test_a_llama_shaped_model_saved_locally_counts_as_built(family, extra, tmp_path):
    """Built from a config (no hub here), saved with save_pretrained, counted from config.json."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(family, **TINY_LLAMA, **extra)
    model = AutoModelForCausalLM.from_config(config)
    model.save_pretrained(tmp_path / "model")
    size = model_size({"name": "hf_causal_lm", "pretrained_model_name_or_path": str(tmp_path / "model")}, 16)
    assert size.n_params == sum(p.numel() for p in model.parameters())
    embedding = model.get_input_embeddings().weight.numel()
    assert size.n_flop_params == size.n_params - (0 if config.tie_word_embeddings else embedding)
    assert (size.n_layers, size.d_model) == (2, 32)


@pytest.mark.train
def test_config_overrides_count_as_llm_foundry_applies_them(tmp_path):
    """LLM Foundry's own hf_causal_lm build of the directory, with config_overrides over it."""
    from llmfoundry.models.hf import ComposerHFCausalLM
    from transformers import LlamaConfig, LlamaForCausalLM

    LlamaForCausalLM(LlamaConfig(**TINY_LLAMA, tie_word_embeddings=True)).save_pretrained(tmp_path / "llama")
    overrides = {"num_hidden_layers": 3, "tie_word_embeddings": False}
    inner = ComposerHFCausalLM.build_inner_model(
        pretrained_model_name_or_path=str(tmp_path / "llama"),
        pretrained_lora_id_or_path=None,
        trust_remote_code=False,
        init_device="cpu",
        use_flash_attention_2=False,
        use_auth_token=False,
        config_overrides=overrides,
        load_in_8bit=False,
        pretrained=True,
    )
    section = {
        "name": "hf_causal_lm",
        "pretrained_model_name_or_path": str(tmp_path / "llama"),
        "config_overrides": overrides,
    }
    size = model_size(section, 16)
    assert size.n_params == sum(p.numel() for p in inner.parameters())
    assert size.n_layers == 3
