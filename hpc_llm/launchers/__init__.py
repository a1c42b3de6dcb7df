"""Hydra launcher and sweeper plugins (discovered through hydra_plugins/hpc_llm_launchers)."""
