"""trainer=torchtitan against its baselines, on this machine's CPU (2 local ranks, DDP over gloo).

  python benchmarks/titan.py throughput [--pairs 5] [--batches 300]
  python benchmarks/titan.py save

``throughput``: the same tiny Llama 3 (hidden 64, 2 layers, 4 heads, FFN 256, vocab 512; the
tiny corpus, 8 x 128 tokens a step), alternated ``--pairs`` times:

  hpc_llm + torchtitan   python -m hpc_llm +experiment=llama3_tiny (the agents' path is the
                         Slurm launcher's; locally: the ranks, the task, the step duties)
  raw torchtitan         torchrun of torchtitan's own Trainer on the config hpc_llm gives it
                         (benchmarks/_titan_raw.py), with the CPU fixes it cannot run without
  hpc_llm + LLM Foundry  python -m hpc_llm with LLM Foundry's hf_causal_lm of the same Llama
                         config (transformers' LlamaForCausalLM, from config.json, no weights)

Each figure is the run's tokens over its whole training loop (torchtitan's ``Trainer.train()``,
hpc_llm's ``train_s``; Composer's ``fit``, ``fit_s``), the first step and the last save
included: a window of a few 0.1 s steps on a shared CPU varies by 20 %. Printed: the medians and
the per-pair ratios (goal: hpc_llm / raw >= 0.98).

``save``: the time a checkpoint save blocks training, async against synchronous DCP, on a
~135M-parameter Llama 3 (benchmarks/_titan_raw.py save; goal: <= 0.2x).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
TITAN = ROOT / ".venv-torchtitan" / "bin"
LLAMA = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "intermediate_size": 256,
    "vocab_size": 512,
    "max_position_embeddings": 2048,
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
}


def app(args: list[str], env: dict[str, str]) -> dict:
    runs = Path(tempfile.mkdtemp(prefix="titan-bench-", dir=str(Path.home() / ".hpc_llm")))
    proc = subprocess.run(
        [sys.executable, "-m", "hpc_llm", *args],
        env=dict(env, HPC_LLM_RUNS=str(runs)),
        capture_output=True,
        text=True,
        cwd=runs,
    )
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed:\n{proc.stderr[-3000:]}")
    [path] = runs.rglob("results.json")
    return json.loads(path.read_text())


def text_data(env: dict[str, str]) -> dict[str, str]:
    code = (
        "import json; from pathlib import Path; from hpc_llm.data import tiny_corpus; from hpc_llm.paths import "
        "cache_dir; t, d = tiny_corpus.ensure_text(cache_dir()); "
        "print(json.dumps({'tokenizer': str(t), 'train': str(d / 'train.jsonl'), 'eval': str(d / 'val.jsonl')}))"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def raw(batches: int, env: dict[str, str]) -> float:
    shown = subprocess.run(
        [
            sys.executable,
            "-c",
            "from hpc_llm.cli import main; main()",
            "config",
            "+experiment=llama3_tiny",
            f"train.max_duration={batches}ba",
            f"checkpoint.interval={batches}ba",
            "+trainer.options.heldout=false",
        ],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    flat = yaml.safe_load(shown)
    model = flat.pop("model")
    flat["checkpoint.folder"] = tempfile.mkdtemp(prefix="titan-raw-ckpt-", dir=str(Path.home() / ".hpc_llm"))
    spec = Path(tempfile.mkstemp(suffix=".json")[1])
    spec.write_text(json.dumps({"flat": flat, "model": model, "data": text_data(env)}))
    proc = subprocess.run(
        [
            str(TITAN / "torchrun"),
            "--nproc-per-node",
            "2",
            "--master-port",
            "29613",
            str(ROOT / "benchmarks" / "_titan_raw.py"),
            "train",
            str(spec),
        ],
        env=dict(env, OMP_NUM_THREADS="1"),
        capture_output=True,
        text=True,
    )
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not line:
        raise SystemExit(f"raw torchtitan failed:\n{proc.stderr[-3000:]}")
    return float(json.loads(line[-1])["loop_tokens_per_sec"])


def throughput(pairs: int, batches: int) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "HYDRA_"))}
    env.update(HPC_LLM_PRECHECK="0", HPC_LLM_TORCHTITAN_PYTHON=str(TITAN / "python"), PYTHONPATH=str(ROOT))
    llama = Path(tempfile.mkdtemp(prefix="llama-tiny-"))
    (llama / "config.json").write_text(json.dumps(LLAMA))
    common = [f"train.max_duration={batches}ba", f"checkpoint.interval={batches}ba"]
    foundry_model = [
        "eval=none",
        "train.model.name=hf_causal_lm",
        f"+train.model.pretrained_model_name_or_path={llama}",
        "+train.model.pretrained=false",
        "~train.model.d_model",
        "~train.model.n_heads",
        "~train.model.n_layers",
        "~train.model.expansion_ratio",
        "~train.model.max_seq_len",
        "~train.model.vocab_size",
        "~train.model.attn_config",
        "~train.model.init_device",
        "~train.model.loss_fn",
    ]
    figures: dict[str, list[float]] = {"hpc_llm": [], "raw": [], "foundry": []}
    for _ in range(pairs):
        ours = app(["+experiment=llama3_tiny", *common, "+trainer.options.heldout=false"], env)
        figures["hpc_llm"].append(float(ours["tokens_done"]) / float(ours["train_s"]))
        figures["raw"].append(raw(batches, env))
        foundry = app(["+experiment=mpt_tiny", *common, *foundry_model], env)
        figures["foundry"].append(float(foundry["tokens_done"]) / float(foundry["fit_s"]))
    med = {k: statistics.median(v) for k, v in figures.items()}
    print(f"tiny Llama 3, 2 ranks x DDP on CPU, {batches} steps of 8 x 128 tokens, {pairs} alternated runs each")
    for name, label in (
        ("hpc_llm", "hpc_llm + torchtitan"),
        ("raw", "raw torchtitan"),
        ("foundry", "hpc_llm + LLM Foundry"),
    ):
        print(f"  {label:24s} {med[name]:10,.0f} tokens/s   {[round(x) for x in figures[name]]}")
    ours_raw = [a / b for a, b in zip(figures["hpc_llm"], figures["raw"], strict=True)]
    titan_foundry = [a / b for a, b in zip(figures["hpc_llm"], figures["foundry"], strict=True)]
    for label, ratios, goal in (
        ("hpc_llm / raw torchtitan", ours_raw, "; goal >= 0.98"),
        ("torchtitan / LLM Foundry", titan_foundry, ""),
    ):
        print(f"  {label}: {statistics.median(ratios):.3f} (pairs {[round(r, 3) for r in ratios]}{goal})")


def save() -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    data = text_data(env)
    proc = subprocess.run(
        [str(TITAN / "python"), str(ROOT / "benchmarks" / "_titan_raw.py"), "save", json.dumps(data)],
        env=env,
        capture_output=True,
        text=True,
    )
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not line:
        raise SystemExit(f"the save benchmark failed:\n{proc.stderr[-3000:]}")
    out = json.loads(line[-1])
    print(f"a save of a {out['params'] / 1e6:.0f}M-parameter Llama 3 (model + AdamW state), 1 rank on CPU:")
    for mode, label in (("disabled", "synchronous"), ("async", "async")):
        saves = [round(x, 3) for x in out["blocking_s"][mode]]
        print(f"  {label:12s} blocks {out['median_s'][mode]:.3f} s (saves: {saves})")
    print(f"  async / synchronous: {out['ratio']:.3f} (goal <= 0.2)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="what", required=True)
    t = sub.add_parser("throughput")
    t.add_argument("--pairs", type=int, default=5)
    t.add_argument("--batches", type=int, default=300)
    sub.add_parser("save")
    args = ap.parse_args()
    (Path.home() / ".hpc_llm").mkdir(exist_ok=True)
    if args.what == "throughput":
        throughput(args.pairs, args.batches)
    else:
        save()


if __name__ == "__main__":
    main()
