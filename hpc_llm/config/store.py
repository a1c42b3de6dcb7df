"""Registers the typed schemas with Hydra's ConfigStore.

``conf/config.yaml`` lists ``hpc_llm_schema`` first in its defaults, so every
YAML file merges into typed nodes. Called explicitly by the entry points (no
import-time side effects); calling it twice is harmless.
"""

from __future__ import annotations

from hydra.core.config_store import ConfigStore

from hpc_llm.config.schema import HpcLlmConfig

SCHEMA_NAME = "hpc_llm_schema"


def register_configs() -> None:
    ConfigStore.instance().store(name=SCHEMA_NAME, node=HpcLlmConfig)
