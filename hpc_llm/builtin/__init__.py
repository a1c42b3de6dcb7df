"""Built-in plugins. They register through the same pluggy manager as
third-party packages (see hpc_llm/plugins/manager.py)."""
