"""Overhead of hpc_llm over plain LLM Foundry on the same tiny config.

Runs ``python -m hpc_llm +experiment=mpt_tiny`` (2 local ranks, DDP), then
LLM Foundry's ``train_from_yaml`` on the train_config.yaml that run resolved
(minus hpc_llm's results logger), under Composer's own launcher with the same
rank count. Alternates the two ``--repeats`` times and prints the wall-clock
and tokens/s ratios (hpc_llm / baseline); goal: wall <= 1.05x, tokens/s >= 0.98x.

    .venv/bin/python benchmarks/overhead.py [--repeats 3] [--max-duration 40ba]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
FIT = re.compile(r"BASELINE tokens=(\d+) fit_s=([0-9.]+)")


def run_hpc_llm(runs: Path, env: dict[str, str], max_duration: str) -> tuple[float, float, Path]:
    t0 = time.perf_counter()
    subprocess.run(
        # eval=heldout: the baseline evaluates the held-out split too, but has no post-train
        # stage (HF conversion, inference); benchmarks/stages.py measures that separately
        [
            sys.executable,
            "-m",
            "hpc_llm",
            "+experiment=mpt_tiny",
            f"train.max_duration={max_duration}",
            "eval=heldout",
            "hydra.launcher.stream=false",
        ],
        env=dict(env, HPC_LLM_RUNS=str(runs)),
        check=True,
        capture_output=True,
    )
    wall = time.perf_counter() - t0
    [res] = sorted(runs.rglob("results.json"), key=os.path.getmtime)[-1:]
    data = json.loads(res.read_text())
    # tokens over Composer's own training wall clock (state.timestamp.total_wct):
    # the same measure on both sides, less noisy than SpeedMonitor's 5-batch window.
    return wall, data["tokens_done"] / data["fit_s"], res.parent


def run_foundry(run_dir: Path, workdir: Path, env: dict[str, str]) -> tuple[float, float]:
    cfg = yaml.safe_load((run_dir / "train_config.yaml").read_text())
    # hpc_llm's own logger and preemption callback are not registered in plain LLM Foundry.
    cfg["loggers"].pop("hpc_llm_results", None)
    cfg.get("callbacks", {}).pop("hpc_llm_preemption", None)
    if not cfg["loggers"]:
        cfg.pop("loggers")
    cfg["save_folder"] = str(workdir / "checkpoints")
    cfg["run_name"] = f"baseline-{time.time_ns()}"
    path = workdir / "train.yaml"
    path.write_text(yaml.safe_dump(cfg))
    t0 = time.perf_counter()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "composer.cli.launcher",
            "-n",
            "2",
            "--master_port",
            "29533",
            str(HERE / "_foundry_train.py"),
            str(path),
        ],
        env=dict(env, OMP_NUM_THREADS=str(max(1, (os.cpu_count() or 1) // 2))),
        cwd=workdir,
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"baseline failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    wall = time.perf_counter() - t0
    m = FIT.search(proc.stdout + proc.stderr)
    if not m:
        raise RuntimeError("baseline printed no token count")
    return wall, int(m.group(1)) / float(m.group(2))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-duration", default="40ba")
    args = ap.parse_args()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "HYDRA_"))}
    env["PYTHONUNBUFFERED"] = "1"
    with tempfile.TemporaryDirectory(dir=os.environ.get("HPC_LLM_BENCH_DIR")) as tmp:
        tmp_path = Path(tmp)
        env.setdefault("HPC_LLM_CACHE", str(tmp_path / "cache"))
        # Warm-up: builds the tokenizer and MDS shards, fills the page cache.
        _, _, first_dir = run_hpc_llm(tmp_path / "warm", env, args.max_duration)
        rows = []
        for i in range(args.repeats):
            h_wall, h_tps, run_dir = run_hpc_llm(tmp_path / f"h{i}", env, args.max_duration)
            work = tmp_path / f"b{i}"
            work.mkdir()
            b_wall, b_tps = run_foundry(run_dir, work, env)
            rows.append((h_wall, b_wall, h_tps, b_tps))
            print(
                f"repeat {i}: hpc_llm {h_wall:6.2f} s {h_tps:8.0f} tok/s | "
                f"llmfoundry {b_wall:6.2f} s {b_tps:8.0f} tok/s",
                flush=True,
            )
    wall_ratio = statistics.median(h / b for h, b, _, _ in rows)
    tps_ratio = statistics.median(h / b for _, _, h, b in rows)
    print(f"\nconfig: mpt_tiny, 2 ranks (gloo, CPU), max_duration={args.max_duration}, {args.repeats} repeats")
    print(f"wall-clock ratio  hpc_llm / llmfoundry: {wall_ratio:.3f}x  (goal <= 1.05x)")
    print(f"tokens/s ratio    hpc_llm / llmfoundry: {tps_ratio:.3f}x  (goal >= 0.98x)")


if __name__ == "__main__":
    main()
