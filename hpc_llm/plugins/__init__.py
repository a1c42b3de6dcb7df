"""The plugin system, on both sides: every plugin kind declared once
(:mod:`hpc_llm.plugins.kinds`), the hookspecs derived from it, the pluggy
manager that loads the built-ins and third-party packages alike, the registry
each plugin registers its components through, and the typed bases plugins
implement.
"""
