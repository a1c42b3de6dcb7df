"""In the job: what runs inside the allocation, on the compute nodes.

The batch script execs the supervisor (:mod:`hpc_llm.job.supervisor`), which
runs the training step (``srun``) and decides what each end of it means.
Each rank starts in :mod:`hpc_llm.job.entry` on the run directory's payload
and runs the Hydra task function; hpc_llm's is :func:`hpc_llm.job.task.run`.
Who a process is (job id, rank, step) comes from :class:`hpc_llm.job.env.JobEnv`.
Modules here may import torch, Composer and LLM Foundry (lazily, where the
module docstring says so). The login side never imports this package.
"""
