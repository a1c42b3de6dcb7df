"""Every plugin kind, declared once.

A *kind* is one sort of component plugins provide (data sources, evaluators,
...). Each entry of :data:`KINDS` says everything hpc_llm needs to know about
it: its name, the base class its components are instances of, the hook
plugins implement to register them, what users write in the config to select
one, and the built-in module that provides hpc_llm's own. Everything else is
derived from this tuple:

* :mod:`hpc_llm.plugins.hookspecs`: one register hook per kind, with its doc;
* :mod:`hpc_llm.plugins.base`: ``KINDS`` (kind name -> base class) and each
  base class's ``kind`` (label) and ``selector``;
* :mod:`hpc_llm.plugins.manager`: the hooks it calls, the built-in modules it
  loads, the kinds it lists.

Adding a kind is an entry here, its base class in :mod:`hpc_llm.plugins.base`
and its built-in module. Import-light on purpose (standard library only): the
login node imports it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Kind:
    """One plugin kind."""

    #: the key hpc_llm uses for the kind (``Plugins.get("data", name)``, ``Entry.kind``)
    name: str
    #: the class in :mod:`hpc_llm.plugins.base` every component of the kind is an instance of
    base: str
    #: the hook plugins implement to register components of the kind
    hook: str
    #: what the kind is called in messages and in ``hpc-llm plugins``
    label: str
    #: the config section that configures the kind (a Hydra config group where conf/ has one)
    section: str
    #: the key in ``section`` that selects components (one name, or a list of names)
    key: str
    #: the module of hpc_llm's own components of the kind (a plugin like any other)
    builtin: str
    #: the register hook's documentation
    doc: str

    @property
    def selector(self) -> str:
        """The config key that selects components, e.g. ``data.name``."""
        return f"{self.section}.{self.key}"


KINDS: tuple[Kind, ...] = (
    Kind(
        name="trainer",
        base="Trainer",
        hook="hpc_llm_register_trainers",
        label="trainer",
        section="trainer",
        key="name",
        builtin="hpc_llm.builtin.trainers",
        doc="""Register trainers (selected by ``trainer.name``; default ``llmfoundry``).

        A trainer is the training stack a rank runs: it checks its config on the
        login node (``validate``) and in its own environment before the queue
        (``check``), writes the config its stack gets, and trains inside the job
        under the contract of docs/reference/trainers.md (progress every batch,
        a stop on the signal with a save, fenced writes, exact resume). The other
        kinds' components say which trainers they serve (``trainers``).
        """,
    ),
    Kind(
        name="data",
        base="DataSource",
        hook="hpc_llm_register_data_sources",
        label="data source",
        section="data",
        key="name",
        builtin="hpc_llm.builtin.data",
        doc="""Register data sources (selected by ``data.name``).

        A data source validates its options on the login node, contributes the
        ``train_loader`` / ``eval_loader`` (and optionally ``tokenizer``) sections
        of the LLM Foundry train config, and may prepare data inside the job.
        """,
    ),
    Kind(
        name="parallelism",
        base="ParallelismStrategy",
        hook="hpc_llm_register_parallelism",
        label="parallelism",
        section="parallelism",
        key="name",
        builtin="hpc_llm.builtin.parallelism",
        doc="""Register parallelism strategies (selected by ``parallelism.name``).

        A strategy checks its degrees against the world size and turns
        ``parallelism.*`` into Composer's ``parallelism_config`` plus any
        environment variables the ranks need.
        """,
    ),
    Kind(
        name="checkpoint",
        base="CheckpointBackend",
        hook="hpc_llm_register_checkpoint_backends",
        label="checkpoint backend",
        section="checkpoint",
        key="name",
        builtin="hpc_llm.builtin.checkpoint",
        doc="""Register checkpoint backends (selected by ``checkpoint.name``).

        A backend turns ``checkpoint.*`` into Composer's ``save_folder`` /
        ``save_interval`` / ``autoresume`` keys and says where the latest
        checkpoint is after training.
        """,
    ),
    Kind(
        name="evaluator",
        base="Evaluator",
        hook="hpc_llm_register_evaluators",
        label="evaluator",
        section="eval",
        key="evaluators",
        builtin="hpc_llm.builtin.evaluators",
        doc="""Register evaluators (listed in ``eval.evaluators``).

        An evaluator may add keys to the train config (eval loaders, intervals)
        and returns metrics after training; they land in ``results.json`` under
        ``eval``.
        """,
    ),
    Kind(
        name="container",
        base="ContainerRuntime",
        hook="hpc_llm_register_container_runtimes",
        label="container runtime",
        section="container",
        key="name",
        builtin="hpc_llm.builtin.container_runtimes",
        doc="""Register container runtimes (selected by ``container.name``).

        A runtime wraps each Slurm task's command (``apptainer exec ... IMAGE
        python -m ...``) and may add batch-script lines (image staging, a per-node
        check). Built-ins: ``none`` and ``apptainer``; a site package can add
        enroot/pyxis or podman-hpc.
        """,
    ),
    Kind(
        name="health_check",
        base="HealthCheck",
        hook="hpc_llm_register_health_checks",
        label="health check",
        section="preflight",
        key="checks",
        builtin="hpc_llm.builtin.health",
        doc="""Register health checks (listed in ``preflight.checks``).

        Checks run inside the job on every rank before training when
        ``preflight.enabled=true`` (and alone under ``hpc-llm preflight``); their
        figures land in ``results.json`` under ``preflight``, and a check below its
        threshold stops the job before the first batch.
        """,
    ),
)
