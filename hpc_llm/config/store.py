"""Registers the typed schemas with Hydra's ConfigStore.

``conf/config.yaml`` lists ``hpc_llm_schema`` first in its defaults, so every
YAML file merges into typed nodes. Called explicitly by the entry points (no
import-time side effects); calling it twice is harmless.
"""

from __future__ import annotations

import dataclasses

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig

from hpc_llm.config.schema import HpcLlmConfig
from hpc_llm.errors import ConfigError

SCHEMA_NAME = "hpc_llm_schema"


def register_configs() -> None:
    ConfigStore.instance().store(name=SCHEMA_NAME, node=HpcLlmConfig)


def require_schema(cfg: DictConfig) -> None:
    """A primary config that is not hpc_llm's (``--config-name X`` of another app) would run with
    none of hpc_llm's sections (a 1-node dry run, or a KeyError in the job): refuse it."""
    missing = [f.name for f in dataclasses.fields(HpcLlmConfig) if f.name not in cfg]
    if missing:
        name = cfg.hydra.job.config_name if "hydra" in cfg else "the primary config"
        raise ConfigError(
            f"config '{name}' is not an hpc_llm config (it has no {', '.join(missing[:3])}"
            f"{', ...' if len(missing) > 3 else ''}); allowed: hpc_llm's config with +experiment=NAME, "
            f"or a config whose defaults list starts with {SCHEMA_NAME} (as conf/config.yaml does)"
        )
