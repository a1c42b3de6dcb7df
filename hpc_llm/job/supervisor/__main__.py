"""``python -m hpc_llm.job.supervisor --run-dir DIR [policy] -- srun ...`` (the batch script's exec)."""

from hpc_llm.job.supervisor.main import main

main()
