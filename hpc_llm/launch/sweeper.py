"""A BasicSweeper that validates every job of the sweep before creating anything.

Hydra's BasicSweeper creates the sweep directory and writes multirun.yaml
before a single job config is checked; a bad value in job 3 of 4 then leaves
a half-made sweep behind. This sweeper composes every job first and runs the
launcher's ``check_job`` (hpc_llm's launchers declare it) and the configured ``validate``
callable on each; only then does it hand over to BasicSweeper.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import weakref
from typing import Any

from hydra._internal.config_loader_impl import ConfigLoaderImpl, get_overrides_dirname
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override, OverrideType
from hydra.utils import get_method
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from hpc_llm.config import foundry_yaml
from hpc_llm.config.launcher_options import check_launcher_options
from hpc_llm.config.store import require_schema
from hpc_llm.errors import ConfigError
from hpc_llm.launch.base import BaseLauncher, copy_config
from hpc_llm.paths import claim_new_dir

#: job_run_dir's answers, by id of the job config: (the config, what the answer was made from, the answer)
_RUN_DIRS: dict[int, tuple[weakref.ref[DictConfig], tuple[Any, ...], str]] = {}


def job_run_dir(job_cfg: DictConfig) -> str:
    """``hydra.sweep.dir``/``hydra.sweep.subdir`` of a job, absolute.

    Resolving them parses three or four interpolations (~5 ms), and the sweeper and launcher ask
    five times a job: the answer is kept per config object, and made again whenever what it
    was made from changed (the unresolved dir and subdir, the job's number, the working
    directory; what a sweep changes in a composed job config, hydra.run.dir included)."""
    sweep, job = job_cfg.hydra.sweep, job_cfg.hydra.job
    made_from = (sweep._get_node("dir")._value(), sweep._get_node("subdir")._value(), job.get("num"), os.getcwd())
    kept = _RUN_DIRS.get(id(job_cfg))
    if kept is not None and kept[0]() is job_cfg and kept[1] == made_from:
        return kept[2]
    run_dir = os.path.abspath(os.path.join(str(sweep.dir), str(sweep.subdir)))
    for key in [k for k, (ref, _m, _d) in _RUN_DIRS.items() if ref() is None]:
        del _RUN_DIRS[key]
    _RUN_DIRS[id(job_cfg)] = (weakref.ref(job_cfg), made_from, run_dir)
    return run_dir


class ValidatingSweeper(BasicSweeper):
    def __init__(
        self,
        max_batch_size: int | None = None,
        params: dict[str, str] | None = None,
        validate: str | None = None,
        check: str | None = None,
    ) -> None:
        super().__init__(max_batch_size=max_batch_size, params=params)
        self.validate = validate
        self.check = check

    _validated = False

    def setup(self, *, hydra_context: Any, task_function: Any, config: DictConfig) -> None:
        if getattr(task_function, "__module__", None) == "hpc_llm.app":  # hpc_llm's own app, not any Hydra app
            require_schema(config)  # before the sweep dir exists
        check_launcher_options(config.hydra.launcher)  # before Hydra instantiates the launcher with them
        # as Hydra composed it: every point whose swept values are plain is this with its values
        # (a copy: foundry_yaml.apply below and the sweep change the master itself)
        master = _pickled(config)
        self._master = master if isinstance(master, bytes) else None
        foundry_yaml.apply(config)  # yaml=PATH names the sweep dir (outputs/<yaml stem>/...) as its jobs do
        super().setup(hydra_context=hydra_context, task_function=task_function, config=config)

    def compose_jobs(self, arguments: list[str]) -> dict[tuple[str, ...], DictConfig]:
        """Every job config of the sweep by its overrides, numbered as the launcher numbers them."""
        if self.hydra_context is None or self.config is None:
            raise RuntimeError("sweeper used before Hydra called setup()")
        loader = self.hydra_context.config_loader
        parser = OverridesParser.create(config_loader=loader)
        params = self._parse_config()
        overrides = parser.parse_overrides(params + list(arguments))
        jobs: dict[tuple[str, ...], DictConfig] = {}
        #: by shape: the first point's config, pickled once (each point of the shape is a copy)
        composed: dict[tuple[Any, ...], bytes | DictConfig] = {}
        master = None if params else self._master_for_points(overrides, parser)
        swept = {o.key_or_group for o in overrides if o.is_sweep_override()}
        repository = self._repository(loader)
        # a sweep's points repeat the same override strings (all but the swept values): each
        # is parsed once (Hydra's ANTLR grammar, ~1 ms a string), its Override shared
        # (nothing writes to one: Hydra and _with_values only read them)
        parsed_once: dict[str, Override] = {}
        for batch in self.split_arguments(overrides, None):
            for job_overrides in batch:
                parsed = [_parsed(parser, line, parsed_once) for line in job_overrides]
                shape, values = _shape(parsed, repository)
                if shape is not None and shape in composed:
                    cfg = _with_values(composed[shape], parsed, values)
                elif shape is not None and master is not None and _from_master(parsed, values, swept, master[1]):
                    cfg = _with_values(master[0], parsed, values)
                    OmegaConf.copy_cache(from_config=self.config, to_config=cfg)  # ${now:}, as load_sweep_config
                else:
                    cfg = loader.load_sweep_config(self.config, list(job_overrides))
                if shape is not None and shape not in composed:
                    # as composed, before yaml= is applied: each point applies its own yaml (one
                    # applied already keeps what the first yaml named: its experiment, checkpoints)
                    composed[shape] = _pickled(cfg)
                foundry_yaml.apply(cfg)  # yaml=PATH: the yaml is the job's train config
                with open_dict(cfg):
                    cfg.hydra.job.num = len(jobs)
                jobs[tuple(job_overrides)] = cfg
        return jobs

    _master: bytes | None = None

    def _repository(self, loader: Any) -> Any:
        """The config repository Hydra tells a group from a value with: the loader's, plus the
        directories of ``hydra.searchpath``, which Hydra adds to a copy of it for each composition
        (ConfigLoaderImpl._process_config_searchpath): a group found only there is a value to the
        loader's own. None: every point is composed anew."""
        if self.config is None:
            return None
        if not self.config.hydra.searchpath:
            return getattr(loader, "repository", None)
        create = getattr(loader, "_parse_overrides_and_create_caching_repo", None)
        if create is None:
            return None
        lines = [*self.config.hydra.overrides.hydra, *self.config.hydra.overrides.task]
        return create(self.config.hydra.job.config_name, lines)[1]

    def _master_for_points(self, overrides: list[Override], parser: OverridesParser) -> tuple[Any, DictConfig] | None:
        """(the master config as Hydra composed it, pickled; the same unpickled, to read) when a
        point can be made from it, else None.

        Hydra composes the master (MULTIRUN) with every override but the swept ones, then each
        point (RUN) from scratch with the master's hydra.* overrides and the point's own
        (load_sweep_config): the same composition with the swept values set, as long as no swept
        key is a config group (another defaults list; _from_master sees to that), no hydra.*
        override is swept, and no mandatory group default was left out (MULTIRUN skips a
        ``???`` group that RUN refuses with "You must specify")."""
        if self._master is None or self.config is None:
            return None
        hydra_lines = list(self.config.hydra.overrides.hydra)
        if any(o.is_sweep_override() for o in parser.parse_overrides(hydra_lines)):
            return None
        cfg = pickle.loads(self._master)
        choices = cfg.hydra.runtime.choices
        if any(OmegaConf.is_missing(choices, k) for k in choices):
            return None
        return self._master, cfg

    def _run_dir_override(self) -> str | None:
        """``hydra.run.dir=X`` given on the command line (every invocation is a sweep, so Hydra
        itself would ignore it)."""
        if self.config is None:
            raise RuntimeError("sweeper used before Hydra called setup()")
        parser = OverridesParser.create()
        for override in parser.parse_overrides(list(self.config.hydra.overrides.hydra)):
            if override.key_or_group == "hydra.run.dir":
                return str(override.value())
        return None

    def _honour_run_dir(self, jobs: dict[tuple[str, ...], DictConfig]) -> None:
        """A one-point run goes exactly to ``hydra.run.dir``, as in Hydra's RUN mode; a sweep
        of several points is refused (each needs its own dir: hydra.sweep.dir/subdir)."""
        run_dir = self._run_dir_override()
        if run_dir is None:
            return
        if len(jobs) > 1:
            raise ConfigError(
                f"hydra.run.dir={run_dir} names one run's directory, but this sweep has {len(jobs)} jobs; "
                "allowed: hydra.sweep.dir=DIR (job N goes to DIR/${hydra.sweep.subdir}, default DIR/N)"
            )
        if self.config is None:
            raise RuntimeError("sweeper used before Hydra called setup()")
        for cfg in (self.config, *jobs.values()):
            with read_write(cfg.hydra), open_dict(cfg.hydra):
                cfg.hydra.sweep.dir = run_dir
                cfg.hydra.sweep.subdir = "."

    def _claim_sweep_dir(self, jobs: dict[tuple[str, ...], DictConfig]) -> None:
        """Make the sweep dir, as this invocation's alone, once every job is valid.

        The default name is the time to the second (``${now:%Y-%m-%d_%H-%M-%S}``): two submits of
        one experiment within a second (a script's loop, two users sharing outputs/) got the same
        dir, and the second wrote its job 0 over the first's run (payload, configs, then its
        checkpoints). ``os.mkdir`` is atomic: the first to make the dir has it; the next takes
        ``<dir>_2`` (then _3, ...), its jobs too. A dir the user named (``hydra.sweep.dir=DIR``,
        ``hydra.run.dir=DIR``) is theirs to reuse, as in Hydra: it is made if missing."""
        if self.config is None:
            raise RuntimeError("sweeper used before Hydra called setup()")
        base = str(self.config.hydra.sweep.dir)
        if "${now:" not in str(self.config.hydra.sweep._get_node("dir")._value()):
            os.makedirs(base, exist_ok=True)
            return
        try:
            claimed = claim_new_dir(base)
        except FileExistsError as exc:
            raise ConfigError(f"{exc}; allowed: hydra.sweep.dir=DIR, a new directory") from None
        if claimed == base:
            return
        for cfg in (self.config, *jobs.values()):
            with read_write(cfg.hydra), open_dict(cfg.hydra):
                cfg.hydra.sweep.dir = claimed
        if "'" not in claimed:
            # a job config composed again (Hydra's own launchers, or a cache miss in ours) gets its
            # hydra.* from these overrides and its ${now:} from the master's resolver cache: without
            # this it would name the first invocation's dir again
            with read_write(self.config.hydra), open_dict(self.config.hydra):
                self.config.hydra.overrides.hydra.append(f"hydra.sweep.dir='{claimed}'")

    def sweep(self, arguments: list[str]) -> Any:
        # hpc_llm's launchers declare check_job and take precomposed configs; any other
        # Hydra launcher (basic, joblib, submitit) runs what this sweeper composed as usual
        ours = self.launcher if isinstance(self.launcher, BaseLauncher) else None
        validate = get_method(self.validate) if self.validate else None
        if self.config is None:
            raise RuntimeError("sweeper used before Hydra called setup()")
        # Resolve ${now:...} in the sweep dir on the master config first: every job
        # config copies its resolver cache, so all jobs land in the same sweep dir.
        str(self.config.hydra.sweep.dir)
        jobs = self.compose_jobs(arguments)
        self._honour_run_dir(jobs)
        validated = []
        common = set.intersection(*(set(o) for o in jobs)) if jobs else set()
        for overrides, cfg in jobs.items():
            out = validate(cfg, job_run_dir(cfg)) if validate else None
            if ours is not None:
                ours.check_job(cfg)
            # a point of a sweep is named by what sets it apart
            own = [o.lstrip("+") for o in overrides if o not in common]
            label = f"job {cfg.hydra.job.num}" + (f" [{' '.join(own)}]" if own else "") if len(jobs) > 1 else ""
            validated.append((cfg, out, label))
        if self.check:
            get_method(self.check)(validated)  # the whole sweep at once (one process in the job's environment)
        self._validated = True
        self._claim_sweep_dir(jobs)
        if ours is not None:
            # Composing costs ~0.2 s a job; the launcher reuses these instead of
            # composing every job a second time (the login node should answer fast).
            ours.precomposed = jobs
        return super().sweep(arguments)

    def validate_batch_is_legal(self, batch: Any) -> None:
        if not self._validated:  # compose_jobs() already composed every job
            super().validate_batch_is_legal(batch)


# -- composing a sweep fast ----------------------------------------------------------
# Hydra composes every job of a sweep from scratch (defaults list, every YAML file):
# ~0.2 s a job, 20 s for a 100-point learning-rate sweep on a login node. Points
# that differ only in plain values (no config group, no hydra.* key, no deletion)
# have the same defaults list, so each is the first such point's config with its own
# values applied by Hydra's own override code: what load_sweep_config would give.
# The first such point is itself the master config (Hydra composed it for the whole
# sweep, swept keys left out) with its values: no point of a sweep of plain values, a
# single run included, is composed again (~0.2 s of every ``python -m hpc_llm``).


def _shape(parsed: list[Override], repository: Any) -> tuple[tuple[Any, ...] | None, list[Override]]:
    """What must be equal for two points to share a composition (every override that is
    not a plain value, and the keys, not values, of those that are), and the plain values.
    (None, []): compose this point anew."""
    if repository is None:
        return None, []
    fixed: list[str] = []
    keys: list[tuple[str, str]] = []
    values: list[Override] = []
    if _overlapping(parsed, repository):
        return None, []
    for o in parsed:
        if _plain_value(o, repository):
            keys.append((o.key_or_group, str(o.type)))
            values.append(o)
        else:
            fixed.append(str(o.input_line))
    return (tuple(fixed), tuple(keys)), values


def _overlapping(parsed: list[Override], repository: Any) -> bool:
    """Whether two config overrides touch the same key, or one a key inside the other's
    (``a.b=1 a={b:2}``): Hydra applies them in order, and setting only the plain values again
    would change it. A group choice (``model=x``) is not one: it picks the defaults, which come
    before every value."""
    keys = [
        o.key_or_group
        for o in parsed
        if not o.is_hydra_override() and (isinstance(o.value(), dict) or not repository.group_exists(o.key_or_group))
    ]
    seen = set(keys)
    if len(seen) < len(keys):
        return True
    return any(".".join(k.split(".")[:i]) in seen for k in keys for i in range(1, k.count(".") + 1))


def _plain_value(o: Override, repository: Any) -> bool:
    return (
        not o.is_hydra_override()
        and not o.is_delete()
        and o.package is None
        and not o.is_sweep_override()
        and not repository.group_exists(o.key_or_group)
        # Hydra merges a mapping into what is there: into the first point's mapping, its keys
        # would stay in the others' (a list is replaced, but goes the same way for simplicity)
        and not isinstance(o.value(), (dict, list))
    )


def _from_master(parsed: list[Override], values: list[Override], swept: set[str], master: DictConfig) -> bool:
    """Whether this point is the master config with its plain ``values`` set: every swept key of
    the point is among its values (a swept group choice or mapping is composed anew), is no
    ``+key`` (composing refuses one the config has) and names a key the master has. A new key
    (``++key``, or ``train.x`` made ``++``) is composed: Hydra adds keys in command-line order,
    and the master already holds the new keys that follow it unswept."""
    plain = {o.key_or_group for o in values}
    if any(o.key_or_group in swept and o.key_or_group not in plain for o in parsed):
        return False
    mine = [o for o in values if o.key_or_group in swept]
    return not any(o.is_add() for o in mine) and all(
        OmegaConf.select(master, o.key_or_group, default=_ABSENT, throw_on_resolution_failure=False) is not _ABSENT
        for o in mine
    )


_ABSENT = object()


def _parsed(parser: OverridesParser, line: str, seen: dict[str, Override]) -> Override:
    if line not in seen:
        seen[line] = parser.parse_overrides([line])[0]
    return seen[line]


def _pickled(cfg: DictConfig) -> bytes | DictConfig:
    """``cfg`` as the pickle :func:`copy_config` would make of it, to copy it from (once per
    shape instead of once a point); ``cfg`` itself where it does not pickle."""
    try:
        return pickle.dumps(cfg, protocol=pickle.HIGHEST_PROTOCOL)
    except (pickle.PicklingError, AttributeError, TypeError):
        return cfg


def _with_values(first: bytes | DictConfig, parsed: list[Override], values: list[Override]) -> DictConfig:
    """``first`` (a composed point of the same shape, or its pickle) with this point's plain
    ``values``, and the hydra.overrides / override_dirname Hydra records for it."""
    cfg = pickle.loads(first) if isinstance(first, bytes) else copy_config(first)
    # +key=value adds a key the first point added too: as ++ (what Hydra's + does where the key
    # is absent, which it is in this point's own composition; else the first point was refused)
    ConfigLoaderImpl._apply_overrides_to_config(
        [dataclasses.replace(o, type=OverrideType.FORCE_ADD) if o.is_add() else o for o in values], cfg
    )
    task = [o for o in parsed if not o.is_hydra_override()]
    job = cfg.hydra.job
    with read_write(cfg.hydra), open_dict(cfg.hydra):
        cfg.hydra.overrides.task = [o.input_line for o in task]
        job.override_dirname = get_overrides_dirname(
            overrides=task,
            kv_sep=job.config.override_dirname.kv_sep,
            item_sep=job.config.override_dirname.item_sep,
            exclude_keys=job.config.override_dirname.exclude_keys,
        )
    return cfg
