"""What the job's supervisor tells the ranks of a step it runs (environment variables)."""

#: set for every rank of a supervised step: a stop is recorded, and the supervisor acts on it
SUPERVISED = "HPC_LLM_SUPERVISED"
#: the launch number inside the allocation (0, then 1 after a restart in place, ...)
STEP = "HPC_LLM_STEP"
#: the allocation's nodes, comma-separated
NODES = "HPC_LLM_NODES"
#: when Slurm started the allocation (epoch seconds)
ALLOC_START = "HPC_LLM_ALLOC_START"
#: seconds between a rank's heartbeats
HEARTBEAT_S = "HPC_LLM_HEARTBEAT_S"
