"""Slurm itself, on the login node: one job's config -> the sbatch script
(spec, render), submitting it (submitit, arrays), asking Slurm (sinfo,
squeue, scontrol, sacct) and the dev cluster the tests run against.
The job's supervisor asks ``sacct`` through :mod:`hpc_llm.slurm.accounting` too.
``hpc-llm doctor`` (:mod:`hpc_llm.slurm.doctor`) says what a cluster offers of what hpc_llm needs.
"""
