"""What comes back, on the login node: the run ledger, ``hpc-llm status`` / ``wait`` /
``logs``, the sweep report (the seeds' tables), the estimator, preflight tables and
the console a person watches, all formatted through :mod:`hpc_llm.results.format`.
They read each run's own record (:mod:`hpc_llm.rundir.record`) and Slurm's accounting.
"""
