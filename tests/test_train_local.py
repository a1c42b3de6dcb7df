"""Real Composer / LLM Foundry training of the tiny MPT through the local launcher.

Each test runs ``python -m hpc_llm`` end to end: ranks as real processes
(gloo), the bundled corpus, held-out eval, a checkpoint and results.json.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.conftest import EXAMPLE_PLUGIN, explain, pip_install, results_of, run_app
from tests.test_results_glossary import assert_documented

pytestmark = pytest.mark.train

TRAINING_STACK = re.compile(r"import time:.*\|\s+(torch|composer|llmfoundry)(\.|\s*$)", re.M)


def check_completed(r: dict, *, parallelism: str, world_size: int) -> None:
    assert r["status"] == "completed", r.get("error")
    assert r["experiment"] == "mpt_tiny"
    assert r["parallelism"] == parallelism
    assert (r["nodes"], r["world_size"]) == (1, world_size)
    assert r["batches_done"] == 40
    # The loss falls: the last logged training loss is well below the first.
    assert r["train_loss"] < r["train_loss_first"] - 1.0, (r["train_loss_first"], r["train_loss"])
    assert len(r["train_loss_history"]) == 40
    assert {"loss", "perplexity", "token_accuracy"} <= set(r["eval"])
    assert r["eval"]["loss"] < r["train_loss_first"]
    # the post-train stage (eval=full, the default): HF model written, loaded, generated from
    assert r["conversion_ok"] is True and r["inference_ok"] is True, r["eval"]
    assert r["eval"]["inference_new_tokens"] == 8 and r["hf_model_bytes"] > 100_000
    hf = json.loads((Path(r["hf_model_dir"]) / "config.json").read_text())
    assert hf["attn_config"]["attn_impl"] == "torch" and hf["init_device"] == "cpu"
    assert hf["auto_map"]["AutoModelForCausalLM"] == "modeling_mpt.MPTForCausalLM"
    assert r["eval"]["perplexity"] == pytest.approx(2.718281828 ** r["eval"]["loss"], rel=1e-3)
    ckpt = Path(r["checkpoint"])
    assert ckpt.exists() and ckpt.name.startswith("ep") and "ba40" in ckpt.name
    assert r["checkpoint_bytes"] > 10_000
    assert r["tokens_per_sec"] > 0 and r["wallclock_s"] > 0
    assert r["mfu"] is None  # no GPU peak FLOPs on CPU
    assert len(r["peak_memory_bytes_per_rank"]) == world_size
    assert r["restarts"] == 0 and r["slurm_job_ids"] == []
    assert_documented(r)  # every field a real run writes is in docs/reference/results-json.md


def test_ddp_two_ranks(app_env, runs_dir, tmp_path):
    proc = run_app(["+experiment=mpt_tiny"], app_env, cwd=tmp_path, python_flags=["-X", "importtime"])
    assert proc.returncode == 0, explain(proc)
    [r] = results_of(runs_dir)
    check_completed(r, parallelism="ddp", world_size=2)
    assert r["device_mesh"] is None
    run_dir = Path(r["run_dir"])
    assert (run_dir / "train_config.yaml").is_file() and (run_dir / ".hydra" / "config.yaml").is_file()
    assert (run_dir / "logs" / "rank0.log").is_file() and (run_dir / "logs" / "rank1.log").is_file()
    # The launching (login-node) process never imported the training stack.
    assert not TRAINING_STACK.search(proc.stderr), TRAINING_STACK.findall(proc.stderr)[:5]
    # The converted model is an ordinary HF directory: plain transformers (no
    # llmfoundry import) loads it and its greedy continuation is what the run recorded.
    code = (
        "import sys, torch; from transformers import AutoModelForCausalLM, AutoTokenizer\n"
        "d = sys.argv[1]; tok = AutoTokenizer.from_pretrained(d)\n"
        "m = AutoModelForCausalLM.from_pretrained(d, trust_remote_code=True, torch_dtype=torch.float32)\n"
        "ids = tok('The', return_tensors='pt')['input_ids']\n"
        "out = m.generate(input_ids=ids, max_new_tokens=8, do_sample=False, pad_token_id=tok.eos_token_id)\n"
        "print(repr(tok.decode(out[0][ids.shape[1]:], skip_special_tokens=True)))\n"
        "assert 'llmfoundry' not in sys.modules\n"
    )
    import subprocess
    import sys

    check = subprocess.run(
        [sys.executable, "-c", code, r["hf_model_dir"]], capture_output=True, text=True, env=app_env, timeout=300
    )
    assert check.returncode == 0, check.stderr[-3000:]
    assert check.stdout.strip() == repr(r["eval"]["inference_sample"])


def test_fsdp_two_ranks(app_env, runs_dir, tmp_path):
    proc = run_app(["+experiment=mpt_tiny", "parallelism=fsdp"], app_env, cwd=tmp_path)
    assert proc.returncode == 0, explain(proc)
    [r] = results_of(runs_dir)
    check_completed(r, parallelism="fsdp", world_size=2)
    assert r["device_mesh"] == {"data_parallel_shard": 2}
    assert Path(r["checkpoint"]).is_dir()  # FSDP2 writes a sharded checkpoint


def test_hsdp_four_ranks_two_by_two(app_env, runs_dir, tmp_path):
    # with the preflight on: Composer must train on the process group the checks opened
    proc = run_app(
        [
            "+experiment=mpt_tiny",
            "parallelism=hsdp",
            "resources.tasks_per_node=4",
            "preflight.enabled=true",
            "preflight.max_bytes=4096",
        ],
        app_env,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, explain(proc)
    [r] = results_of(runs_dir)
    check_completed(r, parallelism="hsdp", world_size=4)
    assert r["preflight"]["passed"] is True and r["preflight"]["checks"]["allreduce"]["ranks"] == 4
    assert r["device_mesh"] == {"data_parallel_replicate": 2, "data_parallel_shard": 2}


def test_third_party_jsonl_source_trains(app_env, runs_dir, tmp_path, cache_dir):
    """The example plugin, pip-installed, selected by name, trains for real."""
    site = tmp_path / "site"
    pip_install(EXAMPLE_PLUGIN, site)
    from hpc_llm.data import tiny_corpus

    tokenizer, _ = tiny_corpus.ensure(cache_dir)
    data = tmp_path / "corpus.jsonl"
    with data.open("w") as f:
        for line in tiny_corpus.corpus_lines()[:200]:
            f.write(json.dumps({"text": line}) + "\n")
    env = dict(app_env, PYTHONPATH=str(site))
    proc = run_app(
        [
            "+experiment=mpt_tiny",
            "data.name=jsonl",
            f"data.path={data}",
            f"+train.tokenizer.name={tokenizer}",
            "train.max_duration=10ba",
            "resources.tasks_per_node=1",
            "eval=heldout",
        ],
        env,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, explain(proc)
    [r] = results_of(runs_dir)
    assert r["status"] == "completed" and r["batches_done"] == 10
    assert {"loss", "perplexity", "token_accuracy"} <= set(r["eval"])
    assert r["train_loss"] < r["train_loss_first"]


def test_a_sweep_runs_each_point_with_its_own_config(app_env, runs_dir, tmp_path):
    proc = run_app(
        ["+experiment=mpt_tiny", "train.max_duration=4ba,6ba", "eval=none", "resources.tasks_per_node=1"],
        app_env,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, explain(proc)
    rs = results_of(runs_dir)
    assert [r["batches_done"] for r in rs] == [4, 6]
    assert all(r["eval"] == {} for r in rs)


def test_the_console_shows_a_summary_and_v_shows_everything(app_env, runs_dir, tmp_path):
    """The ranks' whole output goes to logs/rank<N>.log; the console gets a short summary."""
    quiet = run_app(["+experiment=mpt_tiny", "train.max_duration=10ba", "eval=heldout"], app_env, cwd=tmp_path)
    assert quiet.returncode == 0, explain(quiet)
    assert len(quiet.stdout.splitlines()) < 25, quiet.stdout
    assert "[batch=" not in quiet.stdout + quiet.stderr  # LLM Foundry's console lines stay in the log
    for row in ("status", "train loss", "held-out", "throughput", "tokens/s", "checkpoint", "run dir"):
        assert row in quiet.stdout
    [r] = results_of(runs_dir)
    assert f"{r['train_loss_first']:.4g} -> {r['train_loss']:.4g} (10 batches)" in quiet.stdout
    log = (Path(r["run_dir"]) / "logs" / "rank0.log").read_text()
    assert "[batch=10/10]" in log and "llmfoundry" in log
    loud = run_app(
        ["+experiment=mpt_tiny", "train.max_duration=10ba", "eval=heldout", "-v"],
        dict(app_env, HPC_LLM_RUNS=str(tmp_path / "loud")),
        cwd=tmp_path,
    )
    assert loud.returncode == 0, explain(loud)
    assert "[batch=10/10]" in loud.stdout and len(loud.stdout.splitlines()) > 100
