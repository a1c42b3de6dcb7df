"""Login-side validation: a composed config -> a ResolvedJob, or one ConfigError.

Runs for every job of a sweep before anything is created or submitted (from
the hpc_llm sweeper), and again inside the job. Pure: no training stack.
"""

from __future__ import annotations

import json
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from hpc_llm.config.llmfoundry_keys import TRAIN_CONFIG_KEYS
from hpc_llm.config.plan import JobPlan, make_plan
from hpc_llm.errors import ConfigError, warn_once
from hpc_llm.paths import cache_dir
from hpc_llm.plugins.base import (
    CheckpointBackend,
    ContainerRuntime,
    DataSource,
    Evaluator,
    HealthCheck,
    HostPath,
    Mounts,
    ParallelismStrategy,
    Trainer,
)
from hpc_llm.plugins.manager import get_plugins


@dataclass(frozen=True)
class ResolvedJob:
    plan: JobPlan
    data: DataSource
    parallelism: ParallelismStrategy
    checkpoint: CheckpointBackend
    evaluators: tuple[Evaluator, ...]
    container: ContainerRuntime
    #: the training stack (``trainer.name``)
    trainer: Trainer
    health_checks: tuple[HealthCheck, ...] = ()

    def mounts(self, cfg: DictConfig) -> Mounts:
        """The host paths the job's tasks use: what the data source, checkpoint
        backend and evaluators declare, and hpc_llm's cache (pure)."""
        if self.plan.run_dir is None:
            raise ValueError("mounts need a run directory")
        paths = [*self.data.host_paths(cfg.data, self.plan), *self.checkpoint.host_paths(cfg.checkpoint, self.plan)]
        for ev in self.evaluators:
            paths += ev.host_paths(cfg.eval, self.plan)
        paths.append(HostPath(str(cache_dir().expanduser().resolve()), "hpc_llm cache", created_by_job=True))
        return Mounts(
            run_dir=str(Path(self.plan.run_dir).resolve()),
            paths=tuple(paths),
            scratch=str(cfg.cluster.scratch) if cfg.cluster.scratch else None,
            gpus=self.plan.device == "gpu",
        )


#: LLM Foundry's own words for a key TrainConfig does not have (llmfoundry.utils.config_utils)
FOUNDRY_ADVICE = (
    "Please check your yaml to ensure these parameters are necessary. Please place any variables under the "
    "`variables` key."
)


def check_train_keys(train: Mapping[str, object], source: str = "") -> None:
    """Every key of ``train`` is one of LLM Foundry's TrainConfig: all unknown ones in one line,
    each with the closest real key, and LLM Foundry's own advice (``source``: ``yaml=PATH``)."""
    import difflib

    unknown = sorted(str(k) for k in train if k not in TRAIN_CONFIG_KEYS)
    if not unknown:
        return
    each = []
    for key in unknown:
        close = difflib.get_close_matches(key, TRAIN_CONFIG_KEYS, n=2, cutoff=0.75)
        each.append(f"train.{key}" + (f" (did you mean {' or '.join(close)}?)" if close else ""))
    what = "is not an LLM Foundry train-config key" if len(unknown) == 1 else "are not LLM Foundry train-config keys"
    raise ConfigError(
        f'{source + ": " if source else ""}{", ".join(each)} {what}; LLM Foundry: "Unused parameters {unknown} '
        f'found in cfg. {FOUNDRY_ADVICE}" (as train.variables.<name>; the allowed keys are '
        "llmfoundry.utils.config_utils.TrainConfig's)"
    )


#: len(tokenizer) of hub tokenizers the shipped experiments use (their tokenizer.json
#: is not on the login node); local tokenizer directories are counted instead
KNOWN_TOKENIZER_SIZES = {
    "EleutherAI/gpt-neox-20b": 50277,
    "mosaicml/mpt-7b": 50277,
    "mosaicml/mpt-30b": 50277,
}


def tokenizer_size(name: str) -> int | None:
    """Tokens in a tokenizer (regular + added), from its tokenizer.json; None if unknown here."""
    path = Path(str(name)).expanduser() / "tokenizer.json"
    try:
        st = path.stat()
    except OSError:
        st = None
    if st is None or not stat.S_ISREG(st.st_mode):
        return KNOWN_TOKENIZER_SIZES.get(str(name))
    # every point of a sweep asks (~4 ms a parse of the tiny corpus's): the answer is kept
    # for the file as it is (a rewritten file has another mtime or size)
    key = (str(path), st.st_mtime_ns, st.st_size, st.st_ino)
    if key not in _TOKENIZER_SIZES:
        _TOKENIZER_SIZES[key] = _count_tokens(path)
    return _TOKENIZER_SIZES[key]


_TOKENIZER_SIZES: dict[tuple[str, int, int, int], int | None] = {}


def _count_tokens(path: Path) -> int | None:
    data = json.loads(path.read_text(encoding="utf-8"))
    ids = list((data.get("model") or {}).get("vocab", {}).values())
    ids += [t.get("id", -1) for t in data.get("added_tokens") or []]
    return max(ids) + 1 if ids else None


def check_vocab(train: Mapping[str, Any]) -> None:
    """A tokenizer with more tokens than the model's embedding fails at the first batch."""
    model = train.get("model") or {}
    if model.get("name") != "mpt_causal_lm" or not model.get("vocab_size"):
        return  # pretrained HF models bring their own vocabulary
    tok = (train.get("tokenizer") or {}).get("name")
    n = tokenizer_size(tok) if tok else None
    vocab = int(model["vocab_size"])
    if n is not None and n > vocab:
        padded = -(-n // 64) * 64
        raise ConfigError(
            f"train.tokenizer.name={tok!r} has {n} tokens but train.model.vocab_size={vocab}; "
            f"allowed: vocab_size >= {n} (e.g. {padded}, a multiple of 64), or a smaller tokenizer"
        )


def batch_split(global_batch: int, micro: object, world_size: int) -> tuple[int, object, object]:
    """(per-rank batch, micro-batch, gradient accumulation) as LLM Foundry derives them.

    The global batch is fixed across node counts; each rank gets
    ``global / world`` samples in ``grad_accum`` micro-batches. Unlike LLM
    Foundry (which rounds the accumulation up and trains on a short last
    micro-batch), an uneven split is an error here, before submitting.
    """
    if isinstance(global_batch, bool) or not isinstance(global_batch, int) or global_batch < 1:
        raise ConfigError(f"train.global_train_batch_size={global_batch!r}: must be an integer >= 1")
    if global_batch % world_size:
        raise ConfigError(
            f"train.global_train_batch_size={global_batch} is not divisible by the world size {world_size}; "
            f"allowed: a multiple of {world_size} (or another node count)"
        )
    per_rank = global_batch // world_size
    if micro == "auto":
        return per_rank, "auto", "auto"
    if isinstance(micro, bool) or not isinstance(micro, int) or micro < 1:
        raise ConfigError(f"train.device_train_microbatch_size={micro!r}: must be an integer >= 1 or 'auto'")
    micro = min(micro, per_rank)  # LLM Foundry lowers it the same way
    if per_rank % micro:
        raise ConfigError(
            f"train.global_train_batch_size={global_batch} is not divisible by world size {world_size} x "
            f"micro-batch {micro} ({per_rank} samples per rank); allowed: a multiple of {world_size * micro}, "
            "or a micro-batch that divides the per-rank batch"
        )
    return per_rank, micro, per_rank // micro


#: preflight keys that only mean something when the checks run
PREFLIGHT_THRESHOLDS = ("min_busbw_gbps", "min_tflops")


def check_preflight_off(preflight: DictConfig) -> None:
    """A threshold given while the checks are off would be silently ignored: say so."""
    given = [f"preflight.{k}={preflight[k]}" for k in PREFLIGHT_THRESHOLDS if preflight[k] is not None]
    if given:
        raise ConfigError(
            f"{', '.join(given)} is ignored while preflight.enabled=false; allowed: add preflight.enabled=true "
            "to run the checks before training (or `hpc-llm preflight` to run them alone), or drop the threshold"
        )


WATCHDOG_ACTIONS = ("warn", "requeue")


def check_watchdog(cfg: DictConfig) -> None:
    w = cfg.watchdog
    if w.action not in WATCHDOG_ACTIONS:
        raise ConfigError(f"watchdog.action={w.action!r}; allowed: {', '.join(WATCHDOG_ACTIONS)}")
    if not 0 < float(w.fraction) < 1:
        raise ConfigError(f"watchdog.fraction={w.fraction}: must be between 0 and 1 (a fraction of the median)")
    if int(w.window) < 3 or int(w.patience) < 1:
        raise ConfigError(f"watchdog.window={w.window}, patience={w.patience}: need window >= 3 and patience >= 1")
    if w.enabled and w.action == "requeue" and not cfg.fault.enabled:
        raise ConfigError("watchdog.action=requeue saves and requeues like a preemption; it needs fault.enabled=true")


STRAGGLER_ACTIONS = ("warn", "swap", "exclude")


def check_straggler(cfg: DictConfig) -> None:
    s = cfg.straggler
    if s.action not in STRAGGLER_ACTIONS:
        raise ConfigError(f"straggler.action={s.action!r}; allowed: {', '.join(STRAGGLER_ACTIONS)}")
    if not float(s.factor) > 1:
        raise ConfigError(f"straggler.factor={s.factor}: must be above 1 (times the other nodes' median)")
    if int(s.window) < 3 or int(s.patience) < 1:
        raise ConfigError(f"straggler.window={s.window}, patience={s.patience}: need window >= 3 and patience >= 1")
    if s.enabled and s.action != "warn" and not cfg.fault.enabled:
        raise ConfigError(
            f"straggler.action={s.action} is carried out by the job's supervisor; it needs fault.enabled=true "
            "(allowed without it: straggler.action=warn)"
        )


def check_fault(cfg: DictConfig, plan: JobPlan) -> None:
    f = cfg.fault
    for key in ("max_preemptions", "max_failures", "max_timeouts"):
        value = f[key]
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            allowed = "an integer >= 0" + (" or null (no limit)" if key == "max_timeouts" else "")
            raise ConfigError(f"fault.{key}={value!r}: must be {allowed}")
    if not float(f.heartbeat_s) > 0:
        raise ConfigError(f"fault.heartbeat_s={f.heartbeat_s}: must be > 0 seconds")
    beat = float(f.heartbeat_s)
    for key in ("hang_timeout_s", "hang_floor_s"):
        if float(f[key]) < 3 * beat:
            raise ConfigError(
                f"fault.{key}={f[key]} is shorter than 3 heartbeats (fault.heartbeat_s="
                f"{f.heartbeat_s}); allowed: >= {3 * beat:g}"
            )
    if float(f.node_timeout_s) < 2 * beat:
        raise ConfigError(
            f"fault.node_timeout_s={f.node_timeout_s}: an agent beats every fault.heartbeat_s={f.heartbeat_s}, "
            f"so a shorter silence is no sign of anything; allowed: >= {2 * beat:g}"
        )
    if not float(f.probe_timeout_s) > 0 or not float(f.hang_factor) >= 2:
        raise ConfigError(
            f"fault.probe_timeout_s={f.probe_timeout_s}, fault.hang_factor={f.hang_factor}: "
            "allowed: a probe timeout > 0 s and a hang factor >= 2 (times the median step)"
        )
    if f.stop_lead_s is not None and not 0 < float(f.stop_lead_s) < plan.time_limit_s:
        raise ConfigError(
            f"fault.stop_lead_s={f.stop_lead_s}: allowed: more than 0 and less than the time limit "
            f"({plan.time_limit_s} s), or null (derived from the measured checkpoint save time)"
        )
    if f.collective_timeout_s is not None and not 10 <= float(f.collective_timeout_s) < plan.time_limit_s:
        raise ConfigError(
            f"fault.collective_timeout_s={f.collective_timeout_s}: allowed: 10 s up to the time limit "
            f"({plan.time_limit_s} s), so a stuck collective ends before the allocation does"
        )


def collective_timeout_s(cfg: DictConfig, plan: JobPlan) -> float:
    """fault.collective_timeout_s, or 600 s (half the time limit when that is shorter)."""
    value = cfg.fault.collective_timeout_s
    return float(value) if value is not None else min(600.0, plan.time_limit_s / 2)


def components(cfg: DictConfig, run_dir: str | None = None, nodes_now: int | None = None) -> ResolvedJob:
    """The plan and the plugin components a config selects, looked up but not validated
    (for what needs them after :func:`resolve_job` has checked the job). ``nodes_now``: the nodes
    this allocation trains on (:func:`~hpc_llm.config.plan.make_plan`)."""
    plan = make_plan(cfg, run_dir, nodes_now)
    plugins = get_plugins(cfg.plugins.block)
    return ResolvedJob(
        plan,
        plugins.get("data", cfg.data.name),  # type: ignore[arg-type]
        plugins.get("parallelism", cfg.parallelism.name),  # type: ignore[arg-type]
        plugins.get("checkpoint", cfg.checkpoint.name),  # type: ignore[arg-type]
        tuple(plugins.get("evaluator", name) for name in cfg.eval.evaluators),  # type: ignore[misc]
        plugins.get("container", cfg.container.name),  # type: ignore[arg-type]
        plugins.get("trainer", trainer_name(cfg)),  # type: ignore[arg-type]
        tuple(plugins.get("health_check", name) for name in cfg.preflight.checks),  # type: ignore[misc]
    )


def trainer_name(cfg: DictConfig) -> str:
    """``trainer.name``; llmfoundry for a config composed without the trainer group (a payload
    written before it existed)."""
    return str(OmegaConf.select(cfg, "trainer.name", default=None) or "llmfoundry")


def check_trainer_pairs(cfg: DictConfig, job: ResolvedJob) -> None:
    """Every component serves the trainer the run picked (``Component.trainers``): a data source
    that emits LLM Foundry loaders cannot feed torchtitan, an evaluator that reads Composer's
    state cannot measure it. One line naming the key, and what serves that trainer."""
    trainer = trainer_name(cfg)
    chosen = [
        ("data", "data.name", job.data),
        ("parallelism", "parallelism.name", job.parallelism),
        ("checkpoint", "checkpoint.name", job.checkpoint),
        *(("evaluator", "eval.evaluators", ev) for ev in job.evaluators),
    ]
    for kind, key, component in chosen:
        served = component.trainers
        if served is None or trainer in served:
            continue
        plugins = get_plugins(cfg.plugins.block)
        others = sorted(
            {e.name for e in plugins.entries(kind) if e.component.trainers is None or trainer in e.component.trainers}
        )
        value = list(cfg.eval.evaluators) if kind == "evaluator" else component.name
        also = " (or eval=none)" if kind == "evaluator" else ""
        raise ConfigError(
            f"{key}={value}: {component.kind} '{component.name}' serves trainer {', '.join(served)}, not "
            f"trainer={trainer}; allowed with trainer={trainer}: {', '.join(others) or '(none)'}{also}"
        )


def resolve_job(
    cfg: DictConfig, run_dir: str | None = None, *, preview: bool = False, nodes_now: int | None = None
) -> ResolvedJob:
    """The job a config describes, with every plugin's checks run; or one ConfigError.

    ``preview`` (``hpc-llm config``, ``render``): what is missing from the data
    source (data not prepared yet) is a warning, not an error; submitting
    checks it for real. ``nodes_now``: a rank of a run that goes on with fewer nodes than it was
    submitted with (``resources.min_nodes``) resolves it for them."""
    job = components(cfg, run_dir, nodes_now)
    plan = job.plan
    if len(set(cfg.eval.evaluators)) != len(cfg.eval.evaluators):
        raise ConfigError(f"eval.evaluators={list(cfg.eval.evaluators)} lists an evaluator twice")
    for key in cfg.eval.options or {}:
        if key not in cfg.eval.evaluators:
            raise ConfigError(
                f"eval.options.{key}: '{key}' is not in eval.evaluators; "
                f"allowed: {', '.join(cfg.eval.evaluators) or '(none)'}"
            )
    check_trainer_pairs(cfg, job)
    # the trainer first: what it cannot be told is the one line, before a component's warning
    # about how it would have served another trainer
    if "trainer" in cfg:
        job.trainer.validate(cfg.trainer, plan)
    job.trainer.validate_job(cfg, plan)
    try:
        job.data.validate(cfg.data, plan)
    except ConfigError as exc:
        if not preview:
            raise
        warn_once(f"{exc} (a preview; submitting the run would stop here)")
    job.parallelism.validate(cfg.parallelism, plan)
    job.checkpoint.validate(cfg.checkpoint, plan)
    for ev in job.evaluators:
        ev.validate(cfg.eval, plan)
    job.container.validate(cfg.container, plan)
    if cfg.preflight.enabled:
        for check in job.health_checks:
            check.validate(cfg.preflight, plan)
    else:
        check_preflight_off(cfg.preflight)
    check_watchdog(cfg)
    check_straggler(cfg)
    check_fault(cfg, plan)
    check_train_keys(cfg.train, f"yaml={cfg.yaml}" if cfg.yaml else "")
    # `hpc-llm preflight` stops before training: how the batch splits over the ranks is
    # no concern of the checks (the README's preflight on 2 H100 nodes was refused for it)
    if "global_train_batch_size" in cfg.train and not cfg.preflight.only:
        batch_split(
            cfg.train.global_train_batch_size, cfg.train.get("device_train_microbatch_size", "auto"), plan.world_size
        )
    check_every_size(cfg, job)
    return job


def check_every_size(cfg: DictConfig, job: ResolvedJob) -> None:
    """A run that may go on with fewer nodes (``resources.min_nodes``) must train at every size
    it may shrink to: the global batch splits over the ranks and the parallelism's degrees
    (HSDP's shards and replicas) divide at each, checked before the queue, not at the shrink."""
    plan = job.plan
    for nodes in range(plan.least_nodes, plan.full_nodes):
        if nodes == plan.nodes:
            continue
        at = plan.at_nodes(nodes)
        try:
            if "global_train_batch_size" in cfg.train and not cfg.preflight.only:
                batch_split(
                    cfg.train.global_train_batch_size,
                    cfg.train.get("device_train_microbatch_size", "auto"),
                    at.world_size,
                )
            job.parallelism.validate(cfg.parallelism, at)
        except ConfigError as exc:
            raise ConfigError(
                f"resources.min_nodes={plan.least_nodes}: at {nodes} node(s), which the run may shrink to, "
                f"{str(exc).rstrip('.')}; or resources.min_nodes={nodes + 1}"
            ) from None
