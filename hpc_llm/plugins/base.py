"""Component interfaces that plugins implement.

A plugin module registers *components* through the hooks in
:mod:`hpc_llm.plugins.hookspecs`. Each component is a small object with a
``name`` (what users select in the config), a one-line ``description`` and
an optional ``Options`` dataclass that types its ``<section>.options``
mapping (unknown option keys are then an error naming the key). Which base
class belongs to which kind, hook and config key is declared once, in
:mod:`hpc_llm.plugins.kinds`; :data:`KINDS` here is derived from it.

The exceptions a component raises are in :mod:`hpc_llm.errors`:
:class:`~hpc_llm.errors.ConfigError` for bad input (login node) and
:class:`~hpc_llm.errors.CheckFailed` from a health check (in the job).

Methods split by where they run:

* ``validate``, ``train_config`` and ``host_paths`` run on the login node
  and in the job; they must be pure and cheap (no torch / composer /
  llmfoundry).
* ``prepare`` and ``after_train`` run inside the job, on every rank, and may
  import the training stack lazily.
"""

from __future__ import annotations

import copy
import dataclasses
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from hpc_llm.errors import ConfigError
from hpc_llm.plugins import kinds

if TYPE_CHECKING:  # pragma: no cover
    from hpc_llm.config.plan import JobPlan
    from hpc_llm.job.rank.context import JobContext


def local_path(value: Any) -> str | None:
    """``value`` as an absolute local path; None when unset or a URI (s3://...)."""
    if not value or "://" in str(value):
        return None
    return str(Path(str(value)).expanduser().resolve())


#: typed options by (Options class, the options as given, unresolved): Component._typed_options
_TYPED: dict[tuple[type, str], Any] = {}


def _options_key(options: type, raw: Any) -> tuple[type, str] | None:
    """What a merge of ``raw`` into ``options`` depends on: the class and ``raw`` as written
    (merging keeps interpolations unresolved); None for anything but a mapping."""
    if isinstance(raw, DictConfig):
        return options, repr(OmegaConf.to_container(raw, resolve=False))
    if type(raw) is dict:
        return options, repr(raw)
    return None


class Component:
    """Base of every plugin component.

    ``kind`` and ``selector`` of each base class below come from its entry in
    :mod:`hpc_llm.plugins.kinds`.
    """

    #: what the kind is called in messages ("data source")
    kind: ClassVar[str] = "component"
    #: the config key that selects the component, used in error messages
    selector: ClassVar[str] = ""
    name: str = ""
    description: str = ""
    #: optional dataclass typing ``<section>.options``
    Options: ClassVar[type | None] = None
    #: the trainers (``trainer.name``) this component works with; None: any. A component that
    #: emits LLM Foundry config or reads a Composer ``Trainer`` serves ``llmfoundry`` alone; a
    #: config that pairs it with another trainer is refused before the queue.
    trainers: ClassVar[tuple[str, ...] | None] = None

    def options(self, section: DictConfig) -> Any:
        """Return ``section.options`` checked against ``Options`` (if any)."""
        return self._typed_options(section.get("options") or {}, f"{self.selector.split('.')[0]}.options")

    def _typed_options(self, raw: Any, where: str) -> Any:
        if self.Options is None:
            return raw
        if not dataclasses.is_dataclass(self.Options):
            raise TypeError(f"{type(self).__name__}.Options must be a dataclass")
        key = _options_key(self.Options, raw)
        if key is not None and key in _TYPED:
            # a sweep asks each component for its options several times a point (~2.5 ms a
            # merge): the same options, merged once; each caller gets its own copy
            return copy.deepcopy(_TYPED[key])
        try:
            typed = OmegaConf.merge(OmegaConf.structured(self.Options), raw)
        except OmegaConfBaseException as exc:
            fields = [f.name for f in dataclasses.fields(self.Options)]
            bad = getattr(exc, "key", None) or "?"
            raise ConfigError(
                f"{where}.{bad}: not an option of {self.kind} '{self.name}'; allowed: {', '.join(fields) or '(none)'}"
            ) from None
        if key is not None:
            if len(_TYPED) >= 256:
                _TYPED.clear()
            _TYPED[key] = copy.deepcopy(typed)
        return typed

    def validate(self, section: DictConfig, plan: JobPlan) -> None:
        """Raise :class:`~hpc_llm.errors.ConfigError` on bad input (login node)."""
        self.options(section)

    def host_paths(self, section: DictConfig, plan: JobPlan) -> list[HostPath]:
        """Paths on the shared filesystem the job's tasks read or write (a
        container runtime binds them; login node, pure)."""
        return []

    def prepare(self, section: DictConfig, ctx: JobContext) -> None:
        """In-job preparation before training, run on every rank (serialise
        shared work yourself, e.g. with :func:`hpc_llm.plugins.once.build_once`)."""


class Trainer(Component):
    """The training stack every rank runs (``trainer.name``): docs/reference/trainers.md.

    Login side (pure, cheap): ``validate`` the config, and what the check before the queue
    asks of the trainer's own environment (``check_module``: a module of the trainer's
    environment with ``check_points(points) -> problems``). In the job: ``warm`` (a node's
    agent, once, after importing ``warm_modules``) and ``train`` (every rank), which keeps the
    contract the conformance suite (tests/test_trainer_contract.py) holds every trainer to.
    """

    #: the pip extra of hpc-llm that installs this trainer's stack (its own venv when it pins
    #: another torch than LLM Foundry's)
    extra: ClassVar[str] = ""
    #: modules a node's agent imports once so that every rank it forks starts warm
    warm_modules: ClassVar[tuple[str, ...]] = ()
    #: the module the check before the queue runs in the job's environment (None: no check)
    check_module: ClassVar[str | None] = None

    def validate_job(self, cfg: DictConfig, plan: JobPlan) -> None:
        """Raise :class:`~hpc_llm.errors.ConfigError` when the whole config (``train`` among it)
        asks what this trainer cannot do (login node, pure)."""

    def stack_config(self, cfg: DictConfig, job: Any, run_name: str) -> dict[str, Any]:
        """The config the stack gets, as ``hpc-llm config`` prints it and the run's
        ``train_config.yaml`` keeps it (login node and job, pure)."""
        return {}

    def check_point(self, cfg: DictConfig, plan: JobPlan) -> dict[str, Any]:
        """What the check before the queue sends the trainer's environment for one point."""
        return {}

    def warm(self) -> None:
        """In a node's agent, after ``warm_modules`` are imported: patches and registrations
        every forked rank would otherwise make (idempotent)."""

    def train(self, cfg: DictConfig, job: Any, ctx: JobContext) -> Trained:
        """Train (resuming where the run's checkpoints say) on every rank; raise
        :class:`hpc_llm.job.rank.preemption.Preempted` after the save a stop asked for."""
        raise NotImplementedError


class Trained:
    """What a trainer's ``train`` hands back to the rank's task (in-job)."""

    #: the stack's own trainer object, for the evaluators that serve this trainer
    handle: Any = None
    #: the last batch trained
    batch: int = 0
    #: seconds training took in this attempt
    train_s: float = 0.0

    def figures(self, ctx: JobContext, job_s: float) -> dict[str, Any]:
        """Throughput, loss, memory and mesh for results.json (a collective: every rank calls it)."""
        return {}

    def close(self) -> None:
        """End the stack's trainer (trackers finish, uploads end) before the run is called completed."""


@dataclasses.dataclass(frozen=True)
class TextData:
    """A data source's text for a trainer that reads Hugging Face datasets (in-job)."""

    #: a directory with ``tokenizer.json`` and ``tokenizer_config.json``
    tokenizer: str
    #: JSON-lines files with a ``text`` field
    train: str
    eval: str


class DataSource(Component):
    """Provides training and held-out data (``data.name``)."""

    trainers: ClassVar[tuple[str, ...] | None] = ("llmfoundry",)

    def train_config(self, section: DictConfig, plan: JobPlan) -> dict[str, Any]:
        """LLM Foundry keys: ``train_loader``, ``eval_loader`` (held-out split)
        and optionally ``tokenizer``."""
        raise NotImplementedError

    def text_data(self, section: DictConfig, ctx: JobContext) -> TextData:
        """In the job, for a trainer that reads Hugging Face datasets (torchtitan): the tokenizer
        directory and JSON-lines files of ``text`` for the train and held-out splits, built
        here if needed (every rank calls it). A source that serves such a trainer has it."""
        raise ConfigError(f"data source '{self.name}' has no text files for trainer {ctx.cfg.trainer.name}")

    def prepare_data(self, section: DictConfig, out: str, source: str | None, splits: list[str]) -> list[str]:
        """``hpc-llm data prepare``: build this source's data under ``out`` (a
        shared directory or remote URI) from the hub or from ``source`` (local
        files in the same schema); return what was written. Runs where the
        ``train`` extra is installed (a login node with it, or a job)."""
        raise ConfigError(f"data source '{self.name}' has nothing to prepare")

    def host_paths(self, section: DictConfig, plan: JobPlan) -> list[HostPath]:
        """``data.path`` when it is a local path (override for caches the job creates)."""
        local = local_path(section.get("path"))
        return [HostPath(local, "data.path")] if local else []


class ParallelismStrategy(Component):
    """Maps ``parallelism.*`` to Composer's parallelism config (``parallelism.name``)."""

    trainers: ClassVar[tuple[str, ...] | None] = ("llmfoundry",)

    def train_config(self, section: DictConfig, plan: JobPlan) -> dict[str, Any]:
        raise NotImplementedError

    def env(self, section: DictConfig, plan: JobPlan) -> dict[str, str]:
        """Environment variables every rank needs (set before Composer starts)."""
        return {}


class CheckpointBackend(Component):
    """Where and how often checkpoints are written (``checkpoint.name``)."""

    trainers: ClassVar[tuple[str, ...] | None] = ("llmfoundry",)

    def train_config(self, section: DictConfig, plan: JobPlan) -> dict[str, Any]:
        raise NotImplementedError

    def latest(self, section: DictConfig, plan: JobPlan) -> str | None:
        """Path or URI of the latest checkpoint after training, if known."""
        return None

    def size_bytes(self, section: DictConfig, plan: JobPlan) -> int | None:
        """Bytes of the latest checkpoint, if it can be measured cheaply."""
        return None

    def host_paths(self, section: DictConfig, plan: JobPlan) -> list[HostPath]:
        """The folder of ``checkpoint.load_path`` when it is local (backends add their own)."""
        local = local_path(section.get("load_path"))
        return [HostPath(os.path.dirname(local), "checkpoint.load_path")] if local else []


class Evaluator(Component):
    """Measures the trained model (listed in ``eval.evaluators``)."""

    trainers: ClassVar[tuple[str, ...] | None] = ("llmfoundry",)

    #: keys of ``after_train``'s result that go to the top level of results.json
    #: (verdicts such as ``conversion_ok`` the report reads); the rest go under ``eval``
    top_level_keys: ClassVar[tuple[str, ...]] = ()

    def options(self, section: DictConfig) -> Any:
        """``eval.options.<name>``: each evaluator has its own options."""
        raw = (section.get("options") or {}).get(self.name) or {}
        return self._typed_options(raw, f"eval.options.{self.name}")

    def train_config(self, section: DictConfig, plan: JobPlan, data: dict[str, Any]) -> dict[str, Any]:
        """Keys to add to the train config; ``data`` is the data source's fragment."""
        return {}

    def after_train(self, section: DictConfig, trainer: Any, ctx: JobContext) -> dict[str, Any]:
        """Metrics for ``results.json`` (runs on every rank; rank 0's are kept)."""
        return {}


class ContainerRuntime(Component):
    """Wraps each task's command in a container (``container.name``).

    Everything here is pure and runs on the login node: the runtime turns the
    task command into the command srun starts, and adds shell lines to the
    batch script (image staging, a per-node check, variables passed by name).
    """

    def wrap(self, section: DictConfig, mounts: Mounts, command: list[str]) -> list[str]:
        """The command srun runs for every task; ``command[0]`` is the image's Python."""
        return command

    def binds(self, section: DictConfig, mounts: Mounts) -> list[Bind]:
        """Every host path the container will see (``hpc-llm container check``
        checks that their sources exist)."""
        return []

    def script_lines(self, section: DictConfig, mounts: Mounts, passthrough: list[str]) -> list[str]:
        """Batch-script lines run once before the supervisor starts the agents (on the batch host)."""
        return []


@dataclasses.dataclass(frozen=True)
class HostPath:
    """A path on the shared filesystem that a job's tasks use."""

    path: str
    #: what it is, for messages ("data.path", "checkpoint folder")
    purpose: str
    #: the job creates it (a checkpoint folder, a cache): it may not exist before submitting
    created_by_job: bool = False


@dataclasses.dataclass(frozen=True)
class Bind:
    """One bind of a host path into a container."""

    source: str
    dest: str
    mode: str = "rw"
    #: where it came from, for error messages
    origin: str = "container.binds"

    def spec(self) -> str:
        same = self.dest == self.source and self.mode == "rw"
        return self.source if same else f"{self.source}:{self.dest}:{self.mode}"


@dataclasses.dataclass(frozen=True)
class Mounts:
    """Host paths a task needs to see, resolved on the login node."""

    #: the run directory (results, logs, submitit payload)
    run_dir: str
    #: every other path: data, checkpoints, cache (from the plugins' ``host_paths``)
    paths: tuple[HostPath, ...] = ()
    #: node-local scratch (exists on the nodes only; not checked on the login node)
    scratch: str | None = None
    #: whether the job uses GPUs
    gpus: bool = False


class HealthCheck(Component):
    """A check run inside the job before training (``preflight.checks``)."""

    def run(self, section: DictConfig, ctx: JobContext) -> dict[str, Any]:
        """Run on every rank; return figures for results.json (rank 0's are kept).

        Raise :class:`hpc_llm.errors.CheckFailed` to stop the job before training.
        """
        return {}


def _bases() -> dict[str, type[Component]]:
    """Kind name -> base class, from :data:`hpc_llm.plugins.kinds.KINDS`; gives
    each base class its kind's label and selector."""
    defined = {cls.__name__: cls for cls in Component.__subclasses__() if cls.__module__ == __name__}
    out: dict[str, type[Component]] = {}
    for spec in kinds.KINDS:
        base = defined.get(spec.base)
        if base is None:
            raise TypeError(f"plugin kind {spec.name!r}: no base class {spec.base!r} in {__name__}")
        base.kind, base.selector = spec.label, spec.selector
        out[spec.name] = base
    return out


#: kind name -> the base class its components are instances of
KINDS: dict[str, type[Component]] = _bases()
