"""hpc_llm knows the size of the model it runs: MPT sections, hf_causal_lm from a local
config.json or a known hub id, or the user's --params; and every shipped experiment gets a
result from ``estimate``, ``config`` and ``render``, not an error line.

Login side only: config.json files here are written as JSON by hand, in the schema
transformers writes (tests/test_flops.py builds the real models and counts their tensors).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from hpc_llm.config.compose import compose
from hpc_llm.config.flops import HUB_MODELS, model_size
from hpc_llm.errors import ConfigError
from hpc_llm.results.estimate import estimate
from tests.conftest import ROOT, explain, run_cli

EXPERIMENTS = sorted(p.stem for p in (ROOT / "conf" / "experiment").glob("*.yaml"))
PREVIEW = "a preview; submitting the run would stop here"


def train_of(overrides: list[str]) -> dict:
    return OmegaConf.to_container(compose(overrides).train, resolve=True)  # type: ignore[return-value]


def mpt_by_hand(vocab: int, d: int, layers: int) -> int:
    """An MPT without biases or learned positions (the released MPT-7B / 30B: no_bias, ALiBi),
    MHA, expansion 4, tied embeddings: wte + per layer (Wqkv 3d^2, out_proj d^2, up and
    down 8d^2, two LayerNorm weights) + the final norm's weight."""
    return vocab * d + layers * (12 * d * d + 2 * d) + d


def llama_by_hand(c: dict) -> int:
    """LlamaForCausalLM's tensors: embed_tokens, per layer q/k/v/o (GQA), gate/up/down and two
    RMSNorm weights, the final norm, and lm_head when untied."""
    d, hd = c["hidden_size"], c["hidden_size"] // c["num_attention_heads"]
    q, kv = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd
    per_layer = d * q + 2 * d * kv + q * d + 3 * d * c["intermediate_size"] + 2 * d
    untied = 0 if c["tie_word_embeddings"] else c["vocab_size"] * d
    return c["vocab_size"] * d + c["num_hidden_layers"] * per_layer + d + untied


def test_every_hub_model_a_preset_loads_has_a_size():
    """A new conf/model/*_hf.yaml naming a hub id hpc_llm cannot size would make `estimate` fail."""
    named = {
        yaml.safe_load(p.read_text())["pretrained_model_name_or_path"]
        for p in (ROOT / "conf" / "model").glob("*_hf.yaml")
    }
    assert named and named <= set(HUB_MODELS)
    for hub_id, (preset, _differences) in HUB_MODELS.items():
        assert (ROOT / "conf" / "model" / f"{preset}.yaml").is_file(), hub_id


@pytest.mark.parametrize(
    "experiment,hub_id,d,layers",
    [("mpt7b_dolly", "mosaicml/mpt-7b", 4096, 32), ("mpt30b_instruct", "mosaicml/mpt-30b", 7168, 48)],
)
def test_a_known_hub_id_gets_its_presets_size_as_released(experiment, hub_id, d, layers):
    train = train_of([f"+experiment={experiment}"])
    assert train["model"]["name"] == "hf_causal_lm" and train["model"]["pretrained_model_name_or_path"] == hub_id
    preset = train_of([f"model={HUB_MODELS[hub_id][0]}"])["model"]
    assert (preset["d_model"], preset["n_layers"]) == (d, layers)  # the preset is this model
    size = model_size(train["model"], train["max_seq_len"])
    # the released config.json: vocabulary padded to 50432, no biases, ALiBi
    assert size.n_params == size.n_flop_params == mpt_by_hand(50432, d, layers)
    assert (size.n_layers, size.d_model) == (layers, d)
    assert size.label.startswith("MPT-") and hub_id in size.source
    e = estimate(train, nodes=1, gpus_per_node=8, peak_flops_per_gpu=989e12)
    assert e.n_params == size.n_params and e.model == size.label
    assert e.flops_per_token == 6 * size.n_params + 12 * layers * d * train["max_seq_len"]


def test_an_unknown_hub_id_without_params_is_one_line_naming_what_to_give(app_env):
    overrides = ["+experiment=mpt7b_dolly", "train.model.pretrained_model_name_or_path=acme/llm-9b"]
    with pytest.raises(ConfigError) as exc:
        model_size(train_of(overrides)["model"], 2048)
    assert "--params N" in str(exc.value) and "local model directory" in str(exc.value)
    proc = run_cli(["estimate", *overrides], app_env)
    assert proc.returncode == 2, explain(proc)
    [line] = proc.stderr.strip().splitlines()
    assert line.startswith("hpc_llm: error: ") and "acme/llm-9b" in line and "--params N" in line
    assert not proc.stdout


def test_params_sizes_a_model_hpc_llm_cannot_read():
    train = train_of(["+experiment=mpt7b_dolly", "train.model.pretrained_model_name_or_path=acme/llm-9b"])
    e = estimate(train, nodes=2, gpus_per_node=8, peak_flops_per_gpu=989e12, params=9e9, mfu=0.4, tokens=1e12)
    assert e.n_params == 9_000_000_000 and e.model_source == "--params"
    # no config to read layers and width from: the attention term is left out, and said so
    assert e.flops_per_token == 6 * 9e9 and "no attention term" in e.flops_formula
    assert "acme/llm-9b" in e.model
    assert e.seconds == pytest.approx(1e12 * 6 * 9e9 / (16 * 989e12 * 0.4 * 0.9))
    # a readable model keeps its layers and width for the attention term; the count is the user's
    known = train_of(["+experiment=mpt7b_dolly"])
    e = estimate(known, nodes=1, gpus_per_node=8, peak_flops_per_gpu=989e12, params=7e9)
    assert e.n_params == 7_000_000_000 and e.flops_per_token == 6 * 7e9 + 12 * 32 * 4096 * 2048
    with pytest.raises(ConfigError, match="--params=-1: must be"):
        estimate(known, nodes=1, gpus_per_node=8, peak_flops_per_gpu=989e12, params=-1)


def write_llama(root: Path, **overrides) -> dict:
    """A config.json in the schema LlamaConfig.save_pretrained writes."""
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": 32000,
        "hidden_size": 2048,
        "intermediate_size": 5632,
        "num_hidden_layers": 22,
        "num_attention_heads": 32,
        "num_key_value_heads": 4,
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "mlp_bias": False,
        "torch_dtype": "bfloat16",
        **overrides,
    }
    root.mkdir(parents=True)
    (root / "config.json").write_text(json.dumps(config))
    return config


def test_a_local_llama_directory_through_the_cli(app_env, tmp_path):
    """TinyLlama-1.1B's shape (GQA 32/4, untied) from a local directory, config_overrides over it."""
    config = write_llama(tmp_path / "tinyllama")
    model = f"train.model.pretrained_model_name_or_path={tmp_path / 'tinyllama'}"
    proc = run_cli(["estimate", "+experiment=mpt7b_dolly", model, "--nodes", "1", "2"], app_env)
    assert proc.returncode == 0, explain(proc)
    n = llama_by_hand(config)
    assert n == 1_100_048_384  # TinyLlama-1.1B's published count
    assert f"Llama-1.1B: {n:,} parameters" in proc.stdout and "config.json" in proc.stdout
    # N for FLOPs leaves out the untied input embedding, as LLM Foundry's n_active_params
    fpt = 6 * (n - 32000 * 2048) + 12 * 22 * 2048 * 2048
    assert f"{fpt:.4g} FLOPs/token" in proc.stdout
    # config_overrides in the model section apply over config.json
    train = train_of(["+experiment=mpt7b_dolly", model])
    train["model"]["config_overrides"] = {"num_hidden_layers": 4, "tie_word_embeddings": True}
    size = model_size(train["model"], 2048)
    assert size.n_params == llama_by_hand({**config, "num_hidden_layers": 4, "tie_word_embeddings": True})
    assert "config_overrides" in size.source


@pytest.mark.parametrize(
    "config,message",
    [
        (None, "cannot be read"),
        ("{not json", "is not JSON"),
        (json.dumps({"model_type": "llama", "hidden_size": 64}), "has no num_hidden_layers"),
        (json.dumps({"model_type": "t5"}), "model_type 't5'"),
    ],
    ids=["no-config-json", "not-json", "missing-key", "other-family"],
)
def test_a_local_directory_hpc_llm_cannot_size_is_one_line(config, message, tmp_path):
    (tmp_path / "model").mkdir()
    if config is not None:
        (tmp_path / "model" / "config.json").write_text(config)
    section = {"name": "hf_causal_lm", "pretrained_model_name_or_path": str(tmp_path / "model")}
    with pytest.raises(ConfigError, match=message) as exc:
        model_size(section, 2048)
    assert "\n" not in str(exc.value)
    assert model_size(section, 2048, params=1e9).n_params == 10**9  # --params still answers


def test_a_cpu_experiment_gets_its_size_without_times():
    """mpt_tiny runs on the local CPU profile: no GPUs and no peak, so no times, but its size."""
    cfg = compose(["+experiment=mpt_tiny"])
    train = OmegaConf.to_container(cfg.train, resolve=True)
    e = estimate(train, nodes=1, gpus_per_node=int(cfg.resources.gpus_per_node), peak_flops_per_gpu=None)  # type: ignore[arg-type]
    assert e.untimed and "gpus_per_node is 0" in e.untimed and e.peak_flops_per_gpu is None
    assert e.n_params == 141056
    with pytest.raises(ValueError, match="no time estimate"):
        _ = e.seconds
    # a bare model on that profile asks only how long on GPUs: an error naming the profile to use
    with pytest.raises(ConfigError, match="use cluster=h100"):
        estimate(train, nodes=1, gpus_per_node=0, peak_flops_per_gpu=None, from_experiment=False)  # type: ignore[arg-type]


@pytest.mark.parametrize("experiment", EXPERIMENTS)
@pytest.mark.parametrize("command", ["estimate", "config", "render"])
def test_every_shipped_experiment_gets_a_result(command, experiment, app_env):
    proc = run_cli([command, f"+experiment={experiment}"], app_env)
    assert proc.returncode == 0, explain(proc)
    # data not prepared yet is a preview's warning, never an error
    for line in proc.stderr.strip().splitlines():
        assert line.startswith("hpc_llm: warning: ") and PREVIEW in line, explain(proc)
    if command == "estimate":
        train = train_of([f"+experiment={experiment}"])
        n = model_size(train["model"], train["max_seq_len"]).n_params
        assert f" {n:,} parameters, " in proc.stdout.splitlines()[0]
        cpu = experiment in ("mpt_tiny", "llama3_tiny")
        assert ("time: not estimated" in proc.stdout) == cpu and ("| nodes | GPUs |" in proc.stdout) != cpu
    elif command == "config":
        assert yaml.safe_load(proc.stdout)["model"]["name"] in ("mpt_causal_lm", "hf_causal_lm", "torchtitan_llama3")
    else:
        assert proc.stdout.startswith("#!") and "#SBATCH --nodes=" in proc.stdout
