"""hpc_llm: LLM Foundry training on Slurm clusters, from a Hydra config.

Importing this package is cheap on purpose: the login node (compose, validate,
render, submit, status, report) must never import torch, composer or
llmfoundry. Only ``hpc_llm.job`` and the ``prepare``/``after_train`` methods of
plugins import the training stack, lazily.
"""

from hpc_llm.plugins.markers import hookimpl

__version__ = "0.1.0"

__all__ = ["hookimpl", "__version__"]
