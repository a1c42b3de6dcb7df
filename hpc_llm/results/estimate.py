"""Time and GPU-hours to train, from model FLOPs, the cluster's peak, an MFU and scaling efficiency.

    time = tokens x FLOPs/token / (GPUs x peak FLOP/s x MFU x scaling efficiency)

FLOPs/token is LLM Foundry's accounting (hpc_llm.config.flops: 6N + 12 L d T), for MPT and
hf_causal_lm models alike. Every assumption is printed with where it came from: a flag, a
measured results.json or sweep, or a documented default below. Scaling efficiency is that of
N nodes against one, so one node is its own baseline (1.0) whatever ``--efficiency`` says.
Pure (login node).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpc_llm.config.flops import model_size, train_seq_len
from hpc_llm.errors import ConfigError
from hpc_llm.results.format import GB, duration, human_bytes

#: MFU by model size on H100 80GB, bf16, seq 2048, FULL_SHARD, from LLM Foundry's
#: published benchmarks (scripts/train/benchmarking/README.md, "H100 80GB BF16"):
#: 760m 34.9%, 1b 41.8%, 3b 40.8%, 7b 46.4%, 13b 39.9%, 30b 43.9%, 70b 42.6%.
#: 125m and 350m have no bf16 entry there; 30% and 33% are our assumption
#: (small models are bound by kernel launches and communication, not FLOPs).
DEFAULT_MFU: list[tuple[float, float, str]] = [
    (200e6, 0.30, "assumed for ~125M (no published H100 bf16 figure)"),
    (500e6, 0.33, "assumed for ~350M (no published H100 bf16 figure)"),
    (1.0e9, 0.349, "LLM Foundry H100 bf16 benchmark, 760m"),
    (2.0e9, 0.418, "LLM Foundry H100 bf16 benchmark, 1b on 8 GPUs"),
    (5.0e9, 0.408, "LLM Foundry H100 bf16 benchmark, 3b"),
    (10e9, 0.464, "LLM Foundry H100 bf16 benchmark, 7b"),
    (20e9, 0.399, "LLM Foundry H100 bf16 benchmark, 13b"),
    (45e9, 0.439, "LLM Foundry H100 bf16 benchmark, 30b"),
    (float("inf"), 0.426, "LLM Foundry H100 bf16 benchmark, 70b on 64 GPUs"),
]
#: Scaling efficiency of N nodes against one when nothing was measured: 0.90,
#: a typical figure for FSDP on InfiniBand at a fixed global batch (the seeds'
#: MPT-7B sweep measured 1.33, 1.07 and 0.72 at 2, 4 and 8 nodes).
DEFAULT_EFFICIENCY = 0.90
CHINCHILLA_TOKENS_PER_PARAM = 20

#: Bytes a checkpoint holds per parameter: fp32 weights plus Adam's two fp32
#: moments (LLM Foundry's decoupled_adamw); sharded, each rank writes its share.
CHECKPOINT_BYTES_PER_PARAM = 12
#: Write bandwidth one node gets from a parallel filesystem (Lustre, GPFS, Weka)
#: for a sharded checkpoint: an assumption, 2 GB/s per client node.
WRITE_GBPS_PER_NODE = 2.0
#: Mean time between failures of one 8-GPU node: Meta's Llama 3 report (2024,
#: section 3.3.4) counts 419 unexpected interruptions in 54 days on 16,384 H100s
#: (2,048 nodes): 54 x 2048 / 419 = 264 node-days.
NODE_MTBF_DAYS = 54 * 2048 / 419
#: checkpoints kept (save_num_checkpoints_to_keep): the latest, and two to fall
#: back on should the latest be damaged
KEEP_CHECKPOINTS = 3


def kept(keep: int | None) -> str:
    """What the run keeps on disk (``checkpoint.keep``, which a yaml's save_num_checkpoints_to_keep sets)."""
    if keep is None:
        return f"keep the last {KEEP_CHECKPOINTS}"
    if keep > 0:
        return f"the run keeps the last {keep} (checkpoint.keep)"
    return f"the run keeps every checkpoint (checkpoint.keep={keep}; {KEEP_CHECKPOINTS} would bound the disk)"


@dataclass(frozen=True)
class Assumption:
    value: float
    source: str


@dataclass(frozen=True)
class Estimate:
    model: str
    n_params: int
    flops_per_token: float
    tokens: Assumption
    nodes: int
    gpus: int
    #: None: a CPU profile, or one without a peak; the estimate then has no times
    peak_flops_per_gpu: Assumption | None
    mfu: Assumption
    efficiency: Assumption
    #: global batch x sequence length, when the config says (for the checkpoint interval)
    tokens_per_batch: float | None = None
    #: price of one GPU-hour, when known
    price_per_gpu_hour: Assumption | None = None
    #: where the parameter count came from, and the FLOPs formula it allows
    model_source: str = ""
    flops_formula: str = "6N + 12 L d T"
    #: why there are no times (peak_flops_per_gpu is None)
    untimed: str | None = None

    @property
    def tokens_per_sec(self) -> float:
        if self.peak_flops_per_gpu is None:
            raise ValueError(f"no time estimate: {self.untimed}")
        return self.gpus * self.peak_flops_per_gpu.value * self.mfu.value * self.efficiency.value / self.flops_per_token

    @property
    def seconds(self) -> float:
        return self.tokens.value / self.tokens_per_sec

    @property
    def gpu_hours(self) -> float:
        return self.seconds * self.gpus / 3600.0

    @property
    def cost(self) -> float | None:
        return self.gpu_hours * self.price_per_gpu_hour.value if self.price_per_gpu_hour else None

    @property
    def cost_per_billion_tokens(self) -> float | None:
        cost = self.cost
        return cost / (self.tokens.value / 1e9) if cost is not None else None


@dataclass(frozen=True)
class CheckpointPlan:
    """How big a checkpoint is, how long it takes to save, and how often to save."""

    bytes: float
    save_s: float
    #: the job's mean time between failures (node MTBF / nodes)
    mtbf_s: float
    #: Young's interval sqrt(2 x save x MTBF): the save cost balances the work lost
    interval_s: float
    interval_batches: int
    keep: int = KEEP_CHECKPOINTS


def checkpoint_save_s(n_params: float, nodes: int) -> float:
    """Seconds to save a sharded checkpoint of ``n_params`` parameters (weights and Adam's
    moments, CHECKPOINT_BYTES_PER_PARAM) from ``nodes`` nodes at WRITE_GBPS_PER_NODE each
    (also ``hpc-llm doctor``'s guess when no run has measured one)."""
    return n_params * CHECKPOINT_BYTES_PER_PARAM / (max(1, nodes) * WRITE_GBPS_PER_NODE * GB)


def checkpoint_plan(e: Estimate, tokens_per_batch: float) -> CheckpointPlan:
    """When to checkpoint a run like ``e`` (J. W. Young, "A first order approximation to the
    optimum checkpoint interval", CACM 1974): the save time and the failure rate of
    ``e.nodes`` nodes decide it, not the epoch."""
    size = e.n_params * CHECKPOINT_BYTES_PER_PARAM
    save = checkpoint_save_s(e.n_params, e.nodes)
    mtbf = NODE_MTBF_DAYS * 86400 / e.nodes
    interval = (2 * save * mtbf) ** 0.5
    batches = max(1, round(interval * e.tokens_per_sec / tokens_per_batch))
    return CheckpointPlan(size, save, mtbf, interval, batches)


def default_mfu(n_params: float) -> Assumption:
    for limit, mfu, source in DEFAULT_MFU:
        if n_params <= limit:
            return Assumption(mfu, f"default: {source}")
    raise AssertionError("unreachable: the last limit is infinite")  # pragma: no cover


def tokens_from_train(train: dict[str, Any]) -> Assumption | None:
    """Tokens the config trains for, when max_duration says (ba or tok)."""
    dur = str(train.get("max_duration") or "")
    gbs, seq = train.get("global_train_batch_size"), train.get("max_seq_len")
    if dur.endswith("tok") and dur[:-3].isdigit():
        return Assumption(float(dur[:-3]), f"train.max_duration={dur}")
    if dur.endswith("ba") and dur[:-2].isdigit() and gbs and seq:
        return Assumption(float(dur[:-2]) * gbs * seq, f"train.max_duration={dur} x batch {gbs} x seq {seq}")
    return None


def _why_not_duration(train: dict[str, Any]) -> str:
    """Why max_duration gave no token count: a finetune's epochs are far fewer tokens than
    Chinchilla's, and only the user knows how many."""
    dur = str(train.get("max_duration") or "")
    return f" (train.max_duration={dur} is not in ba or tok; pass --tokens)" if dur else ""


def measured_mfu(results_path: Path) -> Assumption:
    data = json.loads(Path(results_path).read_text())
    if data.get("mfu") is None:
        raise ConfigError(f"--mfu-from={results_path}: results.json has no mfu (CPU run, or not finished)")
    return Assumption(float(data["mfu"]), f"measured: {results_path} ({data.get('nodes')} node(s))")


def measured_efficiency(sweep_dir: Path, nodes: int) -> Assumption | None:
    from hpc_llm.results.report import build

    points = sorted(
        (row["Nodes"], row["Efficiency"])
        for g in build(sweep_dir)
        for row in g.rows
        if row["Efficiency"] is not None and isinstance(row["Nodes"], int)
    )
    if not points:
        return None
    exact = [e for n, e in points if n == nodes]
    if exact:
        return Assumption(exact[-1], f"measured at {nodes} node(s) in {sweep_dir}")
    n, e = max(p for p in points if p[0] <= nodes) if any(p[0] <= nodes for p in points) else points[0]
    return Assumption(e, f"measured at {n} node(s) in {sweep_dir}, carried to {nodes}")


def estimate(
    train: dict[str, Any],
    *,
    nodes: int,
    gpus_per_node: int,
    peak_flops_per_gpu: float | None,
    tokens: float | None = None,
    mfu: float | None = None,
    mfu_from: Path | None = None,
    efficiency: float | None = None,
    sweep: Path | None = None,
    from_experiment: bool = True,
    price_per_gpu_hour: float | None = None,
    price_source: str = "--price",
    params: float | None = None,
) -> Estimate:
    """``from_experiment``: the config is a real experiment, so its
    max_duration says how many tokens to train (else: Chinchilla). ``params``: the model's
    parameter count as the user gives it (``--params``), for a model hpc_llm cannot read.

    An experiment on a profile without GPUs or a peak (``mpt_tiny`` on the local CPU profile)
    still gets its size, FLOPs and tokens, without times; a bare model there is an error, since
    the only question it asks is how long on GPUs."""
    if "model" not in train:
        raise ConfigError("train.model is not set; pick one with model=mpt-70b or +experiment=NAME")
    if nodes < 1:
        raise ConfigError(f"resources.nodes={nodes}: must be >= 1")
    untimed = None
    if gpus_per_node < 1:
        untimed = "resources.gpus_per_node is 0: estimates are for GPU clusters; use cluster=h100"
    elif not peak_flops_per_gpu:
        untimed = "cluster.peak_flops_per_gpu is not set; use cluster=h100 or set it (FLOP/s, bf16 dense)"
    if untimed and not from_experiment:
        raise ConfigError(untimed)
    if not from_experiment:
        # Only a model was picked: train at the model's own context length.
        train = {**train, "max_seq_len": train["model"].get("max_seq_len", train.get("max_seq_len"))}
    seq = train_seq_len(train)
    size = model_size(train["model"], seq, params)
    n, fpt = size.n_params, size.flops_per_token(seq)
    tok = (
        Assumption(float(tokens), "--tokens")
        if tokens
        else (tokens_from_train(train) if from_experiment else None)
        or Assumption(
            float(CHINCHILLA_TOKENS_PER_PARAM * n),
            f"default: Chinchilla, {CHINCHILLA_TOKENS_PER_PARAM} tokens per parameter"
            + (_why_not_duration(train) if from_experiment else ""),
        )
    )
    if mfu is not None:
        if not 0 < mfu <= 1:
            raise ConfigError(f"--mfu={mfu}: must be in (0, 1]")
        m = Assumption(mfu, "--mfu")
    elif mfu_from is not None:
        m = measured_mfu(mfu_from)
    else:
        m = default_mfu(n)
    if efficiency is not None and not 0 < efficiency <= 2:
        raise ConfigError(f"--efficiency={efficiency}: must be in (0, 2]")
    if nodes == 1:
        # efficiency is N nodes against one: a measured or given figure describes more nodes
        eff = Assumption(1.0, "one node: no inter-node scaling")
    elif efficiency is not None:
        eff = Assumption(efficiency, "--efficiency")
    else:
        measured = measured_efficiency(sweep, nodes) if sweep is not None else None
        eff = measured or Assumption(
            DEFAULT_EFFICIENCY, "default: typical FSDP over InfiniBand at a fixed global batch"
        )
    return Estimate(
        model=size.label,
        n_params=n,
        flops_per_token=fpt,
        tokens=tok,
        nodes=nodes,
        gpus=nodes * gpus_per_node,
        peak_flops_per_gpu=(
            None if untimed else Assumption(float(peak_flops_per_gpu or 0), "cluster.peak_flops_per_gpu")
        ),
        mfu=m,
        efficiency=eff,
        model_source=size.source,
        flops_formula=size.formula,
        untimed=untimed,
        price_per_gpu_hour=_price(price_per_gpu_hour, price_source),
        tokens_per_batch=(
            float(train["global_train_batch_size"]) * float(train["max_seq_len"])
            if from_experiment and train.get("global_train_batch_size") and train.get("max_seq_len")
            else None
        ),
    )


def _price(value: float | None, source: str) -> Assumption | None:
    if value is None:
        return None
    if value <= 0:
        raise ConfigError(f"{source}={value}: must be a price > 0 per GPU-hour")
    return Assumption(float(value), source)


def money(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:,.2f}"


def render(estimates: list[Estimate], keep: int | None = None) -> str:
    """The estimate as text; ``keep``: the checkpoints the run keeps (``checkpoint.keep``)."""
    e0 = estimates[0]
    lines = [
        f"{e0.model}: {e0.n_params:,} parameters, {e0.flops_per_token:.4g} FLOPs/token ({e0.flops_formula})"
        + (f"  [{e0.model_source}]" if e0.model_source else ""),
        f"tokens: {e0.tokens.value:.4g}  [{e0.tokens.source}]",
    ]
    if e0.peak_flops_per_gpu is None:
        return (
            "\n".join(
                [
                    *lines,
                    f"training FLOPs: {e0.tokens.value * e0.flops_per_token:.4g} (tokens x FLOPs/token)",
                    f"checkpoints: {human_bytes(e0.n_params * CHECKPOINT_BYTES_PER_PARAM)} each "
                    f"({CHECKPOINT_BYTES_PER_PARAM} B/parameter: fp32 weights and Adam moments)",
                    f"time: not estimated; {e0.untimed}",
                ]
            )
            + "\n"
        )
    lines += [
        f"peak: {e0.peak_flops_per_gpu.value / 1e12:.0f} TFLOP/s per GPU  [{e0.peak_flops_per_gpu.source}]",
        f"MFU: {e0.mfu.value:.1%}  [{e0.mfu.source}]",
        (
            f"price: {e0.price_per_gpu_hour.value:g} per GPU-hour  [{e0.price_per_gpu_hour.source}]"
            if e0.price_per_gpu_hour
            else "price: none (set cluster.price_per_gpu_hour or pass --price for the cost columns)"
        ),
        "",
        "| nodes | GPUs | scaling efficiency | tokens/s | time | GPU-hours | cost | cost per 1B tokens |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for e in estimates:
        cost, per_b = e.cost, e.cost_per_billion_tokens
        lines.append(
            f"| {e.nodes} | {e.gpus} | {e.efficiency.value:.2f} ({e.efficiency.source}) | {e.tokens_per_sec:,.0f} | "
            f"{duration(e.seconds)} | {e.gpu_hours:,.0f} | {money(cost) if cost is not None else '-'} | "
            f"{money(per_b) if per_b is not None else '-'} |"
        )
    if e0.tokens_per_batch:
        lines += [
            "",
            f"checkpoints: {human_bytes(e0.n_params * CHECKPOINT_BYTES_PER_PARAM)} each "
            f"({CHECKPOINT_BYTES_PER_PARAM} B/parameter: fp32 weights and Adam moments), written sharded at "
            f"{WRITE_GBPS_PER_NODE:g} GB/s per node (assumed); a node fails every {NODE_MTBF_DAYS:.0f} days "
            "(Llama 3 report); interval = sqrt(2 x save x MTBF) (Young 1974); " + kept(keep),
            "",
            "| nodes | save | job MTBF | checkpoint every | batches |",
            "|---|---|---|---|---|",
        ]
        for e in estimates:
            plan = checkpoint_plan(e, e.tokens_per_batch or 1.0)
            lines.append(
                f"| {e.nodes} | {duration(plan.save_s)} | {duration(plan.mtbf_s)} | {duration(plan.interval_s)} | "
                f"{plan.interval_batches:,} |"
            )
    return "\n".join(lines) + "\n"


def compare(sweep_dir: Path, *, mfu: float | None, peak_flops_per_gpu: float | None, efficiency: float | None) -> str:
    """Each finished run of a sweep beside what the estimator would have said of it: the same
    tokens (what the run trained), model, node and GPU (rank, on CPU) counts; the time and the
    GPU-hours it actually used (Slurm accounting's AllocTRES x Elapsed over every attempt)."""
    import yaml

    from hpc_llm.results.report import _accounting, find_runs
    from hpc_llm.slurm.accounting import resource_hours

    runs = [r for r in find_runs(Path(sweep_dir)) if r.status == "completed"]
    if not runs:
        raise ConfigError(f"--compare {sweep_dir}: no completed runs there")
    acct = _accounting(runs)
    lines = [
        "| run | nodes | GPUs / ranks | tokens | MFU assumed | estimated | actual (train) | actual / est. "
        "| estimated GPU-hours | used (Slurm) | used / est. |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        res = r.results
        cfg_path = r.run_dir / ".hydra" / "config.yaml"
        profile = (yaml.safe_load(cfg_path.read_text()) or {}).get("cluster", {}) if cfg_path.is_file() else {}
        peak = peak_flops_per_gpu or profile.get("peak_flops_per_gpu")
        gpus = int(res.get("nodes") or 1) * int(res.get("gpus_per_node") or 0) or int(res.get("world_size") or 1)
        tokens, fpt = res.get("tokens_done"), res.get("flops_per_token")
        m = mfu if mfu is not None else (default_mfu(res["n_params"]).value if res.get("n_params") else None)
        one_node = (res.get("nodes") or 1) == 1  # its own baseline, as in estimate()
        eff = 1.0 if one_node else (efficiency if efficiency is not None else DEFAULT_EFFICIENCY)
        est_s = tokens * fpt / (gpus * peak * m * eff) if tokens and fpt and peak and m else None
        actual = res.get("train_s")
        attempts = [a for j in dict.fromkeys(r.job_ids) for a in acct.get(j, [])]
        used, unit = resource_hours(attempts) if attempts else (None, "")
        est_h = est_s * gpus / 3600 if est_s else None
        lines.append(
            f"| {r.run_dir.name} | {res.get('nodes')} | {gpus} | {tokens or '-'} | {f'{m:.1%}' if m else '-'} | "
            f"{duration(est_s, decimals=1) if est_s else '-'} | {duration(actual, decimals=1) if actual else '-'} | "
            f"{f'{actual / est_s:.2f}' if actual and est_s else '-'} | {f'{est_h:.3g}' if est_h else '-'} | "
            f"{f'{used:.3g} {unit}' if used is not None else '-'} | "
            f"{f'{used / est_h:.2f}' if used and est_h else '-'} |"
        )
    return "\n".join(lines) + "\n"
