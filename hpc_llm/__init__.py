"""hpc_llm: LLM Foundry training on Slurm clusters, from a Hydra config.

A run goes through the folders in this order::

    app.py, cli.py   entry points: ``python -m hpc_llm``, ``hpc-llm``         (login node)
    config/          compose and check: schemas, validation, plan, train config (login node)
    plugins/         hookspecs, the plugin manager, the bases plugins implement (both sides)
    launch/          Hydra's launchers and sweeper: local ranks, or sbatch jobs (launch/sbatch/:
                     the script, its checks, submit)                              (login node)
    slurm/           Slurm's client commands: sinfo, squeue, scontrol, sacct     (login node)
    doctor/          ``hpc-llm doctor``: what a cluster offers of what hpc_llm needs (login node)
    rundir/          what crosses from the login node to the job and back: the run directory's
                     layout, payload, provenance, code snapshot, results.json  (both sides)
    job/             inside the allocation: the supervisor, then each rank's task (in the job)
    builtin/         the built-in plugins (data, parallelism, checkpoints, evaluators, ...)
    data/            dataloader sections and data preparation
    results/         what comes back: ledger, status, report, estimate, console (login node)
    devcluster/      the embedded dev/test infrastructure: a Slurm mini-cluster, its accounting
                     database, an S3 server (``hpc-llm dev-cluster``, the tests)

Importing this package is cheap on purpose: the login node (compose, validate,
render, submit, status, report) must never import torch, composer or
llmfoundry. Only ``hpc_llm.job`` and the ``prepare``/``after_train`` methods of
plugins import the training stack, lazily.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hpc_llm.plugins.markers import hookimpl

__version__ = "0.1.0"

__all__ = ["hookimpl", "__version__"]


def __getattr__(name: str) -> Any:
    """``from hpc_llm import hookimpl`` (the plugins' marker) loads pluggy then, not on every import
    of hpc_llm: the job's supervisor and agents import hpc_llm's stdlib-only modules and nothing
    third-party (tests/test_layers.py)."""
    if name == "hookimpl":
        from hpc_llm.plugins.markers import hookimpl

        return hookimpl
    raise AttributeError(f"module 'hpc_llm' has no attribute {name!r}")
