"""The embedded dev/test infrastructure: a real Slurm mini-cluster on this machine, its
accounting database and an S3 server. Not what a user's cluster runs, and not the login
node's Slurm client (that is :mod:`hpc_llm.slurm`).

:mod:`~hpc_llm.devcluster.cluster` starts and stops slurmctld, slurmdbd and one slurmd per node
(``hpc-llm dev-cluster up``, and the test fixtures); :mod:`~hpc_llm.devcluster.accounting_db`
runs the MariaDB slurmdbd stores accounting in; :mod:`~hpc_llm.devcluster.s3_server` runs
SeaweedFS as the cluster's object store (``--s3``). It runs on the login node (this machine),
started by ``hpc-llm dev-cluster up`` or the tests; the jobs it runs are the in-job side's.
"""
