"""``yaml=PATH``: the LLM Foundry train yaml a user already has, run as written.

The file is the one ``composer train/train.py PATH`` takes. It becomes the job's
``train`` section whole: none of the default experiment's model or data is
merged into it. ``train.<key>=...`` on the command line (``train.variables.*``
included) is applied to it first, then its interpolations are resolved here,
on the login node, as LLM Foundry would resolve them in the job. hpc_llm's own
sections then follow the yaml, so what hpc_llm does around the run (the
checkpoint folder it prunes and resumes from, the parallelism plugin, the
evaluators) agrees with it: :data:`FOLLOWS`. What hpc_llm itself sets in the
train config is listed once, in :data:`OWNED` (and in
docs/guides/your-yaml.md, which a test compares with it); ``hpc-llm config
yaml=PATH`` shows every line it added or changed.
"""

from __future__ import annotations

import difflib
import os
import re
from pathlib import Path
from typing import Any

import yaml as pyyaml
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from hpc_llm.errors import ConfigError, warn_once

#: what hpc_llm sets in a train config it runs, and why running under hpc_llm needs it
OWNED: dict[str, str] = {
    "run_name": "set to <experiment>-<date>-<job>, the same on every attempt: Composer's autoresume "
    "finds the run's checkpoints by it (a yaml's own run_name, or null, would break resume "
    "or collide between the points of a sweep)",
    "save_folder": "the run dir's checkpoints/ when the yaml has none (kept when it has one): a requeued "
    "attempt resumes from it",
    "autoresume": "true: a requeued or restarted attempt continues from the last checkpoint "
    "(false is refused while fault.enabled=true)",
    "save_interval": "checkpoint.interval when the yaml has none",
    "save_num_checkpoints_to_keep": "checkpoint.keep when the yaml has none; hpc_llm also prunes "
    "what earlier attempts left beyond it",
    "save_overwrite": "false when the yaml has none: a requeued attempt must not overwrite a checkpoint",
    "loggers": "hpc_llm_results added (it writes results.json), and the tracker of logger=...; "
    "the yaml's loggers are kept",
    "callbacks": "hpc_llm_preemption added while fault.enabled (saves and stops at Slurm's signal), "
    "hpc_llm_watchdog while watchdog.enabled; the yaml's callbacks are kept",
    "dist_timeout": "fault.collective_timeout_s (default 600 s, or half the time limit) when the yaml "
    "has none: a stuck collective ends before the allocation does",
}

#: hpc_llm's sections that take their values from the yaml (section key: yaml key)
FOLLOWS: dict[str, str] = {
    "checkpoint.location": "save_folder",
    "checkpoint.interval": "save_interval",
    "checkpoint.keep": "save_num_checkpoints_to_keep",
    "checkpoint.load_path": "load_path",
    "eval.interval": "eval_interval",
    "parallelism.name": "fsdp_config (fsdp when present, else ddp)",
    "parallelism.options": "fsdp_config",
    "data.name": "train_loader (data source 'yaml': the yaml's own loaders)",
}

#: the data source of a yaml run: the yaml's loaders as written (hpc_llm/builtin/data.py)
DATA_SOURCE = "yaml"


def experiment_name(path: str) -> str:
    """A yaml run's experiment name (its run dirs' folder): the file's stem."""
    return Path(path).stem or "yaml"


def load(path: str) -> DictConfig:
    """The yaml as a mapping, interpolations unresolved; or one ConfigError line."""
    p = Path(path).expanduser()
    allowed = "allowed: the path of an LLM Foundry train yaml (the file `composer train/train.py` takes)"
    if not p.is_file():
        raise ConfigError(f"yaml={path}: no such file; {allowed}")
    try:
        text = p.read_text()
    except OSError as exc:
        raise ConfigError(f"yaml={path}: cannot be read ({exc.strerror}); {allowed}") from None
    try:
        data = pyyaml.safe_load(text)
    except pyyaml.YAMLError as exc:
        # where the broken construct starts (an unclosed bracket is only noticed at the end)
        where = getattr(exc, "context_mark", None) or getattr(exc, "problem_mark", None)
        at = f" at line {where.line + 1}" if where is not None else ""
        raise ConfigError(f"yaml={path}: not valid YAML{at}; {allowed}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"yaml={path} holds a {type(data).__name__}, not a mapping of train-config keys; {allowed}")
    return OmegaConf.create(data)


def _train_overrides(cfg: DictConfig) -> list[tuple[str, Any, bool]]:
    """(key below train, value, delete) of this job's ``train.*`` command-line overrides."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    task = list(OmegaConf.select(cfg, "hydra.overrides.task", default=[]) or [])
    out = []
    for o in OverridesParser.create().parse_overrides(task):
        if o.key_or_group == "experiment" and o.is_add():
            raise ConfigError(
                f"yaml={cfg.yaml} together with +experiment={o.value()}: the yaml is the whole train config; "
                "allowed: one of them"
            )
        if o.key_or_group.startswith("train.") and not o.is_sweep_override():  # (the sweep's own config)
            out.append((o.key_or_group.removeprefix("train."), o.value(), o.is_delete()))
    return out


def _resolved(node: DictConfig, path: str) -> dict[str, Any]:
    try:
        out = OmegaConf.to_container(node, resolve=True)
    except OmegaConfBaseException as exc:
        key = getattr(exc, "full_key", None)
        first = str(exc).strip().splitlines()[0]
        raise ConfigError(
            f"yaml={path}: {key + ': ' if key else ''}{first}; allowed: an entry under variables: "
            "or train.variables.<name>=... on the command line"
        ) from None
    return out  # type: ignore[return-value]


def _looks_local(value: Any) -> bool:
    return isinstance(value, str) and value.startswith(("/", "./", "../", "~"))


def _is_uri(value: Any) -> bool:
    return isinstance(value, str) and "://" in value


def _datasets(train: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(key, dataset section) of every loader of the yaml."""
    out = []
    for loader in ("train_loader", "eval_loader"):
        section = train.get(loader)
        for i, one in enumerate(section if isinstance(section, list) else [section]):
            ds = (one or {}).get("dataset") if isinstance(one, dict) else None
            if isinstance(ds, dict):
                out.append((f"{loader}{f'[{i}]' if isinstance(section, list) else ''}.dataset", ds))
    return out


def local_paths(train: dict[str, Any]) -> list[tuple[str, str]]:
    """(key, path) of every local path the yaml reads that must exist before the job starts:
    loaders' datasets and streams without a remote, tokenizer and model directories, the
    checkpoint it loads, its code paths. Remote URIs and hub ids pass through (they are the
    job's to fetch); a ``local`` beside a ``remote`` is the node's cache of it, not an input."""
    out: list[tuple[str, str]] = []
    for name, ds in _datasets(train):
        if ds.get("local") and not ds.get("remote"):
            out.append((f"{name}.local", str(ds["local"])))
        if _looks_local(ds.get("hf_name")):
            out.append((f"{name}.hf_name", str(ds["hf_name"])))
        for stream, one in (ds.get("streams") or {}).items():
            if isinstance(one, dict) and one.get("local") and not one.get("remote"):
                out.append((f"{name}.streams.{stream}.local", str(one["local"])))
    if _looks_local((train.get("tokenizer") or {}).get("name")):
        out.append(("tokenizer.name", str(train["tokenizer"]["name"])))
    if _looks_local((train.get("model") or {}).get("pretrained_model_name_or_path")):
        out.append(("model.pretrained_model_name_or_path", str(train["model"]["pretrained_model_name_or_path"])))
    if train.get("load_path") and not _is_uri(train["load_path"]):
        out.append(("load_path", str(train["load_path"])))
    for i, code in enumerate(train.get("code_paths") or []):
        if isinstance(code, str) and not _is_uri(code):
            out.append((f"code_paths[{i}]", code))
    # LLM Foundry opens these (and a task's dataset_uri, through Composer's get_file) from the
    # directory it runs in: any string that is no URI is a path, "./" or not
    for key in (*ICL_FILES, *(k + "_str" for k in ICL_FILES)):
        if isinstance(train.get(key), str) and not _is_uri(train[key]):
            out.append((key, train[key]))
    tasks = train.get("icl_tasks")
    for i, task in enumerate(tasks if isinstance(tasks, list) else []):
        uri = task.get("dataset_uri") if isinstance(task, dict) else None
        if isinstance(uri, str) and uri and not _is_uri(uri):
            out.append((f"icl_tasks[{i}].dataset_uri", uri))
    return out


#: the keys of LLM Foundry's train config that may name a yaml file holding that section
#: (``icl_tasks: eval/yamls/tasks_v0.3.yaml``); ``<key>_str`` is where its TrainConfig moves it
ICL_FILES = ("icl_tasks", "eval_gauntlet")


def inline_icl_files(train: dict[str, Any], base: Path, behind: dict[str, str]) -> None:
    """``icl_tasks: FILE`` and ``eval_gauntlet: FILE`` replaced by the file's section, read from
    ``base``. LLM Foundry reads the file, and the ``dataset_uri`` of every task in it, relative
    to the directory it runs in (its own yamls say ``eval/local_data/...``, meant from its
    ``scripts/``); hpc_llm's ranks run in node-local scratch. Inlined, the tasks' paths are
    made absolute and checked as the yaml's own are, and train_config.yaml shows what the
    job reads. A file that is missing is left for the missing-path rule to name. ``behind``
    gains the key to name for each task's path: where it was written."""
    for key in ICL_FILES:
        name = key + "_str" if isinstance(train.get(key + "_str"), str) else key
        value = train.get(name)
        if not isinstance(value, str) or not value or _is_uri(value):
            continue
        file = Path(value).expanduser()
        file = file if file.is_absolute() else base / file
        if not file.is_file():
            continue
        try:
            section = OmegaConf.to_container(OmegaConf.load(file), resolve=True)
        except (OSError, OmegaConfBaseException, ValueError) as exc:
            raise ConfigError(
                f"train.{name}={value}: {str(exc).strip().splitlines()[0]}; allowed: a yaml file with a "
                f"top-level {key}: section"
            ) from None
        inner = section.get(key) if isinstance(section, dict) else None
        if not isinstance(inner, (list, dict)):
            raise ConfigError(
                f"train.{name}={value}: {file} has no top-level {key}: section; allowed: a yaml file "
                f"with one, as LLM Foundry's scripts/eval/yamls/ have"
            )
        train.pop(name)
        train[key] = inner
        for i, task in enumerate(inner if key == "icl_tasks" else []):
            if isinstance(task, dict) and "dataset_uri" in task:
                behind[f"icl_tasks[{i}].dataset_uri"] = f"icl_tasks[{i}].dataset_uri in {value}"


def _set(train: dict[str, Any], key: str, value: Any) -> None:
    node: Any = train
    parts = [p for p in re.split(r"\.|\[(\d+)\]", key) if p]
    for part in parts[:-1]:
        node = node[int(part)] if isinstance(node, list) else node[part]
    last = parts[-1]
    if isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value


def _get(train: dict[str, Any], key: str) -> Any:
    node: Any = train
    for part in (p for p in re.split(r"\.|\[(\d+)\]", key) if p):
        if isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        elif isinstance(node, dict) and part in node:
            node = node[part]
        else:
            return None
    return node


def absolute_paths(train: dict[str, Any], base: Path) -> None:
    """Relative local paths made absolute against ``base``, the directory the user submitted
    from: what ``composer train.py`` means by them (it runs where it was started), while
    hpc_llm's ranks work in node-local scratch. A tokenizer or model named without ``./`` is
    a path only where that directory exists (else a hub id, as transformers reads it)."""
    for key, value in local_paths(train):
        path = Path(value).expanduser()
        if not path.is_absolute():
            _set(train, key, os.path.normpath(base / path))
    for key in ("tokenizer.name", "model.pretrained_model_name_or_path"):
        value = _get(train, key)
        local = isinstance(value, str) and value and not _looks_local(value) and not _is_uri(value)
        if local and (base / value).is_dir():  # transformers reads an existing directory first, as here
            _set(train, key, os.path.normpath(base / value))


def variables_behind(node: DictConfig) -> dict[str, str]:
    """Train-config key -> ``train.variables.NAME`` for every value of the yaml (after the command
    line's changes) that is exactly ``${variables.NAME}``: the key a user sets for it."""
    raw = OmegaConf.to_container(node, resolve=False)
    out: dict[str, str] = {}

    def walk(value: Any, key: str) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                if key or k != "variables":
                    walk(v, f"{key}.{k}" if key else str(k))
        elif isinstance(value, list):
            for i, v in enumerate(value):
                walk(v, f"{key}[{i}]")
        elif isinstance(value, str):
            m = re.fullmatch(r"\$\{(variables\.[\w.]+)\}", value)
            if m:
                out[key] = f"train.{m.group(1)}"

    walk(raw, "")
    return out


def user_keys(path: str, cfg: DictConfig) -> dict[str, str]:
    """:func:`variables_behind` of the yaml at ``path`` with this job's ``train.*`` changes."""
    return variables_behind(_with_overrides(load(path), cfg))


def hub_ids(train: dict[str, Any]) -> list[tuple[str, str]]:
    """(key, id) of the model and tokenizer the yaml names by hub id (not a local path, not a URI)."""
    out = []
    for key, value in (
        ("model.pretrained_model_name_or_path", (train.get("model") or {}).get("pretrained_model_name_or_path")),
        ("tokenizer.name", (train.get("tokenizer") or {}).get("name")),
    ):
        # transformers reads an existing directory first, as here, and the hub otherwise
        if (
            isinstance(value, str)
            and value
            and not _looks_local(value)
            and "://" not in value
            and not Path(value).exists()
        ):
            out.append((key, value))
    return out


def missing_path(path: str, user_key: str, value: str) -> str:
    """The line for a local path of the yaml that does not exist, naming the key the user sets
    (a ``train.`` key, or where in an ICL tasks file the path was written)."""
    how = f": {user_key}=PATH" if user_key.startswith("train.") else ""
    return (
        f"yaml={path}: {user_key}: {value} does not exist (a relative path is taken from the directory "
        f"you submit from); allowed: a path the nodes see, or a remote URI{how}"
    )


def warn_hub_ids(train: dict[str, Any], path: str) -> None:
    for key, value in hub_ids(train):
        # compute nodes of most clusters have no route to the hub: the job would fail at model load
        warn_once(
            f"yaml={path}: train.{key}={value!r} is a hub id, downloaded by every node at start; where the "
            f"nodes cannot reach the hub: hpc-llm model fetch {value} --out DIR, then train.{key}=DIR"
        )


def _with_overrides(node: DictConfig, cfg: DictConfig) -> DictConfig:
    """The yaml with this job's ``train.*`` command-line changes applied."""
    for key, value, delete in _train_overrides(cfg):
        if delete:
            parent_key, _, leaf = key.rpartition(".")
            parent = OmegaConf.select(node, parent_key) if parent_key else node
            if isinstance(parent, DictConfig) and leaf in parent:
                del parent[leaf]
        else:
            OmegaConf.update(node, key, value, merge=True, force_add=True)
    return node


def apply(cfg: DictConfig) -> None:
    """Make ``cfg.train`` the yaml (plus the command line's ``train.*``), its relative paths
    absolute against the directory the user submits from, and point hpc_llm's sections at
    what the yaml says (:data:`FOLLOWS`). A no-op without ``yaml=``. Whether its paths exist is
    the data source's check (hpc_llm/builtin/data.py: an error on submit, a warning in a preview)."""
    path = OmegaConf.select(cfg, "yaml", default=None)
    if not path:
        return
    node = _with_overrides(load(str(path)), cfg)
    behind = variables_behind(node)
    train = _resolved(node, str(path))
    inline_icl_files(train, Path.cwd(), behind)
    absolute_paths(train, Path.cwd())
    save_folder = train.get("save_folder")
    if train.get("autoresume") is False and cfg.fault.enabled:
        if save_folder:
            raise ConfigError(
                f"yaml={path} sets autoresume: false with its own save_folder ({save_folder}), but fault.enabled=true "
                "resumes requeued attempts from the last checkpoint there; allowed: train.autoresume=true, or "
                "fault.enabled=false to run it as written"
            )
        # its checkpoints are hpc_llm's own, in the run dir (it names no folder of its own):
        # resuming from them is what keeps a requeued attempt from starting over
        warn_once(
            f"yaml={path} sets autoresume: false and no save_folder: its checkpoints are hpc_llm's, in the run "
            "dir, and a requeued or restarted attempt resumes from them (autoresume: true)"
        )
        train["autoresume"] = True
    warn_hub_ids(train, str(path))
    if save_folder and "://" not in str(save_folder):
        # the ranks work in node-local scratch: a relative folder would be a different one on each node
        train["save_folder"] = save_folder = str(Path(str(save_folder)).expanduser().resolve())
    if cfg.cluster.device == "cpu":
        cpu_stand_ins(train, str(path))
    with open_dict(cfg):
        if cfg.experiment == "default":
            cfg.experiment = experiment_name(str(path))  # the run dirs: outputs/<yaml stem>/<date>
        fsdp = train.pop("fsdp_config", None)
        cfg.train = train
        cfg.data.name = DATA_SOURCE
        paths = local_paths(train)
        cfg.data.options = {  # bound into a container, checked by the data source
            "paths": [p for _, p in paths],
            "user_keys": [behind.get(k, f"train.{k}") for k, _ in paths],
            "yaml": str(path),
        }
        cfg.parallelism.name = "fsdp" if fsdp else "ddp"
        cfg.parallelism.options = fsdp or {}
        cfg.parallelism.lenient = True
        if save_folder:
            cfg.checkpoint.name = "uri" if "://" in str(save_folder) else "folder"
            cfg.checkpoint.location = str(save_folder)
            if "://" in str(save_folder):  # taken as written ({run_name} is filled in)
                cfg.checkpoint.run_subdir = False
        for section_key, yaml_key in (
            ("checkpoint.interval", "save_interval"),
            ("checkpoint.keep", "save_num_checkpoints_to_keep"),
            ("checkpoint.load_path", "load_path"),
            ("eval.interval", "eval_interval"),
        ):
            value = train.get(yaml_key)
            if value is not None:
                OmegaConf.update(cfg, section_key, str(value) if section_key.endswith("interval") else value)
        if "eval_loader" not in train and "heldout" in cfg.eval.evaluators:
            # held-out metrics come from the yaml's own eval_loader; without one there are none
            cfg.eval.evaluators = [e for e in cfg.eval.evaluators if e != "heldout"]
            warn_once(f"yaml={path} has no eval_loader: no held-out evaluation (evaluator 'heldout' left out)")


#: what a yaml written for GPUs uses that has no CPU implementation: (key, GPU values, None
#: standing for LLM Foundry's default, CPU stand-in); a CPU profile runs the stand-in and says so
CPU_STAND_INS = (
    ("precision", ("amp_bf16", "amp_fp16", "amp_fp8"), "fp32"),  # Composer: "not supported for CPU training"
    ("model.loss_fn", ("fused_crossentropy", None), "torch_crossentropy"),  # MPT's default needs CUDA
    ("model.attn_config.attn_impl", ("flash", "triton", None), "torch"),
    # Composer's FSDP meta init materialises parameters with to_empty(device="cuda")
    ("model.init_device", ("meta", "mixed"), "cpu"),
)


def cpu_stand_ins(train: dict[str, Any], path: str) -> None:
    """A yaml written for GPUs on a CPU profile (this machine's tests, a laptop): what has no
    CPU implementation is swapped for its stand-in, all said in one line."""
    node = OmegaConf.create(train)
    is_mpt = OmegaConf.select(node, "model.name", default=None) == "mpt_causal_lm"
    swapped = []
    for key, gpu_values, stand_in in CPU_STAND_INS:
        if key.startswith("model.") and not is_mpt:
            continue
        value = OmegaConf.select(node, key, default=None)
        if value in gpu_values and (value is not None or key.startswith("model.")):
            OmegaConf.update(node, key, stand_in, force_add=True)
            swapped.append(f"{key}={value or '(default)'} -> {stand_in}")
    if swapped:
        warn_once(
            f"yaml={path}: {'; '.join(swapped)}: these need a GPU, and cluster.device=cpu runs the CPU stand-in "
            "(a GPU profile such as cluster=h100 runs the yaml's)"
        )
    train.clear()
    train.update(OmegaConf.to_container(node))  # type: ignore[arg-type]


def changes(path: str, train: dict[str, Any]) -> str:
    """What hpc_llm added or changed against the file, as a unified diff of the two yamls."""
    before = pyyaml.safe_dump(_resolved(load(path), path), sort_keys=True).splitlines()
    after = pyyaml.safe_dump(train, sort_keys=True).splitlines()
    diff = difflib.unified_diff(before, after, fromfile=path, tofile="the train config hpc_llm runs", lineterm="")
    return "\n".join(diff) + "\n"
