"""The built-in plugins: data sources, parallelism strategies, checkpoint backends,
evaluators, health checks, container runtimes. Both sides: their hooks and
``train_config`` parts run on the login node; their ``prepare`` /
``after_train`` methods run in the job and import the training stack lazily.

They register through the same pluggy manager as third-party packages
(:mod:`hpc_llm.plugins.manager` loads them by name; core code never imports them).
"""
