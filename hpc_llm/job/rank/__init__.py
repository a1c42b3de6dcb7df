"""One rank: one process per GPU (per Slurm task), in the job.

:mod:`~hpc_llm.job.rank.entry` is where a rank starts (the payload, Hydra's
run_job, the stop-signal handler, the heartbeat); :mod:`~hpc_llm.job.rank.task`
is hpc_llm's task function (set up, preflight, train with LLM Foundry,
evaluate, record). The Composer callbacks and logger it registers, the
upstream fixes it applies and what it measures live beside them. Modules here
import torch, Composer and LLM Foundry (lazily, where the docstring says so).
"""
