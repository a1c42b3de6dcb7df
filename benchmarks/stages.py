"""What the optional stages cost on top of training, on the same tiny run.

Runs ``python -m hpc_llm +experiment=mpt_tiny`` (2 local ranks) three ways,
alternating, ``--repeats`` times: the plain run (``eval=heldout``), with the
post-train stage (``eval=full``: HF conversion + inference check) and with the
preflight (``preflight.enabled=true``: all-reduce table up to 1 MiB on gloo).
Prints each one's median wall clock as a ratio to the plain run, and the
seconds the stage itself reported in results.json.

    .venv/bin/python benchmarks/stages.py [--repeats 3] [--max-duration 40ba]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

VARIANTS = {
    "plain": ["eval=heldout"],
    "post-train": ["eval=full"],
    "preflight": ["eval=heldout", "preflight.enabled=true"],
}


def run(variant: str, runs: Path, max_duration: str) -> tuple[float, dict]:
    t0 = time.perf_counter()
    subprocess.run(
        [
            sys.executable,
            "-m",
            "hpc_llm",
            "+experiment=mpt_tiny",
            f"train.max_duration={max_duration}",
            "hydra.launcher.stream=false",
            *VARIANTS[variant],
        ],
        env=dict(os.environ, HPC_LLM_RUNS=str(runs / variant)),
        check=True,
        capture_output=True,
    )
    wall = time.perf_counter() - t0
    res = max((runs / variant).rglob("results.json"), key=os.path.getmtime)
    return wall, json.loads(res.read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-duration", default="40ba")
    args = ap.parse_args()
    walls: dict[str, list[float]] = {v: [] for v in VARIANTS}
    last: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(dir=os.environ.get("HPC_LLM_BENCH_DIR")) as tmp:
        run("plain", Path(tmp), args.max_duration)  # warm the tiny-corpus cache and the page cache
        for _ in range(args.repeats):
            for variant in VARIANTS:
                wall, last[variant] = run(variant, Path(tmp), args.max_duration)
                walls[variant].append(wall)
    base = statistics.median(walls["plain"])
    print(f"mpt_tiny, 2 local ranks, {args.max_duration}, {args.repeats} repeats (median wall clock)")
    for variant, values in walls.items():
        med = statistics.median(values)
        print(f"  {variant:10s} {med:7.2f} s   {med / base:5.3f}x plain")
    post = last["post-train"]
    print(
        f"  post-train: conversion_ok={post.get('conversion_ok')} inference_ok={post.get('inference_ok')} "
        f"inference_s={post['eval'].get('inference_s')} hf_model_bytes={post.get('hf_model_bytes')}"
    )
    pf = last["preflight"]["preflight"]["checks"]["allreduce"]
    print(f"  preflight: {len(pf['rows'])} message sizes, peak busbw {pf['peak_busbw_gbps']:.3f} GB/s (gloo, CPU)")


if __name__ == "__main__":
    main()
