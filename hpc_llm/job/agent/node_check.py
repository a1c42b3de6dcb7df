"""The checks a node can run alone, by its agent once warm: before it trains or waits as a spare.

A spare takes a lost node's place untested otherwise: a bad one costs the run another stop. So
every agent, once its training stack is imported, checks its own node and sends the result
with its ``warm`` message; the supervisor leaves out a node that failed, or whose compute
figure is under ``1 / straggler.factor`` of the other nodes' median (:func:`hpc_llm.job.supervisor.
spares.failed_checks`), before it is put in a layout. The checks:

* **container**: with ``container.name`` other than none, the agent runs inside the image
  (Apptainer sets ``APPTAINER_CONTAINER``);
* **GPUs**: with ``cluster.device=gpu``, ``nvidia-smi -L`` lists ``resources.gpus_per_node``
  GPUs (the agent itself never initialises CUDA: it forks its ranks);
* **compute**: a matmul benchmark (bf16 on a GPU, float32 on one CPU thread), the best of
  :data:`TRIALS` trials of :data:`TRIAL_S` each, in a forked child that is killed if it does not
  finish in :data:`TIMEOUT_S` (a hung GPU). A trial is sustained work, not one matmul: a node
  held back by a quota or a thermal limit runs a short burst at full speed (seen: a node held
  to a tenth of a CPU measured its best 1 ms matmul as fast as the others'); the best of three
  keeps a moment's contention from failing a node. About 0.8 s added to an agent's warm-up on
  CPU, 1.2 to 1.4 s on an H200 (the child's CUDA start; docs/design/verified/gpu.md).

The all-reduce check is the collective one (``preflight.checks``): a spare meets its peers only
when it takes a place. In-job only (torch, in the forked child).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from typing import Any

from hpc_llm.job.env import container_image

#: seconds the compute benchmark may take before the node fails it
TIMEOUT_S = 60.0
#: trials of the benchmark (the best counts), the seconds of work in each, the matrix sizes
TRIALS = 3
TRIAL_S = 0.25
CPU_N, GPU_N = 256, 8192


@dataclass(frozen=True)
class NodeCheck:
    #: the compute benchmark's best GFLOP/s (None: not measured)
    gflops: float | None = None
    #: why the node failed a check of its own (None: it passed)
    failed: str | None = None


def check(cfg: Any) -> NodeCheck:
    """Run the node's checks for the job's config ``cfg`` (the payload's)."""
    container = cfg.get("container") or {}
    if container.get("name", "none") != "none" and not container_image():
        return NodeCheck(failed=f"the agent is not running inside container.image={container.get('image')}")
    gpu = cfg.cluster.device == "gpu"
    if gpu:
        want = int(cfg.resources.gpus_per_node)
        have = _gpus()
        if have is not None and have < want:
            return NodeCheck(failed=f"nvidia-smi lists {have} GPU(s), fewer than resources.gpus_per_node={want}")
    return _benchmark(gpu)


def _gpus() -> int | None:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))


def _benchmark(gpu: bool) -> NodeCheck:
    """The best GFLOP/s of :data:`TRIALS` matmuls, measured in a forked child."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: measure, write one JSON line, leave without cleanup
        os.close(read)
        try:
            result: dict[str, Any] = {"gflops": _measure(gpu)}
        except BaseException as exc:  # noqa: BLE001 - the parent reports it
            result = {"error": f"{type(exc).__name__}: {exc}"}
        os.write(write, json.dumps(result).encode())
        os._exit(0)
    os.close(write)
    deadline = time.monotonic() + TIMEOUT_S
    chunks: list[bytes] = []
    try:
        while True:
            done, _ = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                return NodeCheck(failed=f"the compute check did not finish in {TIMEOUT_S:g} s")
            time.sleep(0.02)
        while chunk := os.read(read, 65536):
            chunks.append(chunk)
    finally:
        os.close(read)
    try:
        result = json.loads(b"".join(chunks) or b"{}")
    except ValueError:
        result = {}
    if "gflops" not in result:
        return NodeCheck(failed=f"the compute check failed: {result.get('error', 'no result')}")
    return NodeCheck(gflops=round(float(result["gflops"]), 2))


def _measure(gpu: bool) -> float:
    import torch

    if gpu:
        n, dtype, device = GPU_N, torch.bfloat16, "cuda"
    else:
        torch.set_num_threads(1)  # one core's figure: the nodes are compared, not summed
        n, dtype, device = CPU_N, torch.float32, "cpu"
    a = torch.randn(n, n, dtype=dtype, device=device)
    b = torch.randn(n, n, dtype=dtype, device=device)
    a @ b  # the first one pays for the allocations (and on a GPU, the kernel's load)
    best = 0.0
    for _ in range(TRIALS):
        done, start = 0, time.perf_counter()
        while True:
            a @ b
            if gpu:
                torch.cuda.synchronize()
            done += 1
            elapsed = time.perf_counter() - start
            if elapsed >= TRIAL_S:
                break
        best = max(best, 2 * n**3 * done / elapsed / 1e9)
    return best
