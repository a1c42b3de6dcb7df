"""Preflight arithmetic and tables (pure: the login node prints what the job measured).

All-reduce bandwidth is reported the way nccl-tests' ``all_reduce_perf``
does: ``algbw = bytes / time`` and ``busbw = algbw * 2(n-1)/n``, the traffic a
ring all-reduce puts on each link, comparable across rank counts.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from hpc_llm.errors import ConfigError
from hpc_llm.results.format import BYTES_UNIT, GB

MIN_BYTES = 8
DEFAULT_MAX_BYTES = {"gpu": 256 << 20, "cpu": 1 << 20}
DTYPE_BYTES = {"float": 4}


def max_bytes(value: int | None, device: str) -> int:
    return int(value) if value else DEFAULT_MAX_BYTES[device]


def message_sizes(limit: int) -> list[int]:
    """8 B, 16 B, ... up to ``limit`` (a power of two, at least 8)."""
    if limit < MIN_BYTES or limit & (limit - 1):
        raise ConfigError(f"preflight.max_bytes={limit}: must be a power of two >= {MIN_BYTES}")
    sizes, size = [], MIN_BYTES
    while size <= limit:
        sizes.append(size)
        size *= 2
    return sizes


def bus_factor(n_ranks: int) -> float:
    """2(n-1)/n: bytes each rank sends per byte reduced, in a ring all-reduce."""
    return 2.0 * (n_ranks - 1) / n_ranks


def algbw_gbps(size_bytes: int, seconds: float) -> float:
    return size_bytes / seconds / GB if seconds > 0 else 0.0


def busbw_gbps(size_bytes: int, seconds: float, n_ranks: int) -> float:
    return algbw_gbps(size_bytes, seconds) * bus_factor(n_ranks)


def row(size_bytes: int, seconds: float, n_ranks: int, dtype: str = "float") -> dict[str, Any]:
    return {
        "size": size_bytes,
        "count": max(1, size_bytes // DTYPE_BYTES[dtype]),
        "type": dtype,
        "redop": "sum",
        "time_us": round(seconds * 1e6, 2),
        "algbw_gbps": round(algbw_gbps(size_bytes, seconds), 3),
        "busbw_gbps": round(busbw_gbps(size_bytes, seconds, n_ranks), 3),
    }


def format_table(rows: Iterable[Mapping[str, Any]], n_ranks: int, nodes: int | None = None) -> str:
    """nccl-tests' layout: sizes in bytes, bandwidths in decimal GB/s (as every byte figure here)."""
    rows = list(rows)
    rate = f"({BYTES_UNIT}/s)"
    where = f"{n_ranks} ranks" + (f" on {nodes} node(s)" if nodes else "")
    lines = [
        f"# all_reduce over {where} (hpc_llm preflight; busbw = algbw x 2(n-1)/n)",
        f"#{'size':>12} {'count':>12} {'type':>6} {'redop':>6} {'time':>10} {'algbw':>8} {'busbw':>8}",
        f"#{'(B)':>12} {'(elements)':>12} {'':>6} {'':>6} {'(us)':>10} {rate:>8} {rate:>8}",
    ]
    for r in rows:
        lines.append(
            f" {r['size']:>12} {r['count']:>12} {r['type']:>6} {r['redop']:>6} {r['time_us']:>10.1f} "
            f"{r['algbw_gbps']:>8.2f} {r['busbw_gbps']:>8.2f}"
        )
    peak = max((r["busbw_gbps"] for r in rows), default=0.0)
    lines.append(f"# peak busbw: {peak:.2f} {BYTES_UNIT}/s")
    return "\n".join(lines) + "\n"


def summary(preflight: Mapping[str, Any]) -> str:
    """What ``hpc-llm preflight`` prints from a results.json's ``preflight``."""
    out = []
    checks = preflight.get("checks") or {}
    ar = checks.get("allreduce") or {}
    if ar.get("rows"):
        out.append(format_table(ar["rows"], ar.get("ranks", 0), ar.get("nodes")))
    gpu = checks.get("gpu") or {}
    if gpu.get("tflops_per_rank"):
        vals = gpu["tflops_per_rank"]
        out.append(f"# bf16 matmul TFLOP/s per GPU: min {min(vals):.1f}, max {max(vals):.1f} ({len(vals)} GPUs)\n")
    for name, result in checks.items():
        if isinstance(result, Mapping) and result.get("skipped"):
            out.append(f"# {name}: skipped ({result['skipped']})\n")
    verdict = "passed" if preflight.get("passed") else f"FAILED: {preflight.get('reason')}"
    bad = preflight.get("bad_nodes") or []
    out.append(f"# preflight {verdict}" + (f" (nodes: {', '.join(bad)})" if bad else "") + "\n")
    return "".join(out)
