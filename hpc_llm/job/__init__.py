"""The in-job side: what runs inside the allocation, on the compute nodes.

One rank of a run starts in :mod:`hpc_llm.job.entry`, which runs the Hydra
task function; hpc_llm's is :func:`hpc_llm.job.task.run`. Modules here may
import torch, Composer and LLM Foundry (lazily, where the module docstring
says so). The login side (config, launchers, slurm, report) never imports
this package; it may be imported from here.
"""
