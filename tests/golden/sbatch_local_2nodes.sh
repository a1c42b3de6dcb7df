#!/bin/bash
# Rendered by hpc_llm from sbatch_templates/default.sh.j2 (cluster profile 'local').
# Run directory: /shared/runs/golden/0
# Every value below is shell-quoted; secrets are passed by variable name only.
#SBATCH --cpus-per-task=1
#SBATCH --job-name=hpc_llm-mpt_tiny
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=2
#SBATCH --open-mode=append
#SBATCH --output=/shared/runs/golden/0/logs/slurm-%j.out
#SBATCH --requeue
#SBATCH --signal=B:USR2@120
#SBATCH --time=00:30:00

set -euo pipefail

# Rendezvous, resolved on the batch host from the allocation (scontrol may not
# exist inside a container): the first node's address, a port from the job id.
first_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
MASTER_ADDR=$(scontrol show node "$first_node" -o | sed -n 's/.* NodeAddr=\([^ ]*\).*/\1/p')
export MASTER_ADDR="${MASTER_ADDR:-$first_node}"
export MASTER_PORT=$(( 20000 + SLURM_JOB_ID % 20000 ))
export HPC_LLM_STOP_SIGNAL=USR2
export OMP_NUM_THREADS=1
export SUBMITIT_EXECUTOR=slurm

# One task per rank; RANK/LOCAL_RANK/WORLD_SIZE/NODE_RANK come from SLURM_* in
# each task, and each rank works in node-local scratch (hpc_llm.job.task).
set +e
srun --unbuffered --kill-on-bad-exit=1 --output=/shared/runs/golden/0/logs/rank%t.log --open-mode=append \
  /opt/hpc_llm/venv/bin/python -u -m submitit.core._submit /shared/runs/golden/0/.submitit &
srun_pid=$!

# Slurm signals only this shell (--signal=B:...): signalling every step would
# also end the job's extern step, and with it the job container's /tmp, just
# when the ranks need it to checkpoint. srun forwards the signal to every rank.
trap 'kill -s USR2 "$srun_pid" 2>/dev/null' USR2

while true; do
  wait "$srun_pid"
  rc=$?
  kill -0 "$srun_pid" 2>/dev/null || break
done
exit "$rc"
