"""The check before the queue, login side: every point of a sweep, in one process of the job's
own environment.

The login node never imports the training stack. What LLM Foundry and Composer would refuse
at the job's start (a time string, a precision, an optimizer argument, a registry name, a
loader's arguments, the batch split at the point's world size) is asked of that stack where
the job will run it: the venv the ranks use (``hydra.launcher.python``, else this
interpreter), or the image through the container runtime (``container=apptainer``), running
:mod:`hpc_llm.job.rank.foundry_check` once for all points of the sweep. One bad point stops
the whole sweep: nothing is created or submitted. Each problem is one line naming the key the
user set (``checkpoint.interval`` for a preset's ``save_interval``, ``train.variables.x``
where the value comes from a yaml variable). Where that environment is missing here (no
such python, no apptainer on the login node, a stack that does not import), it says so once
and the sweep goes on unchecked. ``precheck.enabled=false`` (or ``HPC_LLM_PRECHECK=0``)
turns it off.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from omegaconf import DictConfig, OmegaConf

from hpc_llm.errors import ConfigError, warn_once

MODULE = "hpc_llm.job.rank.foundry_check"
#: hpc_llm.job.rank.foundry_check.EXIT_NO_STACK (the login side never imports hpc_llm.job)
EXIT_NO_STACK = 3
#: a sweep's check that takes longer is abandoned with a warning (a hung image, a dead filesystem)
TIMEOUT_S = 300

#: train-config keys a preset takes from hpc_llm's own sections (hpc_llm/builtin/*), by the key
#: the user sets; a key the user gave under train.* is named as such
FROM_SECTIONS = {
    "save_interval": "checkpoint.interval",
    "save_num_checkpoints_to_keep": "checkpoint.keep",
    "load_path": "checkpoint.load_path",
    "eval_interval": "eval.interval",
    "eval_subset_num_batches": "eval.subset_num_batches",
    "save_folder": "checkpoint.location",
    "dist_timeout": "fault.collective_timeout_s",
    "fsdp_config": "parallelism.options",
}


@dataclass
class Point:
    """One point of a sweep as the check sees it."""

    cfg: DictConfig
    train: dict[str, Any]
    #: "job 3 [train.optimizer.lr=1e-4]"; empty for a single run
    label: str = ""
    world_size: int = 1


@dataclass
class Environment:
    """Where the job's code runs: a command prefix, and what to call it in messages."""

    command: list[str]
    name: str
    missing: str | None = None
    points: list[int] = field(default_factory=list)


def enabled(cfg: DictConfig) -> bool:
    return bool(OmegaConf.select(cfg, "precheck.enabled", default=True))


def environment(cfg: DictConfig) -> Environment:
    """The job's Python, as the launcher will start it, running :data:`MODULE`."""
    container = cfg.container
    if container.name != "none":
        return _container_environment(cfg)
    python = OmegaConf.select(cfg, "hydra.launcher.python", default=None)
    command = shlex.split(str(python)) if python else [sys.executable]
    exe = command[0]
    found = shutil.which(exe) if "/" not in exe else (exe if os.access(exe, os.X_OK) else None)
    missing = None if found else f"{exe} (hydra.launcher.python) is not on this machine"
    return Environment([*command, "-m", MODULE], f"the job's python ({exe})", missing)


def _container_environment(cfg: DictConfig) -> Environment:
    from hpc_llm.config.validate import components
    from hpc_llm.paths import cache_dir
    from hpc_llm.plugins.base import Mounts

    container = cfg.container
    name = f"the image {container.image}"
    exe = str(container.executable)
    if shutil.which(exe) is None:
        return Environment([], name, f"{exe} (container.executable) is not on this machine")
    here = str(cache_dir().expanduser().resolve())
    os.makedirs(here, exist_ok=True)  # bound: it must exist
    job = components(cfg, here)
    # binds that exist here (the run dir and scratch do not yet); the image as given, not a staged copy
    section: DictConfig = OmegaConf.merge(container, {"stage": False})  # type: ignore[assignment]
    paths = tuple(p for p in job.mounts(cfg).paths if os.path.exists(p.path))
    mounts = Mounts(run_dir=here, paths=paths, scratch=None, gpus=False)
    command = job.container.wrap(section, mounts, [str(container.python), "-m", MODULE])
    return Environment(command, name)


def check_sweep(points: Sequence[Point]) -> None:
    """Every point whose ``precheck.enabled`` through the job's own code, one process per
    environment (one for a sweep); a ConfigError with one line per problem, or nothing."""
    todo = [p for p in points if enabled(p.cfg)]
    if not todo:
        return
    envs: dict[tuple[str, ...], Environment] = {}
    for i, p in enumerate(todo):
        env = environment(p.cfg)
        envs.setdefault(tuple(env.command) or (env.name,), env).points.append(i)
    lines: list[str] = []
    for env in envs.values():
        if env.missing:
            warn_once(f"{env.missing}: train configs not checked before submitting (precheck.enabled=false hides this)")
            continue
        found = _run(env, [todo[i] for i in env.points])
        if found is not None:
            lines += _lines([todo[i] for i in env.points], found)
    if lines:
        raise ConfigError(lines[0], lines[1:])


def _run(env: Environment, points: list[Point]) -> list[list[Any]] | None:
    payload = {
        "points": [{"train": p.train, "world_size": p.world_size, "device": str(p.cfg.cluster.device)} for p in points]
    }
    try:
        proc = subprocess.run(
            env.command,
            input=json.dumps(payload),
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
            env={k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"},
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        warn_once(f"{env.name} could not check the train configs ({exc}); submitting them unchecked")
        return None
    last = (proc.stdout.strip().splitlines() or [""])[-1]
    if proc.returncode == EXIT_NO_STACK:
        missing = _json(last).get("missing", "?")
        warn_once(
            f"{env.name} has no training stack on this machine (no module {missing}): train configs not "
            "checked before submitting (precheck.enabled=false hides this)"
        )
        return None
    if proc.returncode != 0 or "problems" not in _json(last):
        tail = " ".join((proc.stderr.strip().splitlines() or ["(no output)"])[-1].split())
        warn_once(f"{env.name} could not check the train configs ({tail[-300:]}); submitting them unchecked")
        return None
    return list(_json(last)["problems"])


def _json(line: str) -> dict[str, Any]:
    try:
        out = json.loads(line)
    except ValueError:
        return {}
    return out if isinstance(out, dict) else {}


def _lines(points: list[Point], found: list[list[Any]]) -> list[str]:
    """One line per problem; the same problem in several points of a sweep is one line naming them."""
    by_line: dict[str, list[str]] = {}
    for index, key, message in found:
        p = points[int(index)]
        by_line.setdefault(describe(p.cfg, p.train, str(key), str(message)), []).append(p.label)
    out = []
    for line, labels in by_line.items():
        labels = [x for x in labels if x]
        if len(labels) == len(points) > 1:
            where = f" (in every point of the sweep, {len(points)})"
        elif len(labels) > 3:
            where = f" (in {len(labels)} points: {labels[0]}, ..., {labels[-1]})"
        else:
            where = f" (in {'; '.join(labels)})" if labels else ""
        out.append(line + where)
    return out


def describe(cfg: DictConfig, train: dict[str, Any], key: str, message: str) -> str:
    """``<the key the user set>=<value>: <message>``."""
    if key.startswith("("):  # about the config as a whole (LLM Foundry's unused-parameters message)
        return f"train config{_of_yaml(cfg)}: {message}"
    value = _value(train, key)
    shown = f"={value!r}" if value is not _ABSENT and not isinstance(value, (dict, list)) else ""
    return f"{user_key(cfg, key)}{shown}: {message}"


def _of_yaml(cfg: DictConfig) -> str:
    return f" of yaml={cfg.yaml}" if OmegaConf.select(cfg, "yaml", default=None) else ""


_ABSENT = object()


def _value(train: dict[str, Any], key: str) -> Any:
    node: Any = train
    for part in re.split(r"\.|\[(\d+)\]", key):
        if part is None or part == "":
            continue
        if isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        elif isinstance(node, dict) and part in node:
            node = node[part]
        else:
            return _ABSENT
    return node


def user_key(cfg: DictConfig, key: str) -> str:
    """The key the user sets for train-config key ``key``: a yaml's ``variables`` entry where the
    value is one, ``train.<key>`` where the user gave it, else the hpc_llm key a preset takes it from."""
    dotted = re.sub(r"\[(\d+)\]", r".\1", key)
    yaml_path = OmegaConf.select(cfg, "yaml", default=None)
    if yaml_path:
        from hpc_llm.config.foundry_yaml import user_keys

        return user_keys(str(yaml_path), cfg).get(key) or f"train.{key}"
    given = OmegaConf.select(cfg.train, dotted, default=_ABSENT, throw_on_resolution_failure=False)
    if given is not _ABSENT:
        raw = OmegaConf.to_container(cfg.train, resolve=False)
        behind = _interpolated_variable(_value(raw, key))  # type: ignore[arg-type]
        return f"train.{behind}" if behind else f"train.{key}"
    top = key.split(".")[0].split("[")[0]
    return FROM_SECTIONS.get(top, f"train.{top}") + key[len(top) :] if top in FROM_SECTIONS else f"train.{key}"


def _interpolated_variable(raw: Any) -> str | None:
    """``variables.NAME`` when ``raw`` is exactly ``${variables.NAME}``."""
    m = re.fullmatch(r"\$\{(variables\.[\w.]+)\}", raw) if isinstance(raw, str) else None
    return m.group(1) if m else None


def point_of(cfg: DictConfig, train: dict[str, Any], label: str = "") -> Point:
    from hpc_llm.config.plan import make_plan

    return Point(cfg, train, label, make_plan(cfg).world_size)
