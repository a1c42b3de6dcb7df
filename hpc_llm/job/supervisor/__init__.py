"""The supervisor: one process per allocation, on the batch host, in the job.

``python -m hpc_llm.job.supervisor`` (:mod:`hpc_llm.job.supervisor.loop`) runs
the training step and watches it; :mod:`~hpc_llm.job.supervisor.policy` decides
what a stop means (a pure function); :mod:`~hpc_llm.job.supervisor.agent_step` starts,
signals and kills the step; :mod:`~hpc_llm.job.supervisor.hang_watch` judges the
ranks' heartbeats; :mod:`~hpc_llm.job.supervisor.slurm_job` asks Slurm about
this allocation and requeues it. Stdlib only: no training stack on the batch host.
"""
