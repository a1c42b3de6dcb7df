#!/bin/bash
# Rendered by hpc_llm from sbatch_templates/default.sh.j2 (cluster profile 'h100').
# Run directory: /shared/runs/golden/0
# Every value below is shell-quoted; secrets are passed by variable name only.
#SBATCH --cpus-per-task=12
#SBATCH --exclusive
#SBATCH --export=AWS_ACCESS_KEY_ID,AWS_SECRET_ACCESS_KEY,CONDA_PREFIX,HF_DATASETS_OFFLINE,HF_HOME,HF_HUB_OFFLINE,HF_TOKEN,HOME,HPC_LLM_BLOCK_PLUGINS,HPC_LLM_CACHE,HPC_LLM_DATA,HPC_LLM_HOME,HPC_LLM_NO_EXTERNAL_PLUGINS,HPC_LLM_RUNS,LANG,LC_ALL,LD_LIBRARY_PATH,MLFLOW_TRACKING_TOKEN,MLFLOW_TRACKING_URI,PATH,PYTHONPATH,TRANSFORMERS_OFFLINE,TZ,USER,VIRTUAL_ENV,WANDB_API_KEY,WANDB_DIR,WANDB_ENTITY,WANDB_MODE,WANDB_PROJECT
#SBATCH --gpus-per-node=8
#SBATCH --job-name=hpc_llm-mpt125m_c4
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=8
#SBATCH --open-mode=append
#SBATCH --output=/shared/runs/golden/0/logs/slurm-%j.out
#SBATCH --requeue
#SBATCH --signal=B:USR2@120
#SBATCH --time=1-00:00:00

# Slurm's stop signal may come before anything can take it (sbatch(1): up to 60 s early, or a
# preemption at start-up): ignored until the supervisor has its handler, it can never end the
# job unrecorded; the supervisor reads the end time and any preemption itself.
trap '' USR2
set -euo pipefail
# Each attempt (Slurm's restart count) writes its own log: a stale attempt, on a host cut off
# and healed after Slurm requeued the job, never writes into the file of the attempt after it
# (Slurm's file name patterns have no restart count; its own --output keeps slurmstepd's lines).
job_ref="${SLURM_ARRAY_JOB_ID:+${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID:-}}"
exec >> /shared/runs/golden/0/logs/"slurm-${job_ref:-$SLURM_JOB_ID}.${SLURM_RESTART_COUNT:-0}.out" 2>&1

# The batch host's address: the supervisor listens there for the node agents (resolved here:
# scontrol may not exist inside a container). Each generation of ranks meets on a port node
# rank 0's agent finds free; this one, from the job id, is the fallback.
master_node="${SLURMD_NODENAME:-$(hostname -s)}"
MASTER_ADDR=$(scontrol show node "$master_node" -o 2>/dev/null | sed -n 's/.* NodeAddr=\([^ ]*\).*/\1/p') || true
export MASTER_ADDR="${MASTER_ADDR:-$master_node}"
export MASTER_PORT=$(( 20000 + SLURM_JOB_ID % 12000 ))
export HPC_LLM_STOP_SIGNAL=USR2
export NCCL_ASYNC_ERROR_HANDLING=1
export OMP_NUM_THREADS=12
export SUBMITIT_EXECUTOR=slurm
export TORCH_NCCL_ASYNC_ERROR_HANDLING=1

# Passed through by name from the submitting environment (never written here):
# AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY HF_TOKEN MLFLOW_TRACKING_TOKEN MLFLOW_TRACKING_URI WANDB_API_KEY

# The supervisor (hpc_llm.job.supervisor) starts one agent per node (hpc_llm.job.agent, one
# srun step for the whole allocation); each agent imports the training stack once and forks
# its node's ranks for every generation (RANK/LOCAL_RANK/WORLD_SIZE/NODE_RANK from the
# supervisor's layout, each node's ranks in node-local scratch). The supervisor passes Slurm's
# stop signal on to the ranks, watches the agents and the ranks' heartbeats, and restarts in
# place, requeues or fails the run by the cause of a stop (docs/design/decision-table.md).
# It runs as this script's child, not in its place: this shell passes it the stop signal
# (Slurm's --signal=B:... reaches only this shell) and SIGTERM, and a supervisor that dies of a
# signal (the OOM killer, a crash of the interpreter) is started again in this allocation, up
# to 3 times; it takes command of the run from the dead one (its
# epoch: docs/design/epoch.md, "The batch script"). Its own exit status is the job's.
set +e
restarts=0
while :; do
  HPC_LLM_SUPERVISOR_RESTARTS=$restarts /opt/hpc_llm/venv/bin/python -u -m hpc_llm.job.supervisor --run-dir /shared/runs/golden/0 --nodes 1 --tasks-per-node 8 --signal USR2 --signal-lead-s 120 --max-preemptions 100 --max-failures 5 --max-attempts-without-progress 10 --forgive-after-s 86400 --heartbeat-s 1 --node-timeout-s 3 --probe-timeout-s 1.5 --hang-factor 10 --hang-floor-s 60 --hang-timeout-s 1800 --startup-timeout-s 3600 --max-failures-per-day 24 -- \
    srun --unbuffered --export=ALL --nodes=1 --ntasks=1 --ntasks-per-node=1 --cpus-per-task=96 --kill-on-bad-exit=0 --output=/shared/runs/golden/0/logs/agent%t.log --open-mode=append \
    /opt/hpc_llm/venv/bin/python -u -m hpc_llm.job.agent /shared/runs/golden/0/.hpc_llm/job.pkl &
  supervisor=$!
  trap 'kill -USR2 "$supervisor" 2>/dev/null' USR2
  trap 'terminated=1; kill -TERM "$supervisor" 2>/dev/null' TERM
  # a trapped signal interrupts wait (its status then > 128 while the supervisor lives on)
  while :; do
    wait "$supervisor"; status=$?
    if [ "$status" -le 128 ] || ! kill -0 "$supervisor" 2>/dev/null; then break; fi
  done
  wait "$supervisor" 2>/dev/null; again=$?
  [ "$again" -ne 127 ] && status=$again
  trap '' USR2
  if [ -n "${terminated:-}" ] || [ "$status" -le 128 ] || [ "$restarts" -ge 3 ]; then
    exit "$status"
  fi
  restarts=$((restarts + 1))
  echo "hpc_llm: the supervisor died (exit status $status): starting it again ($restarts of 3)" >&2
  export HPC_LLM_SUPERVISOR_DIED=$status
done
