"""Before the queue: every point of a sweep through LLM Foundry's and Composer's own code.

Run in the job's environment (the venv the ranks use, or the image through the container
runtime) by the login side (:mod:`hpc_llm.launch.precheck`), once for a whole sweep::

    python -m hpc_llm.job.rank.foundry_check < points.json

stdin: ``{"points": [{"train": {...}, "world_size": N, "device": "cpu" | "gpu"}, ...]}``, each
point's train config as the job will get it. stdout, its last line: ``{"problems": [[point,
key, message], ...]}``, ``key`` a train-config key (``optimizer.lrr``) and ``message`` what
is wrong and what is allowed. Exit 0 whatever was found; :data:`EXIT_NO_STACK` when the
training stack does not import here (the login side then says so once and skips).

What is checked is what the job would build first, from the same code, without data, weights or
a GPU: LLM Foundry's ``TrainConfig`` (unknown and missing keys) with its batch-size arithmetic
at the point's world size; every time string by Composer's ``Time`` and the precision for the
cluster profile's device (:mod:`hpc_llm.job.rank.composer_check`); the scheduler, the optimizer
on a dummy module and the algorithms, built; callbacks, loggers, loaders and the model looked up
in LLM Foundry's registries (their arguments checked against the constructor's signature: none
is built, some contact a service); a torch ``DataLoader`` over a dummy dataset with each
loader's arguments and the defaults LLM Foundry's builder fills in. What this cannot see (data
shards, the tokenizer against the vocabulary, memory) is listed in docs/guides/your-yaml.md.

With ``--cache DIR --environment ID`` a point already checked with this stack is answered from
:mod:`hpc_llm.job.rank.verdict_cache` and the stack is imported only for the others; the last
line then also says how many were ``cached`` and ``checked`` and what importing the stack cost
(``import_s``). The warm checker (:mod:`hpc_llm.job.rank.check_server`) runs the same
:func:`check_points` without starting the stack at every submit.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import os
import re
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

from hpc_llm.job.rank.composer_check import check_precision, check_times

#: the training stack is not importable in this environment
EXIT_NO_STACK = 3

#: torch.utils.data.DataLoader arguments LLM Foundry's loader builders pass on
LOADER_ARGS = ("drop_last", "num_workers", "pin_memory", "prefetch_factor", "persistent_workers", "timeout")


class Problems:
    """What was found wrong in one point: (key, message) pairs."""

    def __init__(self) -> None:
        self.found: list[tuple[str, str]] = []

    def add(self, key: str, message: str) -> None:
        self.found.append((key, " ".join(str(message).split())))

    @contextlib.contextmanager
    def about(self, key: str, allowed: str | Callable[[], str] = "") -> Iterator[None]:
        """Whatever the code under check raises becomes one problem of ``key`` (of ``key.ARG``
        for a keyword argument the constructor does not take)."""
        try:
            yield
        except Exception as exc:  # the code under check decides what is wrong; each is one line
            hint = allowed() if callable(allowed) else allowed
            unexpected = re.search(r"unexpected keyword argument '(\w+)'", str(exc))
            where = f"{key}.{unexpected.group(1)}" if unexpected else key
            self.add(where, f"{_first_line(exc)}{'; allowed: ' + hint if hint else ''}")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


def _names(registry: Any) -> str:
    return ", ".join(sorted(registry.get_all()))


def check_point(train: dict[str, Any], world_size: int, device: str) -> list[tuple[str, str]]:
    """Every problem of one point's train config, as (train-config key, message)."""
    import copy

    problems = Problems()
    check_foundry_config(copy.deepcopy(train), world_size, problems)
    check_times(train, problems)
    check_precision(train.get("precision"), device, problems)
    if not any(key.startswith("scheduler.") for key, _ in problems.found):  # one line for a bad t_warmup
        scheduler = train.get("scheduler")
        _once("scheduler", scheduler, partial(check_scheduler, copy.deepcopy(scheduler)), problems)
    optimizer = train.get("optimizer")
    _once("optimizer", optimizer, partial(check_optimizer, copy.deepcopy(optimizer)), problems)
    registered = {k: train.get(k) for k in ("callbacks", "loggers", "algorithms", "model")}
    _once("registered", registered, partial(check_registered, registered), problems)
    for key in ("train_loader", "eval_loader"):
        loaders = train.get(key)
        if isinstance(loaders, list):
            named = [(f"{key}[{i}]", one) for i, one in enumerate(loaders)]
        else:
            named = [(key, loaders)] if loaders is not None else []
        for where, one in named:
            _once("loader", [where, one], partial(check_loader, where, one), problems)
    return problems.found


#: what a check below said of a section of a train config, by the section's content: a sweep's
#: points share most of theirs (a learning-rate sweep differs in one number) and a look-up costs
#: milliseconds (LLM Foundry's registries, MPTConfig, building an algorithm or a DataLoader)
_SAID_OF: dict[str, list[tuple[str, str]]] = {}


def _once(kind: str, section: Any, check: Callable[[Problems], None], problems: Problems) -> None:
    """The problems ``check`` finds in ``section``, found once per content (bounded: a warm
    checker lives for many sweeps)."""
    key = json.dumps([kind, section], sort_keys=True, default=str)
    if key not in _SAID_OF:
        if len(_SAID_OF) > 4096:
            _SAID_OF.clear()
        said = Problems()
        check(said)
        _SAID_OF[key] = said.found
    problems.found.extend(_SAID_OF[key])


#: what LLM Foundry's TrainConfig said of configs of one shape (see :func:`_shape`)
_SAID: dict[str, list[tuple[str, str]]] = {}


def _shape(train: dict[str, Any], world_size: int) -> str:
    """What TrainConfig's verdict depends on: its fields typed ``dict[str, Any]`` (model, optimizer,
    loaders, ...) take any mapping, so only the keys, the values that are not mappings and the
    world size count. The points of a sweep over ``optimizer.lr`` share one verdict (LLM Foundry's
    structured-config pass costs ~20 ms a point)."""
    return json.dumps(
        [world_size, sorted(train), {k: v for k, v in train.items() if not isinstance(v, dict)}],
        sort_keys=True,
        default=str,
    )


def check_foundry_config(train: dict[str, Any], world_size: int, problems: Problems) -> None:
    """LLM Foundry's own ``make_dataclass_and_log_config(..., TrainConfig, ...)`` as ``train()``
    calls it, its batch-size transform reading the world size the point will run at (once per
    :func:`_shape` of config)."""
    shape = _shape(train, world_size)
    if shape not in _SAID:
        if len(_SAID) > 4096:  # a warm checker lives for many sweeps: bounded
            _SAID.clear()
        said = Problems()
        _foundry_config(train, world_size, said)
        _SAID[shape] = said.found
    problems.found.extend(_SAID[shape])


def _foundry_config(train: dict[str, Any], world_size: int, problems: Problems) -> None:
    from llmfoundry.utils.config_utils import TRAIN_CONFIG_KEYS, TrainConfig, make_dataclass_and_log_config
    from omegaconf import OmegaConf

    before = os.environ.get("WORLD_SIZE")
    os.environ["WORLD_SIZE"] = str(world_size)  # composer.utils.dist reads it before any process group exists
    try:
        make_dataclass_and_log_config(OmegaConf.create(train), TrainConfig, TRAIN_CONFIG_KEYS, transforms="all")
    except Exception as exc:  # LLM Foundry's own words
        text = " ".join(str(exc).split())
        if text.startswith("Unused parameters"):
            problems.add("(top level)", text)
        elif "batch" in text.lower():
            problems.add("global_train_batch_size", f"at world size {world_size}: {text}")
        else:
            problems.add("(top level)", _first_line(exc))
    finally:
        if before is None:
            os.environ.pop("WORLD_SIZE", None)
        else:
            os.environ["WORLD_SIZE"] = before


def check_scheduler(section: Any, problems: Problems) -> None:
    from llmfoundry import registry
    from llmfoundry.utils.builders import build_scheduler

    if not isinstance(section, dict):
        return
    name = section.pop("name", None)
    if name not in registry.schedulers.get_all():
        problems.add("scheduler.name", f"LLM Foundry has no scheduler {name!r}; allowed: {_names(registry.schedulers)}")
        return
    with problems.about("scheduler", lambda: _parameters(registry.schedulers.get(name))):
        build_scheduler(name, section)


def check_optimizer(section: Any, problems: Problems) -> None:
    import torch
    from llmfoundry import registry
    from llmfoundry.utils.builders import build_optimizer

    if not isinstance(section, dict):
        return
    name = section.pop("name", None)
    if name not in registry.optimizers.get_all():
        problems.add("optimizer.name", f"LLM Foundry has no optimizer {name!r}; allowed: {_names(registry.optimizers)}")
        return
    with problems.about("optimizer", lambda: _parameters(registry.optimizers.get(name), skip=("params",))):
        build_optimizer(torch.nn.Linear(2, 2), name, section)  # a dummy module: its parameters are all it needs


def _parameters(constructor: Any, skip: tuple[str, ...] = ()) -> str:
    try:
        params = inspect.signature(constructor).parameters
    except (TypeError, ValueError):
        return ""
    variadic = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    return ", ".join(p for p, v in params.items() if p not in ("self", *skip) and v.kind not in variadic)


def _unknown_arguments(constructor: Any, kwargs: dict[str, Any], given: tuple[str, ...] = ()) -> list[str]:
    """Keyword arguments ``constructor`` does not take (none when it takes ``**kwargs``)."""
    try:
        params = inspect.signature(constructor).parameters
    except (TypeError, ValueError):
        return []
    if any(p.kind == p.VAR_KEYWORD for p in params.values()):
        return []
    return sorted(k for k in kwargs if k not in params and k not in given)


def check_registered(train: dict[str, Any], problems: Problems) -> None:
    """Callbacks, loggers and algorithms by name, the model by name; algorithms are built (they
    are local objects), callbacks and loggers only looked up (some contact a service)."""
    from llmfoundry import registry
    from llmfoundry.utils.builders import build_algorithm

    from hpc_llm.job.rank import foundry

    foundry.register()  # hpc_llm's own logger and callbacks, as the job registers them
    for section, reg in (("callbacks", registry.callbacks), ("loggers", registry.loggers)):
        for name, kwargs in (train.get(section) or {}).items():
            if name in reg.get_all():
                constructor = reg.get(name)
            elif section == "callbacks" and name in registry.callbacks_with_config.get_all():
                constructor = registry.callbacks_with_config.get(name)
            else:
                with_config = registry.callbacks_with_config.get_all() if section == "callbacks" else ()
                names = ", ".join(sorted({*reg.get_all(), *with_config}))
                problems.add(f"{section}.{name}", f"LLM Foundry has no {section[:-1]} {name!r}; allowed: {names}")
                continue
            unknown = _unknown_arguments(constructor, kwargs or {}, given=("train_config",))
            if unknown:
                problems.add(
                    f"{section}.{name}.{unknown[0]}",
                    f"{name} takes no argument {', '.join(unknown)}; allowed: {_parameters(constructor)}",
                )
    for name, kwargs in (train.get("algorithms") or {}).items():
        if name not in registry.algorithms.get_all():
            allowed = _names(registry.algorithms)
            problems.add(f"algorithms.{name}", f"LLM Foundry has no algorithm {name!r}; allowed: {allowed}")
            continue
        params = _parameters(registry.algorithms.get(name))
        with problems.about(f"algorithms.{name}", params):
            build_algorithm(name, dict(kwargs or {}))
    model = (train.get("model") or {}).get("name")
    if model is not None and model not in registry.models.get_all():
        problems.add("model.name", f"LLM Foundry has no model {model!r}; allowed: {_names(registry.models)}")
    elif model == "mpt_causal_lm":
        check_mpt_config(train["model"], problems)


def check_mpt_config(model: dict[str, Any], problems: Problems) -> None:
    """An MPT model's config as ComposerMPTCausalLM builds it (``MPTConfig(**kwargs)``, which
    validates shapes and options), without the model: no weights are made. What needs a package
    (flash attention, TransformerEngine) is left to the job: its nodes may have what this does not."""
    from llmfoundry.models.mpt import ComposerMPTCausalLM, MPTConfig

    own = set(inspect.signature(ComposerMPTCausalLM.__init__).parameters)
    kwargs = {k: v for k, v in model.items() if k not in own | {"name", "master_weights_dtype", "self"}}
    try:
        MPTConfig(**kwargs)
    except (ValueError, NotImplementedError, TypeError) as exc:
        problems.add("model", f"{_first_line(exc)}; allowed: an MPT config LLM Foundry's MPTConfig accepts")
    except ImportError:
        pass


class _Dummy:
    """A map-style dataset of four items: what a DataLoader needs to check its arguments."""

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> int:
        return i


def check_loader(key: str, loader: Any, problems: Problems) -> None:
    """The loader's builder looked up in LLM Foundry's registry and its arguments bound to it;
    then torch's ``DataLoader`` over a dummy dataset with the arguments that builder passes on
    (its defaults for what the yaml leaves out: ``prefetch_factor: 2`` and
    ``persistent_workers: true`` refuse ``num_workers: 0``)."""
    from llmfoundry import registry
    from torch.utils.data import DataLoader

    if not isinstance(loader, dict):
        problems.add(key, f"a {type(loader).__name__}, not a mapping with a name and a dataset")
        return
    name = loader.get("name")
    if name not in registry.dataloaders.get_all():
        problems.add(f"{key}.name", f"LLM Foundry has no data loader {name!r}; allowed: {_names(registry.dataloaders)}")
        return
    builder = registry.dataloaders.get(name)
    kwargs = {k: v for k, v in loader.items() if k != "name"}
    unknown = _unknown_arguments(builder, kwargs, given=("tokenizer", "device_batch_size"))
    if unknown:
        problems.add(
            f"{key}.{unknown[0]}",
            f"LLM Foundry's {name} loader takes no {', '.join(unknown)}; allowed: "
            + _parameters(builder, skip=("tokenizer", "device_batch_size")),
        )
        return
    params = inspect.signature(builder).parameters
    args = {
        a: kwargs.get(a, params[a].default)
        for a in LOADER_ARGS
        if a in kwargs or (a in params and params[a].default is not inspect.Parameter.empty)
    }
    try:
        DataLoader(_Dummy(), batch_size=1, **args)  # type: ignore[arg-type]
    except (TypeError, ValueError) as exc:
        workers = ("num_workers", "prefetch_factor", "persistent_workers")
        shown = ", ".join(f"{a}: {v}" for a, v in args.items() if a in workers)
        defaults = [a for a in args if a not in kwargs]
        said = f" ({', '.join(defaults)}: LLM Foundry's default)" if defaults else ""
        allowed = (
            "num_workers > 0, or num_workers: 0 with prefetch_factor: null and persistent_workers: false"
            if args.get("num_workers") == 0
            else "values torch.utils.data.DataLoader takes"
        )
        where = f"{key}.num_workers" if "num_workers" in str(exc) else key
        problems.add(where, f"{shown}{said}: torch refuses it ({_first_line(exc)}); allowed: {allowed}")


def import_stack() -> None:
    """Everything :func:`check_point` imports, once (ImportError where the stack is missing):
    what a cold check spends most of its time on, paid before the first point."""
    import composer  # noqa: F401
    import llmfoundry  # noqa: F401
    import torch.utils.data  # noqa: F401
    from composer.core import Time  # noqa: F401
    from composer.core.precision import Precision  # noqa: F401
    from composer.devices import DeviceCPU  # noqa: F401
    from llmfoundry.models.mpt import MPTConfig  # noqa: F401
    from llmfoundry.utils.builders import build_optimizer  # noqa: F401
    from llmfoundry.utils.config_utils import TrainConfig  # noqa: F401

    from hpc_llm.job.rank import foundry

    foundry.register()


def check_points(points: list[dict[str, Any]]) -> list[list[tuple[str, str]]]:
    """Each point's problems (``{"train", "world_size", "device"}`` as on stdin)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the stack's deprecation notices are not the user's problems
        return [check_point(p["train"], int(p["world_size"]), str(p["device"])) for p in points]


def main(argv: list[str] | None = None) -> int:
    from hpc_llm.job.rank.stack_fingerprint import describe, fingerprint, sources, versions
    from hpc_llm.job.rank.verdict_cache import VerdictCache

    parser = argparse.ArgumentParser(prog="python -m hpc_llm.job.rank.foundry_check")
    parser.add_argument("--cache", help="the verdicts' directory (hpc_llm.job.rank.verdict_cache)")
    parser.add_argument("--environment", default="", help="the environment as the login side names it")
    args = parser.parse_args(argv)
    points = json.load(sys.stdin)["points"]
    cache = VerdictCache(args.cache, args.environment, fingerprint() if args.cache else "")
    keys = [cache.key(p) for p in points]
    verdicts = [cache.get(k) for k in keys]
    todo = [i for i, v in enumerate(verdicts) if v is None]
    t0 = time.perf_counter()
    if todo:
        try:
            import_stack()
        except ImportError as exc:
            print(json.dumps({"missing": f"{exc.name or exc}"}))
            return EXIT_NO_STACK
    t1 = time.perf_counter()
    found = check_points([points[i] for i in todo])
    made_with = sources()
    for i, problems in zip(todo, found, strict=True):
        verdicts[i] = [list(p) for p in problems]
        cache.put(keys[i], problems, made_with)
    said = {
        "problems": [[i, key, message] for i, found in enumerate(verdicts) for key, message in found or ()],
        "cached": len(points) - len(todo),
        "checked": len(todo),
        "import_s": round(t1 - t0, 3),
        "check_s": round(time.perf_counter() - t1, 3),
        "stack": describe(versions()),
    }
    sys.stdout.write("\n" + json.dumps(said) + "\n")
    return 0


if __name__ == "__main__":  # pragma: no cover - run as a module by the login side
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # without the interpreter's teardown: with the stack loaded it takes ~2 s (7,000 modules'
    # objects freed one by one) that nobody waits for
    os._exit(code)
