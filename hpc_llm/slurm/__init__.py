"""Slurm specifics: the dev cluster, sbatch rendering, the submitit executor, queries."""
