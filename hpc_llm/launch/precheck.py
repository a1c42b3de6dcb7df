"""The check before the queue, login side: every point of a sweep, in the job's own environment.

The login node never imports the training stack. What LLM Foundry and Composer would refuse
at the job's start (a time string, a precision, an optimizer argument, a registry name, a
loader's arguments, the batch split at the point's world size) is asked of that stack where
the job will run it: the venv the ranks use (``hydra.launcher.python``, else this
interpreter), or the image through the container runtime (``container=apptainer``, or
``enroot start`` of the squashfs with ``container=pyxis``), running
:mod:`hpc_llm.job.rank.foundry_check`'s code on all points of the sweep. One bad point stops
the whole sweep: nothing is created or submitted. Each problem is one line naming the key the
user set (``checkpoint.interval`` for a preset's ``save_interval``, ``train.variables.x``
where the value comes from a yaml variable). Where that environment is missing here (no
such python, no apptainer on the login node, a stack that does not import), it says so once
and the sweep goes on unchecked. ``precheck.enabled=false`` (or ``HPC_LLM_PRECHECK=0``)
turns it off.

How it runs (docs/guides/precheck.md): a point already checked with the same stack is answered
from the cache of verdicts (``precheck.cache``); the others go to the environment's warm
checker (:mod:`hpc_llm.launch.checker_client`), which keeps the stack imported between submits
and ends after ``precheck.idle_s`` without one; it is started as the sweep's first point is
validated, so a cold start imports the stack while the other points are composed. Where no
checker can start (``precheck.warm=false``, an image whose hpc_llm has none) the check runs as
one process, as before. One line on stderr says how it ran and what it took.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from omegaconf import DictConfig, OmegaConf

from hpc_llm.config.validate import trainer_name
from hpc_llm.errors import ConfigError, warn_once
from hpc_llm.launch import checker_client
from hpc_llm.launch.job_python import job_python
from hpc_llm.launch.job_python import source as job_python_source

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
    #: the point's run dir, written as :data:`RUN_DIR` in what is checked (and cached)
    run_dir: str | None = None


#: what a point's run dir is called in the train config the check gets: no verdict depends on
#: where the run will be (the check reads no path), so a submit of the same config into a new
#: sweep dir is answered from the cache; ``hpc-llm config`` shows train configs with it
RUN_DIR = "<run dir>"


@dataclass
class Environment:
    """Where the job's code runs, and what to call it in messages."""

    name: str
    #: names its warm checker and its verdicts (:func:`checker_client.identity`)
    identity: str = ""
    #: the job's python running ARGS, with the host directories BINDS visible (an image binds them)
    run: Callable[[list[str], list[str]], list[str]] | None = None
    missing: str | None = None
    points: list[int] = field(default_factory=list)


def enabled(cfg: DictConfig) -> bool:
    return bool(OmegaConf.select(cfg, "precheck.enabled", default=True))


def environment(cfg: DictConfig) -> Environment:
    """The job's Python, as the launcher will start it."""
    container = cfg.container
    if container.name != "none":
        return _container_environment(cfg)
    command = job_python(cfg)
    exe = command[0]
    found = shutil.which(exe) if "/" not in exe else (exe if os.access(exe, os.X_OK) else None)
    missing = None if found else f"{exe} ({job_python_source(cfg)}) is not on this machine"
    if "/" in exe:
        command[0] = os.path.abspath(exe)  # a warm checker starts in /
    return Environment(
        f"the job's python ({exe})",
        checker_client.identity("python", command),
        lambda args, binds: [*command, *args],
        missing,
    )


def _container_environment(cfg: DictConfig) -> Environment:
    from hpc_llm.config.validate import components
    from hpc_llm.paths import cache_dir
    from hpc_llm.plugins.base import HostPath, Mounts

    container = cfg.container
    name = f"the image {container.image}"
    exe = str(container.executable)
    pyxis = container.name == "pyxis"
    if pyxis and not str(container.image).startswith(("/", ".", "~")):
        # a registry reference: pulling it here would take what every node's step takes
        return Environment(name, missing=f"{name} is a registry reference, checked by its own stack at the job's start")
    if shutil.which(exe) is None:
        at_start = ", so the image's stack checks them at the job's start" if pyxis else ""
        return Environment(name, missing=f"{exe} (container.executable) is not on this machine{at_start}")
    here = str(cache_dir().expanduser().resolve())
    os.makedirs(here, exist_ok=True)  # bound: it must exist
    job = components(cfg, here)
    # the image as given, not a staged copy; bound: the user's binds (where the stack may live)
    # and the check's own directories, not the run's data (the check reads none)
    section: DictConfig = OmegaConf.merge(container, {"stage": False})  # type: ignore[assignment]

    def run(args: list[str], binds: list[str]) -> list[str]:
        paths = tuple(HostPath(b, "the check before the queue") for b in binds)
        mounts = Mounts(run_dir=here, paths=paths, scratch=None, gpus=False)
        # a runtime whose tasks srun starts in the image (pyxis) runs it here its own way
        start = getattr(job.container, "here", None) or job.container.wrap
        return start(section, mounts, [str(container.python), *args])

    image = os.path.realpath(os.path.expanduser(str(container.image)))
    try:
        st = os.stat(image)
        made: list[int] = [st.st_ino, st.st_size, st.st_mtime_ns]
    except OSError:
        made = []
    identity = checker_client.identity("image", [OmegaConf.to_container(section, resolve=True), image, made])
    return Environment(name, identity, run)


def _settings(cfg: DictConfig) -> tuple[bool, float, bool]:
    """``precheck.warm``, ``precheck.idle_s``, ``precheck.cache``."""
    idle_s = float(OmegaConf.select(cfg, "precheck.idle_s", default=600))
    if not idle_s > 0:
        raise ConfigError(
            f"precheck.idle_s={idle_s:g}: the warm checker would end before it is asked; "
            "allowed: seconds > 0 (precheck.warm=false: no warm checker)"
        )
    warm = bool(OmegaConf.select(cfg, "precheck.warm", default=True))
    return warm, idle_s, bool(OmegaConf.select(cfg, "precheck.cache", default=True))


def _starter(env: Environment, cfg: DictConfig) -> checker_client.Starter:
    if env.run is None:
        raise checker_client.Unavailable(env.missing or "no environment")
    _warm, idle_s, cache = _settings(cfg)
    return checker_client.Starter(env.identity, env.name, env.run, idle_s, cache)


_WARMING = False


def warm_up(cfg: DictConfig) -> None:
    """Start the warm checker of ``cfg``'s environment unless it is up, without waiting for it:
    the stack imports while the other points of the sweep are composed and validated (once a
    process, at its first point)."""
    global _WARMING
    if _WARMING or not enabled(cfg) or not _settings(cfg)[0]:
        return
    _WARMING = True
    env = environment(cfg)
    if env.missing is None:
        with contextlib.suppress(checker_client.Unavailable, OSError):
            checker_client.start(_starter(env, cfg))


def check_sweep(points: Sequence[Point]) -> None:
    """Every point whose ``precheck.enabled`` through the job's own code, one checker per
    environment (one for a sweep); a ConfigError with one line per problem, or nothing."""
    todo = [p for p in points if enabled(p.cfg)]
    if not todo:
        return
    # a trainer other than LLM Foundry brings its own check (Trainer.check_module), run as one
    # process of its environment; the rest of this module is LLM Foundry's
    others = [p for p in todo if trainer_name(p.cfg) != "llmfoundry"]
    todo = [p for p in todo if trainer_name(p.cfg) == "llmfoundry"]
    lines_of_others = _check_other_trainers(others)
    if lines_of_others:
        raise ConfigError(lines_of_others[0], lines_of_others[1:])
    if not todo:
        return
    envs: dict[str, Environment] = {}
    for i, p in enumerate(todo):
        env = environment(p.cfg)
        envs.setdefault(env.identity or env.name, env).points.append(i)
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


def _check_other_trainers(points: Sequence[Point]) -> list[str]:
    """The points through their trainer's ``check_module``, one process per environment and
    trainer for the whole sweep (``python -m M``: the points as JSON on stdin, a JSON list of
    ``[key, message]`` lists per point on the last line of stdout): its stack imports once."""
    from hpc_llm.plugins.manager import get_plugins

    groups: dict[tuple[str, str], tuple[Any, Environment, list[Point]]] = {}
    for p in points:
        trainer = get_plugins(p.cfg.plugins.block).get("trainer", trainer_name(p.cfg))
        env = environment(p.cfg)
        key = (env.identity or env.name, trainer.name)
        groups.setdefault(key, (trainer, env, []))[2].append(p)
    lines: list[str] = []
    for trainer, env, group in groups.values():
        module = getattr(trainer, "check_module", None)
        if module is None or env.run is None:
            if env.missing:
                warn_once(f"{env.missing}: trainer={trainer.name}'s config not checked before submitting")
            continue
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(
                env.run(["-m", str(module)], []),
                input=json.dumps([trainer.check_point(p.cfg, None) for p in group]),
                capture_output=True,
                text=True,
                timeout=TIMEOUT_S,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            warn_once(f"{env.name} could not check trainer={trainer.name}'s config ({exc}); submitting it unchecked")
            continue
        try:
            found = json.loads((proc.stdout.strip().splitlines() or ["null"])[-1])
        except ValueError:
            found = None
        if proc.returncode != 0 or not isinstance(found, list):
            tail = " ".join((proc.stderr.strip().splitlines() or ["(no output)"])[-1].split())
            why = f"{env.name} could not check trainer={trainer.name}'s config ({tail[-300:]})"
            warn_once(f"{why}; submitting it unchecked")
            continue
        n = len(group)
        sys.stderr.write(
            f"hpc_llm: check before the queue: trainer={trainer.name}, {n} point{'s' if n != 1 else ''}, "
            f"one process, {time.perf_counter() - t0:.2f} s ({env.name})\n"
        )
        # the same problem in several points is one line
        lines += list(dict.fromkeys(str(message) for problems in found for _key, message in problems))
    return lines


def _payload(p: Point) -> dict[str, Any]:
    train = _masked(p.train, p.run_dir) if p.run_dir else p.train
    return {"train": train, "world_size": p.world_size, "device": str(p.cfg.cluster.device)}


def _masked(node: Any, run_dir: str) -> Any:
    if isinstance(node, dict):
        return {k: _masked(v, run_dir) for k, v in node.items()}
    if isinstance(node, list):
        return [_masked(v, run_dir) for v in node]
    if isinstance(node, str) and (node == run_dir or node.startswith(run_dir.rstrip("/") + "/")):
        return RUN_DIR + node[len(run_dir) :]
    return node


def _run(env: Environment, points: list[Point]) -> list[list[Any]] | None:
    payload = [_payload(p) for p in points]
    warm, _idle_s, cache = _settings(points[0].cfg)
    t0 = time.perf_counter()
    checker: checker_client.Warm | None = None
    said: dict[str, Any] | None = None
    why = "precheck.warm=false"
    if warm:
        try:
            checker, said = checker_client.check(_starter(env, points[0].cfg), payload, TIMEOUT_S)
        except checker_client.Unavailable as exc:
            why = f"no warm checker: {exc}"
        except checker_client.NoAnswer as exc:
            warn_once(f"{env.name} could not check the train configs ({exc}); submitting them unchecked")
            return None
    if said is None:
        said = _one_shot(env, payload, cache)
        if said is None:
            return None
    if "missing" in said:
        warn_once(
            f"{env.name} has no training stack on this machine (no module {said['missing']}): train configs not "
            "checked before submitting (precheck.enabled=false hides this)"
        )
        return None
    if "problems" not in said:
        warn_once(f"{env.name} could not check the train configs ({said.get('error')}); submitting them unchecked")
        return None
    _say(env, len(points), said, checker, why, time.perf_counter() - t0)
    return [[i, key, _unmasked(points[int(i)], str(message))] for i, key, message in said["problems"]]


def _unmasked(p: Point, message: str) -> str:
    return message.replace(RUN_DIR, p.run_dir) if p.run_dir else message


def _one_shot(env: Environment, payload: list[dict[str, Any]], cache: bool) -> dict[str, Any] | None:
    """The check as one process of the job's environment (no warm checker)."""
    if env.run is None:
        return {"error": env.missing}
    args = ["-m", MODULE]
    binds: list[str] = []
    if cache:
        with contextlib.suppress(checker_client.Unavailable):
            where = checker_client.private_dir(checker_client.cache_dir())
            args += ["--cache", str(where), "--environment", env.identity]
            binds.append(str(where))
    try:
        proc = subprocess.run(
            env.run(args, binds),
            input=json.dumps({"points": payload}),
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
        return {"missing": _json(last).get("missing", "?")}
    if proc.returncode != 0 or "problems" not in _json(last):
        tail = " ".join((proc.stderr.strip().splitlines() or ["(no output)"])[-1].split())
        return {"error": tail[-300:]}
    return _json(last)


def _say(
    env: Environment,
    n: int,
    said: dict[str, Any],
    checker: checker_client.Warm | None,
    why: str,
    wall: float,
) -> None:
    """The one line that says the check ran, how (from the cache, warm, cold) and what it took."""
    cached, checked = int(said.get("cached", 0)), int(said.get("checked", n))
    points = f"{n} point{'s' if n != 1 else ''}"
    from_cache = f", {cached} from the cache" if cached else ""
    done = f"{checked} checked in {float(said.get('check_s', 0)):.2f} s{from_cache}"
    imported = float(said.get("import_s", 0))
    if not checked:
        how = "from the cache"
    elif checker is None:
        how = f"cold, one process ({why}): the stack imported in {imported:.1f} s, {done}"
    elif checker.started_here or float(said.get("waited_s", 0)) > 0.05:
        beside = max(0.0, imported - float(said.get("waited_s", 0)))
        how = f"cold, started the warm checker: the stack imported in {imported:.1f} s"
        how += f" ({beside:.1f} s of it while the points were composed), {done}" if beside >= 0.05 else f", {done}"
    else:
        how = f"warm, {done}"
    sys.stderr.write(f"hpc_llm: check before the queue: {points}, {how}; {wall:.2f} s in all ({env.name})\n")


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


def point_of(cfg: DictConfig, train: dict[str, Any], label: str = "", run_dir: str | None = None) -> Point:
    from hpc_llm.config.plan import make_plan

    return Point(cfg, train, label, make_plan(cfg).world_size, run_dir)
