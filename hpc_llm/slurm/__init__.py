"""Slurm's client commands, asked from the login node (sinfo, squeue, scontrol, sacct).

:mod:`~hpc_llm.slurm.query` asks slurmctld (partitions, the queue, a job, the running config,
nodes, associations); :mod:`~hpc_llm.slurm.accounting` asks slurmdbd (``sacct``: every attempt
of a job). The job's supervisor asks ``sacct`` through :mod:`hpc_llm.slurm.accounting` too.
Writing the sbatch script and submitting it is :mod:`hpc_llm.launch.sbatch`; ``hpc-llm
doctor`` is :mod:`hpc_llm.doctor`; the dev cluster the tests run against is
:mod:`hpc_llm.devcluster`.
"""
