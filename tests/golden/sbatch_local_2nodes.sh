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

# Slurm signals only this shell (--signal=B:...): signalling every step would
# also end the job's extern step, and with it the job container's /tmp, just
# when the ranks need it to checkpoint. The signal is forwarded to every rank
# through srun once each rank has installed its handler (it writes a marker
# in /shared/runs/golden/0/.hpc_llm/ready); a rank still starting Python would die of it.
srun_pid=""
stop_pending=0
forward_stop() {
  if [ -z "$srun_pid" ]; then stop_pending=1; return 0; fi
  local i n
  for i in $(seq 1 1200); do
    kill -0 "$srun_pid" 2>/dev/null || return 0
    n=$(find /shared/runs/golden/0/.hpc_llm/ready -maxdepth 1 -name "${SLURM_JOB_ID}.${SLURM_RESTART_COUNT:-0}.*" 2>/dev/null | wc -l)
    [ "$n" -ge "${SLURM_NTASKS:-1}" ] && break
    sleep 0.1
  done
  kill -s USR2 "$srun_pid" 2>/dev/null
}
trap forward_stop USR2

# Rendezvous, resolved on the batch host from the allocation (scontrol may not
# exist inside a container): the first node's address, a port from the job id.
first_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
MASTER_ADDR=$(scontrol show node "$first_node" -o | sed -n 's/.* NodeAddr=\([^ ]*\).*/\1/p')
export MASTER_ADDR="${MASTER_ADDR:-$first_node}"
export MASTER_PORT=$(( 20000 + SLURM_JOB_ID % 12000 ))
export HPC_LLM_STOP_SIGNAL=USR2
export OMP_NUM_THREADS=1
export SUBMITIT_EXECUTOR=slurm

# One task per rank; RANK/LOCAL_RANK/WORLD_SIZE/NODE_RANK come from SLURM_* in
# each task, and each rank works in node-local scratch (hpc_llm.job.task).
set +e
srun --unbuffered --kill-on-bad-exit=1 --output=/shared/runs/golden/0/logs/rank%t.log --open-mode=append \
  /opt/hpc_llm/venv/bin/python -u -m submitit.core._submit /shared/runs/golden/0/.submitit &
srun_pid=$!
if [ "$stop_pending" = 1 ]; then forward_stop; fi

while true; do
  wait "$srun_pid"
  rc=$?
  kill -0 "$srun_pid" 2>/dev/null || break
done
exit "$rc"
