"""In the job: what runs inside the allocation, on the compute nodes, by process.

* :mod:`hpc_llm.job.supervisor`: one per allocation, on the batch host. The batch script
  execs it; it starts the agents (one srun step, an agent per node), runs one generation of
  ranks after another through them, and decides what each end of a generation means (watch,
  decide with the pure fault policy, act). Stdlib only.
* :mod:`hpc_llm.job.agent`: one per node, for the whole allocation. It imports the training
  stack once and forks each generation's ranks on its node, passes them stop signals, reports
  how each ended, and fences them off when it loses the supervisor. Its control loop is
  stdlib only; the stack it warms is loaded on purpose.
* :mod:`hpc_llm.job.rank`: one per GPU. Each rank starts in :mod:`hpc_llm.job.rank.entry` on
  the run directory's payload and runs the Hydra task function; hpc_llm's is
  :func:`hpc_llm.job.rank.task.run`. It imports torch, Composer and LLM Foundry.

What they share sits here: the messages between supervisor and agents
(:mod:`hpc_llm.job.messages`) and their transport (:mod:`hpc_llm.job.wire`), who a process
is (:class:`hpc_llm.job.env.JobEnv`, the one reader of ``SLURM_*``), the heartbeats
(:mod:`hpc_llm.job.heartbeat`) and how ranks fail (:mod:`hpc_llm.job.failures`), all stdlib
only. The login side never imports this package.
"""
