"""One Slurm job on the login node: its config -> the sbatch script, checked, then submitted.

:mod:`~hpc_llm.launch.sbatch.spec` turns a composed job config and the launcher's options into
an :class:`~hpc_llm.launch.sbatch.render.SbatchSpec`; :mod:`~hpc_llm.launch.sbatch.render`
renders it from ``sbatch_templates/``; :mod:`~hpc_llm.launch.sbatch.checks` asks Slurm whether
it could run (placement, ``sbatch --test-only``) before anything exists;
:mod:`~hpc_llm.launch.sbatch.submit` submits it (submitit, or one array per shape);
:mod:`~hpc_llm.launch.sbatch.preview` composes one job exactly as it would be submitted, for
``hpc-llm render`` and ``hpc-llm doctor``. Login side.
"""
