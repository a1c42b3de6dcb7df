"""The plugin system, on both sides: every plugin kind declared once
(:mod:`hpc_llm.plugins.kinds`), the hookspecs, the pluggy manager that loads the
built-ins and third-party packages alike, and the typed bases plugins implement.
"""
