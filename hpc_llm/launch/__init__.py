"""Launch, on the login node: Hydra's launchers and sweeper (found through
hydra_plugins/hpc_llm_launchers).

The sweeper composes and checks every job of a sweep before anything is created;
``hydra/launcher=local`` runs each job's ranks as processes here,
``hydra/launcher=slurm`` submits each job (or an array per shape) through
:mod:`hpc_llm.launch.sbatch`. Both write the run directory's payload
(:mod:`hpc_llm.rundir.payload`), which is what the job runs.
"""
