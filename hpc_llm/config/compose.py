"""One job config composed as ``python -m hpc_llm <overrides>`` would compose it, on the login
node: what ``hpc-llm config``, ``render``, ``estimate``, ``doctor`` and the rest start from.
"""

from __future__ import annotations

from collections.abc import Sequence

from omegaconf import DictConfig


def compose(overrides: Sequence[str]) -> DictConfig:
    """The job config ``python -m hpc_llm <overrides>`` would compose (one point, no sweep)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from hpc_llm.config import foundry_yaml
    from hpc_llm.config.overrides import adding_keys
    from hpc_llm.config.store import register_configs
    from hpc_llm.paths import conf_dir

    register_configs()
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        cfg = hydra_compose(config_name="config", overrides=adding_keys(overrides), return_hydra_config=True)
    foundry_yaml.apply(cfg)
    return cfg
