"""The built-in health checks' measurements (in-job only: torch; see hpc_llm.builtin.health)."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from typing import Any

from hpc_llm.errors import CheckFailed
from hpc_llm.job.env import container_image
from hpc_llm.job.rank.preflight import gather, node_name
from hpc_llm.results import preflight


def _sync(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _device() -> Any:
    import torch

    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def time_all_reduce(size_bytes: int, iters: int, warmup: int, group: Any = None) -> float:
    """Seconds per all-reduce of ``size_bytes`` of float32, the slowest rank's view."""
    import torch
    import torch.distributed as dist

    device = _device()
    t = torch.ones(max(1, size_bytes // 4), dtype=torch.float32, device=device)
    for _ in range(warmup):
        dist.all_reduce(t, group=group)
    _sync(device)
    dist.barrier(group=group)
    t0 = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(t, group=group)
    _sync(device)
    elapsed = torch.tensor([(time.perf_counter() - t0) / iters], dtype=torch.float64, device=device)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX, group=group)
    return float(elapsed.item())


def allreduce(section: Any, ctx: Any) -> dict[str, Any]:
    import torch.distributed as dist

    n = dist.get_world_size()
    sizes = preflight.message_sizes(preflight.max_bytes(section.max_bytes, ctx.plan.device))
    rows = [preflight.row(s, time_all_reduce(s, section.iters, section.warmup), n) for s in sizes]
    peak = max(r["busbw_gbps"] for r in rows)
    out = {"ranks": n, "nodes": ctx.plan.nodes, "rows": rows, "peak_busbw_gbps": peak}
    threshold = section.min_busbw_gbps
    if threshold is None or n == 1:
        return out
    if peak < threshold:
        nodes = _slow_nodes_within(section, ctx, sizes[-1], threshold)
        out["per_node_busbw_gbps"] = nodes[1]
        raise CheckFailed(
            f"all-reduce peak busbw {peak:.3f} GB/s < preflight.min_busbw_gbps={threshold:g}", nodes[0], out
        )
    return out


def _slow_nodes_within(section: Any, ctx: Any, size: int, threshold: float) -> tuple[list[str], dict[str, float]]:
    """All-reduce inside each node: nodes below the threshold on their own are named.

    Ranks are placed in blocks (srun's default distribution), so node k holds
    ranks k*tasks_per_node ... (k+1)*tasks_per_node-1. Nothing is named when
    every node is fine alone (the network between them is the problem) or a
    node has a single rank.
    """
    import torch.distributed as dist

    tpn, nodes = ctx.plan.tasks_per_node, ctx.plan.nodes
    if tpn < 2 or nodes < 2:
        return [], {}
    names = gather(node_name())
    groups = [dist.new_group(list(range(k * tpn, (k + 1) * tpn))) for k in range(nodes)]
    mine = ctx.dist.rank // tpn
    seconds = time_all_reduce(size, section.iters, section.warmup, group=groups[mine])
    per_node = gather(preflight.busbw_gbps(size, seconds, tpn))
    by_node = {names[k * tpn]: round(per_node[k * tpn], 3) for k in range(nodes)}
    return sorted(n for n, bw in by_node.items() if bw < threshold), by_node


def gpu(section: Any, ctx: Any) -> dict[str, Any]:
    import torch

    if ctx.plan.device != "gpu":
        return {"skipped": "no GPUs requested (cluster.device=cpu)"}
    name = node_name()
    visible = torch.cuda.device_count()
    counts = gather((name, visible))
    short = sorted({n for n, c in counts if c < ctx.plan.gpus_per_node})
    if short:
        raise CheckFailed(f"fewer than resources.gpus_per_node={ctx.plan.gpus_per_node} GPUs visible", short)
    tflops = _matmul_tflops(section.matmul_size)
    per_rank = gather((name, ctx.dist.local_rank, tflops))
    out: dict[str, Any] = {
        "gpus_per_node": visible,
        "tflops_per_rank": [round(t, 1) for _, _, t in per_rank],
        "device_name": torch.cuda.get_device_name(),
        "nvidia_smi": _nvidia_smi() if ctx.dist.local_rank == 0 else None,
    }
    smi = gather(out["nvidia_smi"])
    ecc_bad = sorted({n for (n, _v), s in zip(counts, smi, strict=True) if s and s.get("uncorrected_ecc", 0) > 0})
    if ecc_bad:
        raise CheckFailed("uncorrected ECC errors reported by nvidia-smi", ecc_bad, out)
    if section.min_tflops is not None:
        slow = sorted({n for n, _lr, t in per_rank if t < section.min_tflops})
        if slow:
            worst = min(t for _, _, t in per_rank)
            raise CheckFailed(
                f"bf16 matmul {worst:.1f} TFLOP/s < preflight.min_tflops={section.min_tflops:g}", slow, out
            )
    return out


def _matmul_tflops(n: int, iters: int = 20) -> float:
    import torch

    a = torch.randn(n, n, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(n, n, dtype=torch.bfloat16, device="cuda")
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        a @ b
    torch.cuda.synchronize()
    return 2 * n**3 * iters / (time.perf_counter() - t0) / 1e12


def _nvidia_smi() -> dict[str, Any] | None:
    """ECC counters where the driver exposes them (XIDs live in the kernel log, not here)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    fields = "index,name,ecc.errors.uncorrected.volatile.total,temperature.gpu"
    try:  # never raise here: the other ranks are waiting to gather this
        proc = subprocess.run(
            [exe, f"--query-gpu={fields}", "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=60
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    if proc.returncode != 0:
        return {"error": proc.stderr.strip()[-300:]}
    rows = [[c.strip() for c in line.split(",")] for line in proc.stdout.strip().splitlines()]
    ecc = sum(int(r[2]) for r in rows if len(r) > 2 and r[2].isdigit())
    return {
        "gpus": [r[1] for r in rows if len(r) > 1],
        "uncorrected_ecc": ecc,
        "temperature_c": [int(r[3]) for r in rows if len(r) > 3 and r[3].isdigit()],
    }


def container(section: Any, ctx: Any) -> dict[str, Any]:
    """Every rank runs inside the configured image (set by apptainer as APPTAINER_CONTAINER)."""
    cfg = ctx.cfg.container
    if cfg.name == "none":
        return {"skipped": "container=none"}
    inside = container_image()
    seen = gather((node_name(), inside))
    outside = sorted({n for n, i in seen if not i})
    if outside:
        raise CheckFailed(f"ranks are not running inside container.image={cfg.image}", outside)
    from importlib import metadata

    versions = {d: metadata.version(d) for d in ("hpc-llm", "torch", "mosaicml", "llm-foundry")}
    return {"images": sorted({os.path.basename(i) for _, i in seen}), "versions": versions}
