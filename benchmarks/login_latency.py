"""Login-node latency: a no-wait submit of a 4-point sweep, and what it imports.

Needs a Slurm cluster: uses $SLURM_CONF if set, else starts a dev cluster
under ~/.hpc_llm/bench-cluster (and stops it afterwards). Prints the median
wall time of

    python -m hpc_llm +experiment=mpt_tiny hydra/launcher=slurm train.max_duration=1ba,2ba,3ba,4ba

(goal <= 2 s), the same against four bare `sbatch --wrap` calls as a baseline
ratio, and proof from `python -X importtime` that the submitting process
imports no torch / composer / llmfoundry. Submitted jobs are cancelled.

    .venv/bin/python benchmarks/login_latency.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SWEEP = [
    "+experiment=mpt_tiny",
    "hydra/launcher=slurm",
    "train.max_duration=1ba,2ba,3ba,4ba",
    "hydra.launcher.partition=low",
]
IMPORT_LINE = re.compile(r"import time:\s+(\d+) \|\s+(\d+) \|(\s*)(\S+)")
HEAVY = ("torch", "composer", "llmfoundry", "streaming", "transformers")


def job_ids(text: str) -> list[str]:
    return re.findall(r"submitted Slurm job (\d+)", text)


def timed(cmd: list[str], env: dict[str, str]) -> tuple[float, subprocess.CompletedProcess[str]]:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    return time.perf_counter() - t0, proc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    started = None
    env = dict(os.environ)
    if not env.get("SLURM_CONF"):
        from hpc_llm.slurm import devcluster

        root = Path.home() / ".hpc_llm" / "bench-cluster"
        started = devcluster.up(root=root, nodes=2, ctld_port=26817)
        env.update(started.env())
    runs = Path(tempfile.mkdtemp(prefix="login-latency-", dir=str(Path.home() / ".hpc_llm")))
    env.update(HPC_LLM_RUNS=str(runs), HPC_LLM_HOME=str(runs / "home"))
    submitted: list[str] = []
    try:
        walls, bases = [], []
        for _ in range(args.repeats):
            wall, proc = timed([sys.executable, "-m", "hpc_llm", *SWEEP], env)
            ids = job_ids(proc.stdout)
            assert len(ids) == 4, proc.stdout
            submitted += ids
            walls.append(wall)
            t0 = time.perf_counter()
            for _ in range(4):
                out = subprocess.run(
                    ["sbatch", "--parsable", "-p", "low", "--wrap", "true"],
                    env=env,
                    capture_output=True,
                    text=True,
                    check=True,
                )
                submitted.append(out.stdout.strip().split(";")[0])
            bases.append(time.perf_counter() - t0)
            subprocess.run(["scancel", *submitted], env=env, capture_output=True)
        _, proc = timed([sys.executable, "-X", "importtime", "-m", "hpc_llm", *SWEEP], env)
        submitted += job_ids(proc.stdout)
        modules = [m.group(4) for m in IMPORT_LINE.finditer(proc.stderr)]
        heavy = sorted({m for m in modules if m.split(".")[0] in HEAVY})
        costs = sorted(
            ((int(m.group(2)), m.group(4)) for m in IMPORT_LINE.finditer(proc.stderr) if not m.group(3).strip(" ")),
            reverse=True,
        )[:6]
    finally:
        subprocess.run(["scancel", *submitted], env=env, capture_output=True)
        if started is not None:
            from hpc_llm.slurm import devcluster

            devcluster.down(started.root)
    med, base = statistics.median(walls), statistics.median(bases)
    print(
        f"no-wait submit of a 4-point sweep: median {med:.2f} s over {args.repeats} (goal <= 2 s); "
        f"min {min(walls):.2f} s, max {max(walls):.2f} s"
    )
    print(f"baseline, 4 bare `sbatch --wrap` calls: median {base:.2f} s -> ratio {med / base:.1f}x")
    print(
        f"modules imported by the submitting process: {len(modules)}; "
        f"torch/composer/llmfoundry/streaming/transformers among them: {heavy or 'none'}"
    )
    print("largest top-level imports (cumulative us): " + ", ".join(f"{n} {c}" for c, n in costs))
    if heavy:
        sys.exit(1)


if __name__ == "__main__":
    main()
