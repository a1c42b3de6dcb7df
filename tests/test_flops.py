"""Model-FLOPs accounting: the same numbers as LLM Foundry's MPT."""

import pytest
from omegaconf import OmegaConf

from hpc_llm.cli import compose
from hpc_llm.config.flops import flops_per_token, model_flops_per_token, mpt_params


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
