"""In the job: what runs inside the allocation, on the compute nodes, by process.

* :mod:`hpc_llm.job.supervisor`: one per allocation, on the batch host. The
  batch script execs it; it runs the training step (``srun``), watches it and
  decides what each end of it means (observe, decide with the pure fault
  policy, act). Stdlib only.
* :mod:`hpc_llm.job.rank`: one per GPU (per task). Each rank starts in
  :mod:`hpc_llm.job.rank.entry` on the run directory's payload and runs the
  Hydra task function; hpc_llm's is :func:`hpc_llm.job.rank.task.run`. It
  imports torch, Composer and LLM Foundry.

What two of them share sits here: who a process is (:class:`hpc_llm.job.env.JobEnv`,
the one reader of ``SLURM_*``), the heartbeats (:mod:`hpc_llm.job.heartbeat`)
and the failure reports (:mod:`hpc_llm.job.failures`), all stdlib only. The
login side never imports this package.
"""
