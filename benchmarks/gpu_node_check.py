"""The spare node's own check (hpc_llm/job/agent/node_check.py) on a real GPU, against a plain torch baseline.

Runs ``node_check.check`` as a warm agent does (torch imported, CUDA not initialised: the check forks)
for ``cluster.device=gpu`` with ``resources.gpus_per_node`` = the GPUs ``nvidia-smi -L`` lists (three
times: it must pass), then with one GPU more (it must fail, saying why), then an 8192 bf16 matmul in
this process (the mean of 10 after 3 warm-ups) as the baseline, and prints node_check's figure over it.
Without a GPU it says so and exits 0. Exit 1: a check did not do what it must.

    PYTHONPATH=$PWD python3 benchmarks/gpu_node_check.py
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from typing import Any

from hpc_llm.job.agent import node_check


class _Cfg(dict):
    """The payload's DictConfig as node_check reads it: ``.get()`` and attribute access."""

    def __getattr__(self, name: str) -> Any:
        return self[name]


def _cfg(gpus: int) -> Any:
    tree: dict[str, dict[str, Any]] = {
        "cluster": {"device": "gpu"},
        "resources": {"gpus_per_node": gpus},
        "container": {"name": "none"},
    }
    try:
        from omegaconf import OmegaConf

        return OmegaConf.create(tree)
    except ImportError:
        return _Cfg({k: _Cfg(v) for k, v in tree.items()})


def _baseline_tflops(n: int = node_check.GPU_N) -> float:
    import torch

    a = torch.randn(n, n, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(n, n, dtype=torch.bfloat16, device="cuda")
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(10):
        a @ b
    torch.cuda.synchronize()
    return 2 * n**3 * 10 / (time.perf_counter() - start) / 1e12


def main() -> int:
    exe = shutil.which("nvidia-smi")
    listed = subprocess.run([exe, "-L"], capture_output=True, text=True).stdout if exe else ""
    gpus = sum(1 for line in listed.splitlines() if line.startswith("GPU "))
    if not gpus:
        print("no GPU here (nvidia-smi " + ("lists none" if exe else "not found") + "): nothing to check")
        return 0
    import torch  # as the warm agent has: imported, CUDA not initialised before the fork

    print(f"nvidia-smi -L:\n{listed.rstrip()}\ntorch {torch.__version__}")
    print(f"node_check: GPU_N={node_check.GPU_N} TRIALS={node_check.TRIALS} TRIAL_S={node_check.TRIAL_S}")
    ok, figures = True, []
    for i in range(3):
        start = time.perf_counter()
        got = node_check.check(_cfg(gpus))
        wall = time.perf_counter() - start
        print(f"check gpus_per_node={gpus} #{i + 1}: gflops={got.gflops} failed={got.failed} wall={wall:.2f} s")
        ok &= got.failed is None and got.gflops is not None
        figures.append(got.gflops or 0.0)
    start = time.perf_counter()
    more = node_check.check(_cfg(gpus + 1))
    wall = time.perf_counter() - start
    print(f"check gpus_per_node={gpus + 1}: gflops={more.gflops} failed={more.failed!r} wall={wall:.2f} s")
    ok &= more.failed is not None and more.gflops is None
    assert not torch.cuda.is_initialized(), "the checks initialised CUDA in this process"
    base = _baseline_tflops()
    print(f"baseline torch bf16 {node_check.GPU_N}^3 matmul: {base:.1f} TFLOP/s (mean of 10 after 3 warm-ups)")
    print(f"node_check / baseline: {', '.join(f'{g / 1e3 / base:.3f}' for g in figures)}")
    print("OK" if ok else "UNEXPECTED: see above")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
