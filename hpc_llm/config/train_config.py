"""hpc_llm config + plugins -> the LLM Foundry train config the job runs.

Pure (login node: ``hpc-llm config`` prints it; in the job: it is what
``llmfoundry.command_utils.train`` receives). Plugin fragments form the base,
the user's ``train.*`` keys are merged on top (so an experiment can still
override any loader or FSDP key), then interpolations such as
``${max_seq_len}`` are resolved against the result.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, cast

from omegaconf import DictConfig, OmegaConf

from hpc_llm.config import trackers
from hpc_llm.config.plan import JobPlan
from hpc_llm.config.validate import ResolvedJob, check_train_keys, check_vocab, collective_timeout_s
from hpc_llm.errors import ConfigError, warn_once

#: names under which the job registers hpc_llm's logger and callbacks in LLM
#: Foundry's registries (hpc_llm.job.rank.foundry), so the train config can list them
RESULTS_LOGGER = "hpc_llm_results"
PREEMPTION_CALLBACK = "hpc_llm_preemption"
WATCHDOG_CALLBACK = "hpc_llm_watchdog"
STRAGGLER_CALLBACK = "hpc_llm_straggler"


def check_owned_keys(cfg: DictConfig) -> None:
    """``train.*`` keys that hpc_llm owns (docs/guides/your-yaml.md), given to a preset
    experiment: refused or reconciled in one line, never taken silently."""
    train = cfg.train
    if train.get("run_name") is not None:  # null (LLM Foundry's yamls: "read from $RUN_NAME") sets nothing
        warn_once(
            f"train.run_name={train.run_name!r} is not used: hpc_llm names the run <experiment>-<date>-<job>, "
            "the same on every attempt (Composer's autoresume finds the checkpoints by it)"
        )
    if train.get("autoresume") is False and cfg.fault.enabled:
        raise ConfigError(
            "train.autoresume=false, but fault.enabled=true resumes requeued attempts from the last "
            "checkpoint; allowed: checkpoint.autoresume=false with fault.enabled=false"
        )
    if cfg.yaml:
        return  # the yaml's save_folder and fsdp_config are followed (hpc_llm/config/foundry_yaml.py)
    if "save_folder" in train:
        raise ConfigError(
            "train.save_folder: the checkpoint folder is checkpoint.location (hpc_llm prunes and resumes "
            "from it); allowed: checkpoint.location=PATH or an object-store URI with checkpoint=uri"
        )
    if "fsdp_config" in train and cfg.parallelism.name == "ddp":
        raise ConfigError(
            "train.fsdp_config given with parallelism=ddp, which would ignore it; allowed: parallelism=fsdp "
            "(or hsdp) with parallelism.options.<key>=..."
        )


def build_train_config(cfg: DictConfig, job: ResolvedJob, *, run_name: str) -> dict[str, Any]:
    plan = job.plan
    check_owned_keys(cfg)
    data = job.data.train_config(cfg.data, plan)
    if cfg.yaml:
        # the evaluators read the loaders they need from the data fragment: a yaml's own
        data = {k: copy.deepcopy(v) for k, v in cfg.train.items() if k in ("train_loader", "eval_loader")}
    fragments: list[dict[str, Any]] = [
        data,
        job.parallelism.train_config(cfg.parallelism, plan),
        job.checkpoint.train_config(cfg.checkpoint, plan),
    ]
    eval_fragments = [ev.train_config(cfg.eval, plan, data) for ev in job.evaluators]
    if not any("eval_loader" in f for f in eval_fragments):
        # The data source's held-out loader is used only when an evaluator asks for it.
        data.pop("eval_loader", None)
    fragments.extend(eval_fragments)
    ours: dict[str, Any] = {
        "loggers": {RESULTS_LOGGER: {}, **trackers.train_loggers(cfg, plan.run_dir, run_name, plan.nodes)},
        # torch.distributed's process-group timeout: a stuck collective raises
        "dist_timeout": collective_timeout_s(cfg, job.plan),
    }
    callbacks: dict[str, Any] = {}
    if cfg.watchdog.enabled:
        w = cfg.watchdog
        callbacks[WATCHDOG_CALLBACK] = {
            "window": w.window,
            "fraction": w.fraction,
            "patience": w.patience,
            "action": w.action,
        }
    if cfg.straggler.enabled and plan.nodes > 1:
        # one node has nothing to be compared with
        callbacks[STRAGGLER_CALLBACK] = {"window": cfg.straggler.window}
    if cfg.fault.enabled:
        # after the watchdog: a stop it requests is acted on at the same batch
        callbacks[PREEMPTION_CALLBACK] = {}
    if callbacks:
        ours["callbacks"] = callbacks
    fragments.append(ours)
    merged: dict[str, Any] = {}
    for fragment in [*fragments, OmegaConf.to_container(cfg.train, resolve=False), {"run_name": run_name}]:
        _deep_merge(merged, fragment)  # type: ignore[arg-type]
    # one OmegaConf pass resolves ${max_seq_len}-style references against the result
    out = resolve_interpolations(merged)
    check_train_keys(out)
    for key in ("model", "tokenizer", "train_loader", "max_duration", "max_seq_len"):
        if key not in out:
            raise ConfigError(
                f"train.{key} is required by LLM Foundry and neither the experiment nor "
                f"data source '{job.data.name}' sets it"
            )
    check_vocab(out)
    elastic_data_order(out, plan)
    return out


#: Streaming's shuffles whose num_canonical_nodes defaults to 64 x the initial physical nodes
#: (streaming/base/dataset.py, 0.12); the others default to the physical nodes
_WIDE_SHUFFLES = ("py1s", "py2s")


def elastic_data_order(train: dict[str, Any], plan: JobPlan) -> None:
    """A run that may go on with fewer nodes (``resources.min_nodes``) keeps its sample order:
    Streaming's elastic determinism holds the global order fixed for a fixed
    ``num_canonical_nodes``, the global batch, ranks per node and workers per rank (its
    ``relaxed`` partition, the default, repartitions a resume over the initial nodes' order).
    Streaming sets num_canonical_nodes at the first start from the nodes it finds, and a resume
    takes it from the checkpoint; a run whose first start is already shrunk would get another
    order. So it is set here from the nodes the run was submitted with, as Streaming would have
    (a yaml's own value stays)."""
    if plan.least_nodes >= plan.full_nodes:
        return
    dataset = (train.get("train_loader") or {}).get("dataset")
    if isinstance(dataset, dict) and dataset.get("num_canonical_nodes") is None:
        wide = dataset.get("shuffle_algo") in _WIDE_SHUFFLES
        dataset["num_canonical_nodes"] = plan.full_nodes * (64 if wide else 1)


# -- resolving a sweep's train configs fast ---------------------------------------------
# OmegaConf.create + to_container(resolve=True) of a whole train config costs ~15 ms a point,
# a second and a half of a 100-point sweep's submit. The points of a sweep build train configs
# of one structure that differ in a few values: the previous one's OmegaConf object, with this
# one's values set in it, resolves this one's interpolations; every other value is this one's
# own, as OmegaConf would return it (plain scalars, compared one by one).

#: scalars OmegaConf.create + to_container(resolve=True) give back as they are (no "${" in a str)
_PLAIN = (str, int, float, bool, type(None))
_Path = tuple[str | int, ...]


@dataclass
class _Resolved:
    merged: dict[str, Any]
    config: DictConfig
    #: where merged holds a string with "${" (an interpolation, or an escaped one)
    interpolations: list[_Path]


#: the last train config resolved in this process (one sweep's points come one after another)
_last: _Resolved | None = None


def resolve_interpolations(merged: dict[str, Any]) -> dict[str, Any]:
    """``OmegaConf.to_container(OmegaConf.create(merged), resolve=True)``: the same result, made
    from the previous call's OmegaConf object when ``merged`` differs from the previous
    ``merged`` only in plain values (no key added, removed or changed in kind)."""
    global _last
    last, _last = _last, None  # an exception below leaves nothing half-updated behind
    changes: list[tuple[_Path, Any]] = []
    if last is None or not _diff(last.merged, merged, (), changes):
        config = OmegaConf.create(merged)
        resolved = OmegaConf.to_container(config, resolve=True)
        if not isinstance(resolved, dict):  # pragma: no cover - merge of mappings is a mapping
            raise TypeError("train config did not compose to a mapping")
        interpolations: list[_Path] = []
        _find_interpolations(merged, (), interpolations)
        _last = _Resolved(copy.deepcopy(merged), config, interpolations)
        return cast("dict[str, Any]", resolved)
    for path, value in changes:
        _node(last.config, path[:-1])[path[-1]] = value
        _set(last.merged, path, copy.deepcopy(value))
        if isinstance(value, str) and "${" in value and path not in last.interpolations:
            last.interpolations.append(path)
    last.interpolations = [p for p in last.interpolations if _holds_interpolation(_get(merged, p))]
    OmegaConf.clear_cache(last.config)  # a cached resolver (${now:...}) answers anew, as in a new config
    out = copy.deepcopy(merged)
    for path in last.interpolations:
        value = _node(last.config, path[:-1])[path[-1]]
        _set(out, path, OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value)
    _last = last
    return out


def _holds_interpolation(value: Any) -> bool:
    return isinstance(value, str) and "${" in value


def _diff(old: Any, new: Any, path: _Path, changes: list[tuple[_Path, Any]]) -> bool:
    """Collect the plain values where ``new`` differs from ``old``; False if they differ in
    anything else (keys, list lengths, a container against a value, a value of another type)."""
    if isinstance(old, dict) and isinstance(new, dict):
        if type(old) is not dict or type(new) is not dict or list(old) != list(new):
            return False
        return all(isinstance(k, str) and _diff(old[k], new[k], (*path, k), changes) for k in new)
    if isinstance(old, list) and isinstance(new, list):
        if type(old) is not list or type(new) is not list or len(old) != len(new):
            return False
        return all(_diff(o, n, (*path, i), changes) for i, (o, n) in enumerate(zip(old, new, strict=True)))
    if type(old) not in _PLAIN or type(new) not in _PLAIN:
        return False
    if type(old) is not type(new) or old != new:
        changes.append((path, new))
    return True


def _find_interpolations(value: Any, path: _Path, into: list[_Path]) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            _find_interpolations(v, (*path, k), into)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _find_interpolations(v, (*path, i), into)
    elif _holds_interpolation(value):
        into.append(path)


def _node(config: Any, path: _Path) -> Any:
    for key in path:
        config = config._get_node(key)
    return config


def _get(data: Any, path: _Path) -> Any:
    for key in path:
        data = data[key]
    return data


def _set(data: Any, path: _Path, value: Any) -> None:
    _get(data, path[:-1])[path[-1]] = value


def _deep_merge(into: dict[str, Any], new: dict[str, Any]) -> None:
    """Merge ``new`` into ``into`` (mappings recursively, anything else replaced).

    OmegaConf.merge does the same but costs ~0.1 s per job on the login node;
    plain dicts keep a 4-point sweep's submit near a second or two.
    """
    for key, value in new.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _deep_merge(into[key], value)
        else:
            into[key] = copy.deepcopy(value)


def without_run_time_keys(train: dict[str, Any]) -> dict[str, Any]:
    """A train config as a plain LLM Foundry yaml (``hpc-llm config --as-yaml``): without the
    keys hpc_llm sets for one run (run_name, the run dir's save_folder, its logger and
    callbacks), which it sets again when the yaml is run with ``yaml=PATH``."""
    out = copy.deepcopy(train)
    out.pop("run_name", None)
    out.pop("save_folder", None)
    for section, ours in (("loggers", (RESULTS_LOGGER,)), ("callbacks", (PREEMPTION_CALLBACK, WATCHDOG_CALLBACK))):
        kept = {k: v for k, v in (out.get(section) or {}).items() if k not in ours}
        if kept:
            out[section] = kept
        else:
            out.pop(section, None)
    return out
