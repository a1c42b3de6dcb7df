"""Every hook hpc_llm calls, in one place.

Each hook receives a ``register`` callback and returns nothing. A plugin calls
``register(component)`` once per component it provides; the component's
``name`` is what users write in the config (``data.name=jsonl``). The core owns
the registries, attributes each component to the package it came from, reports
name collisions, and produces the "allowed values" in error messages.

Call semantics (all hooks): every implementation is called, once per process,
when the plugin manager first loads (lazily, on first use, never at import).
Hook implementations must be cheap and must not import torch, composer or
llmfoundry: they also run on the login node. Heavy work belongs in a
component's ``prepare``/``after_train`` methods, which run inside the job.

The component interfaces are in :mod:`hpc_llm.plugins.base`. Plugin authors:
see ``docs/plugins.md``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hpc_llm.plugins.markers import hookspec

if TYPE_CHECKING:  # pragma: no cover - typing only
    from collections.abc import Callable

    from hpc_llm.plugins.base import (
        CheckpointBackend,
        ContainerRuntime,
        DataSource,
        Evaluator,
        HealthCheck,
        ParallelismStrategy,
    )


@hookspec
def hpc_llm_register_data_sources(register: Callable[[DataSource], None]) -> None:
    """Register data sources (selected by ``data.name``).

    A data source validates its options on the login node, contributes the
    ``train_loader`` / ``eval_loader`` (and optionally ``tokenizer``) sections
    of the LLM Foundry train config, and may prepare data inside the job.
    """


@hookspec
def hpc_llm_register_parallelism(register: Callable[[ParallelismStrategy], None]) -> None:
    """Register parallelism strategies (selected by ``parallelism.name``).

    A strategy checks its degrees against the world size and turns
    ``parallelism.*`` into Composer's ``parallelism_config`` plus any
    environment variables the ranks need.
    """


@hookspec
def hpc_llm_register_checkpoint_backends(register: Callable[[CheckpointBackend], None]) -> None:
    """Register checkpoint backends (selected by ``checkpoint.name``).

    A backend turns ``checkpoint.*`` into Composer's ``save_folder`` /
    ``save_interval`` / ``autoresume`` keys and says where the latest
    checkpoint is after training.
    """


@hookspec
def hpc_llm_register_evaluators(register: Callable[[Evaluator], None]) -> None:
    """Register evaluators (listed in ``eval.evaluators``).

    An evaluator may add keys to the train config (eval loaders, intervals)
    and returns metrics after training; they land in ``results.json`` under
    ``eval``.
    """


@hookspec
def hpc_llm_register_container_runtimes(register: Callable[[ContainerRuntime], None]) -> None:
    """Register container runtimes (selected by ``container.name``).

    A runtime wraps each Slurm task's command (``apptainer exec ... IMAGE
    python -m ...``) and may add batch-script lines (image staging, a per-node
    check). Built-ins: ``none`` and ``apptainer``; a site package can add
    enroot/pyxis or podman-hpc.
    """


@hookspec
def hpc_llm_register_health_checks(register: Callable[[HealthCheck], None]) -> None:
    """Register health checks (listed in ``preflight.checks``).

    Checks run inside the job on every rank before training when
    ``preflight.enabled=true`` (and alone under ``hpc-llm preflight``); their
    figures land in ``results.json`` under ``preflight``, and a check below its
    threshold stops the job before the first batch.
    """
