"""Hydra finds hpc_llm's site config directories through this package (see searchpath.py).

Hydra imports every module under ``hydra_plugins`` when it scans for plugins;
these imports must stay light (no torch).
"""
