"""``yaml=PATH``: an LLM Foundry train yaml, run as written, with what hpc_llm adds.

tests/yamls/mpt-tiny-pretrain.yaml is a pretraining yaml in LLM Foundry's own
format (variables, a ``text`` loader over local MDS shards, an FSDP1
``fsdp_config``, flash attention, bf16): the tests override only
``train.variables.*`` and the tokenizer, as a user pointing it at their data
would. The bundled tiny corpus (built by a run of ``+experiment=mpt_tiny``)
stands in for C4.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from hpc_llm.config.foundry_yaml import OWNED
from tests.conftest import ROOT, explain, results_of, run_app, run_cli

PRETRAIN = ROOT / "tests" / "yamls" / "mpt-tiny-pretrain.yaml"
FINETUNE = ROOT / "tests" / "yamls" / "llama-tiny-finetune.yaml"
DOC = ROOT / "docs" / "guides" / "your-yaml.md"


def corpus(cache_dir: Path) -> Path:
    """The tiny corpus's folder (tokenizer/, mds/), built at first use."""
    from hpc_llm.data import tiny_corpus

    tiny_corpus.ensure(cache_dir)
    return tiny_corpus.root(cache_dir)


def pointed(root: Path) -> list[str]:
    return [f"train.variables.data_local={root / 'mds'}", f"train.tokenizer.name={root / 'tokenizer'}"]


def test_config_shows_what_hpc_llm_added_against_the_file(app_env, cache_dir):
    proc = run_cli(["config", f"yaml={PRETRAIN}", *pointed(corpus(cache_dir))], app_env)
    assert proc.returncode == 0, explain(proc)
    config, _, diff = proc.stdout.partition("# what hpc_llm added or changed against")
    train = yaml.safe_load(config)
    assert train["run_name"].startswith("mpt-tiny-pretrain-") and train["autoresume"] is True
    assert train["loggers"] == {"hpc_llm_results": {}} and "hpc_llm_preemption" in train["callbacks"]
    assert {"speed_monitor", "lr_monitor", "runtime_estimator"} <= set(train["callbacks"])  # the yaml's, kept
    for line in (
        "+run_name: mpt-tiny-pretrain-",
        "-run_name: null",
        "+  hpc_llm_preemption: {}",
        "-precision: amp_bf16",
    ):
        assert line in diff, diff
    # each decision the CPU profile made is one line on stderr
    said = proc.stderr
    [gpu] = [ln for ln in said.splitlines() if "need a GPU" in ln]  # every stand-in, in one line
    assert "precision=amp_bf16 -> fp32" in gpu and "model.attn_config.attn_impl=flash -> torch" in gpu
    assert "which has no sharding_strategy" in said


def test_the_docs_table_lists_every_key_hpc_llm_owns():
    text = DOC.read_text()
    rows = set(re.findall(r"^\| `([a-z_]+)` \|", text, flags=re.M))
    assert set(OWNED) <= rows, set(OWNED) - rows


@pytest.mark.train
def test_a_foundry_pretraining_yaml_runs_unchanged_with_only_its_variables_pointed_at_the_data(
    app_env, cache_dir, runs_dir, tmp_path
):
    root = corpus(cache_dir)
    pointed_at = [f"train.variables.data_local={root / 'mds'}", f"train.tokenizer.name={root / 'tokenizer'}"]
    proc = run_app([f"yaml={PRETRAIN}", *pointed_at], app_env, cwd=tmp_path)
    assert proc.returncode == 0, explain(proc)
    [r] = results_of(runs_dir)
    assert r["status"] == "completed" and r["batches_done"] == 12
    assert r["conversion_ok"] and r["inference_ok"] and r["eval"]["loss"] > 0
    assert Path(r["run_dir"]).parent.parent.name == "mpt-tiny-pretrain"  # named after the file
    # what the job ran is the file, resolved, plus only the documented additions
    ran = yaml.safe_load((Path(r["run_dir"]) / "train_config.yaml").read_text())
    file = yaml.safe_load(PRETRAIN.read_text())
    added = set(ran) - set(file)
    assert added <= set(OWNED), added - set(OWNED)
    changed = {k for k in set(ran) & set(file) if ran[k] != file[k] and not isinstance(file[k], str)}
    # run_name (null in the file), the loggers and callbacks hpc_llm adds, the CPU stand-ins
    # for GPU-only settings, and the loaders, tokenizer and variables the command line pointed
    assert changed <= {*OWNED, "model", "fsdp_config", "train_loader", "eval_loader", "tokenizer", "variables"}, changed
    assert ran["train_loader"]["dataset"]["local"] == str(root / "mds")


@pytest.mark.train
def test_a_preset_written_out_as_yaml_trains_the_same(app_env, runs_dir, tmp_path):
    """hpc-llm config --as-yaml: a seed experiment as a plain LLM Foundry yaml to keep editing;
    run with yaml=, it trains exactly as the experiment did."""
    args = ["train.max_duration=6ba", "eval=none"]
    out = run_cli(["config", "+experiment=mpt_tiny", *args, "--as-yaml"], app_env)
    assert out.returncode == 0, explain(out)
    plain = yaml.safe_load(out.stdout)
    assert not {"run_name", "save_folder", "loggers"} & set(plain) and "hpc_llm_preemption" not in plain["callbacks"]
    written = tmp_path / "mine.yaml"
    written.write_text(out.stdout)
    first = run_app(["+experiment=mpt_tiny", *args], app_env, cwd=tmp_path)
    assert first.returncode == 0, explain(first)
    second = run_app([f"yaml={written}", "eval=none"], app_env, cwd=tmp_path)
    assert second.returncode == 0, explain(second)
    by_name = {Path(r["run_dir"]).parent.parent.name: r for r in results_of(runs_dir)}
    preset, mine = by_name["mpt_tiny"], by_name["mine"]  # the yaml run is named after its file
    assert mine["batches_done"] == preset["batches_done"] == 6
    assert mine["train_loss"] == pytest.approx(preset["train_loss"], rel=1e-6)


BAD = [
    (["yaml={tmp}/nope.yaml"], "yaml={tmp}/nope.yaml: no such file; allowed: the path of an LLM Foundry train yaml"),
    (["yaml={tmp}/list.yaml"], "holds a list, not a mapping of train-config keys"),
    (["yaml={tmp}/broken.yaml"], "not valid YAML at line 2"),
    (["yaml={tmp}/typo.yaml"], "train.max_duraton (did you mean max_duration?) is not an LLM Foundry train-config key"),
    (["yaml={tmp}/unresolved.yaml"], "data_locl"),
    (["yaml={tmp}/pretrain.yaml"], "train.variables.data_local: {tmp}/my-copy-c4 does not exist"),
    (["yaml={tmp}/pretrain.yaml", "+experiment=mpt_tiny"], "together with +experiment=mpt_tiny"),
    (["yaml={tmp}/no_resume.yaml"], "sets autoresume: false with its own save_folder"),
    # the same rules for train.* keys given to a preset experiment
    (
        ["+experiment=mpt_tiny", "train.save_folder=/x"],
        "train.save_folder: the checkpoint folder is checkpoint.location",
    ),
    (
        ["+experiment=mpt_tiny", "train.fsdp_config.limit_all_gathers=true"],
        "train.fsdp_config given with parallelism=ddp",
    ),
]


@pytest.mark.parametrize("args,message", BAD, ids=[" ".join(b[0]) for b in BAD])
def test_bad_yaml_input_is_one_line_and_leaves_nothing(args, message, app_env, runs_dir, cache_dir, tmp_path):
    # the yamls below point at the tiny corpus: built here, or the first error would be its
    # missing folder (seen when this test ran before any other that builds it)
    corpus(cache_dir)
    (tmp_path / "list.yaml").write_text("- a\n- b\n")
    (tmp_path / "broken.yaml").write_text("max_duration: 8ba\nmodel: [unclosed\n")
    tiny = yaml.safe_load(run_cli(["config", "+experiment=mpt_tiny", "--as-yaml"], app_env).stdout)
    (tmp_path / "typo.yaml").write_text(yaml.safe_dump({**tiny, "max_duraton": "8ba"}))
    broken_ref = {**tiny, "variables": {"data_local": "/x"}, "train_loader": {**tiny["train_loader"]}}
    broken_ref["train_loader"]["dataset"] = {**tiny["train_loader"]["dataset"], "local": "${variables.data_locl}"}
    (tmp_path / "unresolved.yaml").write_text(yaml.safe_dump(broken_ref))
    (tmp_path / "pretrain.yaml").write_text(PRETRAIN.read_text())
    (tmp_path / "no_resume.yaml").write_text(yaml.safe_dump({**tiny, "autoresume": False, "save_folder": "./ck"}))
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    proc = run_app(args, app_env, cwd=tmp_path, timeout=120)
    assert proc.returncode == 2, explain(proc)
    # one error line (warnings about the rest of the yaml may come before it)
    [line] = [ln for ln in proc.stderr.strip().splitlines() if not ln.startswith("hpc_llm: warning: ")]
    assert line.startswith("hpc_llm: error: ") and message.replace("{tmp}", str(tmp_path)) in line, line
    assert not runs_dir.exists() and not (tmp_path / "outputs").exists()


def test_estimate_reads_the_model_of_a_yaml(app_env, cache_dir):
    proc = run_cli(["estimate", f"yaml={PRETRAIN}", *pointed(corpus(cache_dir))], app_env)
    assert proc.returncode == 0, explain(proc)
    assert "MPT-" in proc.stdout


def test_a_yaml_run_is_recorded_with_its_file(app_env, cache_dir, runs_dir, tmp_path):
    """A dry run on Slurm's launcher: the run dir keeps the yaml path in its config (provenance)."""
    args = [f"yaml={PRETRAIN}", *pointed(corpus(cache_dir)), "hydra/launcher=slurm", "hydra.launcher.dry_run=true"]
    proc = run_app(args, app_env, cwd=tmp_path)
    assert proc.returncode == 0, explain(proc)
    [config] = runs_dir.rglob(".hydra/config.yaml")
    saved = yaml.safe_load(config.read_text())
    assert saved["yaml"] == str(PRETRAIN) and saved["data"]["name"] == "yaml"
    assert saved["parallelism"]["name"] == "fsdp" and "fsdp_config" not in saved["train"]
    # the yaml's local paths are bound into a container, as data.path is
    assert saved["data"]["options"]["paths"] == [str(corpus(cache_dir) / "mds")] * 2 + [
        str(corpus(cache_dir) / "tokenizer")
    ]
    assert json.dumps(saved["train"]["train_loader"]).count(str(corpus(cache_dir) / "mds")) == 1


@pytest.mark.slurm
@pytest.mark.train
def test_the_same_yaml_sweeps_node_counts_on_slurm(slurm_env, cache_dir, runs_dir, tmp_path):
    """The yaml, unchanged, as a node-count sweep on the dev cluster (one rank per node)."""
    args = [f"yaml={PRETRAIN}", *pointed(corpus(cache_dir)), "hydra/launcher=slurm", "resources.nodes=1,2"]
    args += ["resources.tasks_per_node=1", "hydra.launcher.wait=true", "hydra.launcher.poll_s=1"]
    proc = run_app(args, slurm_env, cwd=tmp_path)
    assert proc.returncode == 0, explain(proc)
    runs = sorted(results_of(runs_dir), key=lambda r: r["nodes"])
    assert [(r["nodes"], r["status"], r["batches_done"]) for r in runs] == [(1, "completed", 12), (2, "completed", 12)]
    assert all(r["slurm_job_ids"] for r in runs)


def tiny_llama(root: Path, out: Path) -> int:
    """A Llama-shaped model (grouped-query attention, untied embeddings) built from a config
    with transformers and saved with the tiny corpus's tokenizer, as `hpc-llm data prepare`
    would leave a hub model on a machine with the hub (this one has none): its parameters."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(root / "tokenizer")
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
    )
    model = LlamaForCausalLM(config)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return sum(p.numel() for p in model.parameters())


@pytest.mark.train
def test_a_foundry_finetuning_yaml_of_a_local_llama_trains_with_fsdp_and_exports(
    app_env, cache_dir, runs_dir, tmp_path
):
    """hf_causal_lm from a local directory, finetuned on local jsonl with FSDP on 2 ranks, then
    exported to a Hugging Face directory that plain transformers loads and generates from."""
    n_params = tiny_llama(corpus(cache_dir), tmp_path / "tiny-llama")
    data = tmp_path / "data"
    data.mkdir()
    rows = [{"prompt": f"What is {i} plus {i}? ", "response": f"It is {2 * i}."} for i in range(64)]
    (data / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = [
        f"yaml={FINETUNE}",
        f"train.variables.model_dir={tmp_path / 'tiny-llama'}",
        f"train.variables.data_dir={data}",
    ]
    proc = run_app(args, app_env, cwd=tmp_path)
    assert proc.returncode == 0, explain(proc)
    [r] = results_of(runs_dir)
    assert r["status"] == "completed" and r["batches_done"] == 6 and r["parallelism"] == "fsdp"
    assert r["conversion_ok"] and r["inference_ok"], r
    assert r["model"].startswith("Llama-") and r["n_params"] == n_params  # sized from its config.json
    estimate = run_cli(["estimate", *args, "cluster=h100"], app_env)
    assert estimate.returncode == 0 and "Llama-" in estimate.stdout, explain(estimate)


@pytest.mark.slurm
@pytest.mark.train
def test_a_preempted_yaml_run_resumes_exactly(slurm_env, cache_dir, test_site, tmp_path, pytestconfig):
    """The yaml on one exclusive Slurm node, preempted mid-training: it saves, is requeued and
    ends with the final loss of an uninterrupted run of the same yaml."""
    from tests.jobs import ALONE
    from tests.test_faults import preempted_run, reference, same_loss

    alone = [a for a in ALONE if not a.startswith("+experiment=")]
    args = [f"yaml={PRETRAIN}", *pointed(corpus(cache_dir)), *alone, "train.max_duration=300ba"]
    args.append("train.eval_interval=100ba")  # the yaml's 6ba: fifty evaluations of a short run
    ref = reference(args, slurm_env, pytestconfig)
    _, r = preempted_run(args, slurm_env, tmp_path, test_site)
    same_loss(r, ref)
    first, second = r["attempts"]
    assert (first["cause"], first["action"]) == ("preemption", "requeue")
    assert second["resumed_at_batch"] == first["stopped_at_batch"] > 0
