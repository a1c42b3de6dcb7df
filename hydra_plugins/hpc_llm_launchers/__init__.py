"""Hydra discovers hpc_llm's launcher and sweeper plugins through this package.

Hydra imports every module under ``hydra_plugins`` when it scans for plugins;
these imports must stay light (no torch).
"""
