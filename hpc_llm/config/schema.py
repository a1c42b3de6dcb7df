"""Typed schemas for everything hpc_llm owns.

They are registered in Hydra's ConfigStore (:mod:`hpc_llm.config.store`) and
form the base of ``conf/config.yaml``; YAML files only select and override.
Because the nodes are structured, an unknown key anywhere outside ``train`` is
a composition error that names the key. ``train`` holds LLM Foundry's own
train-config keys; those are checked against LLM Foundry's schema by
:mod:`hpc_llm.config.validate`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional


@dataclass
class ResourcesConfig:
    # Nodes in the allocation (Slurm --nodes). Sweepable: -m resources.nodes=1,2,4,8
    nodes: int = 1
    # Ranks per node: one task per GPU on GPU clusters, local processes on CPU.
    tasks_per_node: int = 2
    # GPUs per node requested from Slurm (--gpus-per-node=N); 0 on CPU-only profiles.
    gpus_per_node: int = 0
    # GPU type (a GRES type of the cluster's slurm.conf, e.g. h100, a100): --gpus-per-node=h100:8.
    # None: any GPU (--gpus-per-node=8). The only way to ask for GPUs: a gres or gpus_per_node
    # in cluster.sbatch / hydra.launcher.extra_sbatch is refused.
    gpu_type: Optional[str] = None
    # CPU cores per rank (Slurm --cpus-per-task).
    cpus_per_task: int = 1
    # Memory per node (Slurm --mem), e.g. "64G"; None leaves the partition default.
    mem_per_node: Optional[str] = None
    # Wall-clock limit (Slurm --time): [D-]HH:MM:SS, MM:SS or minutes.
    time: str = "01:00:00"
    # Spare nodes (issue #30): the job asks for nodes + spare_nodes with --no-kill, trains on
    # `nodes` and keeps the spares warm; a dead or blamed node's place is taken by a spare in the
    # same job, without a requeue. Needs Slurm >= 23.02.6 (docs/design/control-plane.md, "Spare nodes").
    spare_nodes: int = 0
    # The fewest nodes the run goes on with (issue #40): a node lost with no spare for it, the run
    # resumes in the same job on the nodes left (or, at a requeue, asks Slurm for what is up), down
    # to min_nodes, and asks for `nodes` again at its next requeue. The global batch stays; every
    # size from min_nodes to nodes is checked before the queue. None: `nodes` (never fewer).
    min_nodes: Optional[int] = None


@dataclass
class ClusterConfig:
    # Profile name (conf/cluster/<name>.yaml).
    name: str = "local"
    # "cpu" or "gpu": picks Composer's device, the dist backend and FSDP defaults.
    device: str = "cpu"
    # Node-local scratch directory for each rank's working directory; None uses
    # $TMPDIR or /tmp. Must not be a shared filesystem (docs/upstream-fixes.md, upstream fix 1).
    scratch: Optional[str] = None
    # Environment exported into every rank (NCCL / network knobs as settings).
    env: dict[str, str] = field(default_factory=dict)
    # Variables passed to the job by name only (secrets: WANDB_API_KEY, AWS_*...);
    # their values are never written into the batch script or logs.
    env_passthrough: list[str] = field(default_factory=list)
    # Slurm defaults of this profile (hydra.launcher.* overrides them).
    partition: Optional[str] = None
    account: Optional[str] = None
    qos: Optional[str] = None
    # sbatch template in sbatch_templates/.
    template: str = "default.sh.j2"
    # Whole nodes only (sbatch --exclusive): GPU profiles want it (no other job's NCCL
    # traffic or memory on their nodes); hydra.launcher.exclusive overrides it.
    exclusive: bool = False
    # Extra #SBATCH flags of this profile, e.g. {constraint: h100}.
    sbatch: dict[str, Any] = field(default_factory=dict)
    # Shell lines run in the batch script before srun (module load ...).
    setup: list[str] = field(default_factory=list)
    # Peak dense bf16 FLOP/s of one GPU (hpc-llm estimate; 989e12 for H100 SXM, 312e12 for A100).
    peak_flops_per_gpu: Optional[float] = None
    # What one GPU-hour costs on this cluster, in your currency (hpc-llm estimate's cost
    # columns; --price overrides it). None: no cost is estimated.
    price_per_gpu_hour: Optional[float] = None


@dataclass
class ParallelismConfig:
    # Strategy plugin: ddp, fsdp, hsdp, or one from an installed package.
    name: str = "ddp"
    # HSDP: ranks that shard one model copy (Composer data_parallel_shard_degree).
    shards: Optional[int] = None
    # HSDP: number of model copies (Composer data_parallel_replicate_degree).
    replicas: Optional[int] = None
    # FSDP implementation: 1 (FSDP1) or 2 (FSDP2, fully_shard). None: 2 on CPU
    # (FSDP1 needs CUDA), 1 on GPU.
    fsdp_version: Optional[int] = None
    # Passed through to Composer's FSDP config (mixed_precision,
    # activation_checkpointing, sharding_strategy, ...).
    options: dict[str, Any] = field(default_factory=dict)
    # An option the FSDP version in use lacks (an FSDP1-only key under FSDP2 on CPU) is
    # dropped with a warning instead of refused; yaml= runs set it (their fsdp_config was
    # written for GPUs).
    lenient: bool = False


@dataclass
class TrainerConfig:
    # The training stack the ranks run (docs/reference/trainers.md): llmfoundry (LLM Foundry +
    # Composer, torch 2.7; the default), torchtitan (torch 2.14, its own environment), or a
    # package's.
    name: str = "llmfoundry"
    # The python of the trainer's environment, when it is not this interpreter's: how the ranks
    # and the check before the queue start (hydra.launcher.python, when set, wins).
    python: Optional[str] = None
    # The trainer's own options (torchtitan: overrides, async_checkpoint, heldout).
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class DataConfig:
    # Data-source plugin: tiny_corpus, mds, hf, or one from an installed package.
    name: str = "tiny_corpus"
    # Local path (directory or file) the source reads; checked before submitting.
    path: Optional[str] = None
    # Remote location (s3://, gs://, oci://, hf://...) streamed by Streaming.
    remote: Optional[str] = None
    # Split names for training and held-out evaluation.
    train_split: str = "train"
    eval_split: str = "val"
    # Source-specific options (typed by the plugin's Options dataclass).
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class CheckpointConfig:
    # Backend plugin: folder (shared filesystem), uri (object store), or a package's.
    name: str = "folder"
    # Folder or URI; None: <run dir>/checkpoints.
    location: Optional[str] = None
    # Composer save_interval ("500ba", "1ep", ...).
    interval: str = "1ep"
    # Checkpoints kept (Composer save_num_checkpoints_to_keep; -1 keeps all).
    keep: int = -1
    # Resume from the latest checkpoint in the folder if there is one (how a
    # requeued job continues; Composer needs a stable run_name, which hpc_llm sets).
    autoresume: bool = True
    # Path or URI to initialise weights from (Composer load_path).
    load_path: Optional[str] = None
    options: dict[str, Any] = field(default_factory=dict)
    # -- object stores (checkpoint=uri) --
    # The run's checkpoints go to <location>/<run name>, a folder of its own. false: to the
    # location as given (a yaml's save_folder, Composer's {run_name} filled in).
    run_subdir: bool = True
    # The folder holds another run's checkpoints (its hpc_llm-run.json names another run): resume
    # them on purpose instead of refusing the run.
    resume_other: bool = False


@dataclass
class EvalConfig:
    # Evaluator plugins run on the held-out split and after training.
    evaluators: list[str] = field(default_factory=lambda: ["heldout"])
    # Composer eval_interval; evaluation also runs at the end of training.
    interval: str = "1ep"
    # Batches per evaluation (-1: the whole held-out split).
    subset_num_batches: int = -1
    # Per-evaluator options, keyed by evaluator name.
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class FaultConfig:
    # Survive what a cluster does to long runs (docs/guides/long-runs.md): save on
    # the Slurm stop signal (hydra.launcher.signal) and requeue; restart after an
    # infrastructure failure or a hang. false: one attempt, no signal, no restart.
    enabled: bool = True
    # Budgets (hpc_llm/job/supervisor/policy.py; docs/design/decision-table.md). A long run
    # lives with failures: what ends it is failing again and again without progress.
    # Infrastructure failures in a row without a new checkpoint (a rank killed by a
    # signal, an NCCL/CUDA/network error, a hang, a node that died): a new checkpoint
    # resets the count. A user error (the same exception at the same batch on another
    # node, or before the first batch) fails the run at once.
    max_failures: int = 5
    # Failures in any 24 h of wall clock (null: no cap): a cluster failing this often is
    # burning the allocation, whatever the checkpoints.
    max_failures_per_day: Optional[float] = 24.0
    # Attempts in a row without a new checkpoint, whatever each was (preemptions and time
    # limits included): a start-up that never reaches a save ends here, not in endless requeues.
    max_attempts_without_progress: int = 10
    # A node blamed for a failure is left out when blamed twice (or at once after a node
    # failure or a failed health check), until it has been this many hours without one.
    forgive_after_h: float = 24.0
    # Lifetime limits per cause (null: none). Time-limit requeues are unlimited by default.
    max_timeouts: Optional[int] = None
    # Preemptions by higher-priority jobs (and stop signals sent by hand).
    max_preemptions: Optional[int] = 100
    # Seconds before the time limit the ranks stop and save. null: twice the longest
    # checkpoint save measured so far plus 30 s, at most hydra.launcher.signal_lead_s
    # (the --signal lead, which is all there is before the first save is measured).
    stop_lead_s: Optional[float] = None
    # After a failure with no suspect node, restart inside the same allocation (no
    # queue wait); a node that fails twice is suspect and the job is requeued without it.
    restart_in_place: bool = True
    # With spare nodes: when the batch host is lost (dead, or cut off), an agent on another
    # node takes the supervisor's place in the same job and a spare trains in the host's
    # place; false: the agents requeue the job without the host, as without this.
    take_over: bool = True
    # The period of every heartbeat (docs/design/control-plane.md, "Agents, detection and restarts"):
    # each rank into its node agent's shared memory, each agent to the supervisor over the
    # network (a node's file in the run dir shows them too).
    heartbeat_s: float = 1.0
    # An agent silent this long is suspect: the supervisor probes it (a request on a
    # connection of its own) and, unanswered after probe_timeout_s, calls its node dead:
    # the run goes on without it at once, never waiting for Slurm to notice (SlurmdTimeout).
    node_timeout_s: float = 3.0
    probe_timeout_s: float = 1.5
    # A hang is judged by the run's own pace: no batch for hang_factor x the median step
    # time measured so far (never less than hang_floor_s), a checkpoint save or upload
    # (a storage stall: nobody blamed), or an evaluation, longer than hang_factor x the
    # longest one seen. A rank silent for max(3 heartbeats, hang_floor_s) is frozen.
    hang_factor: float = 10.0
    hang_floor_s: float = 60.0
    # The limit where there is no pace to judge by yet: the first batches of a start, the
    # first save or evaluation.
    hang_timeout_s: float = 1800.0
    # From a start until every rank trains its first batch (the agents' imports, container,
    # set-up, data, model build and rendezvous); past it the start is ended and the stop is
    # a failure naming the phase it was stuck in. null: no limit.
    startup_timeout_s: Optional[float] = 3600.0
    # torch.distributed process-group timeout (LLM Foundry dist_timeout): a
    # collective stuck longer raises on every rank instead of holding the allocation.
    # null: 600 s, or half the time limit when that is shorter.
    collective_timeout_s: Optional[float] = None


@dataclass
class PreflightConfig:
    # Run the health checks inside the job before training (hpc-llm preflight runs them alone).
    enabled: bool = False
    # Set by `hpc-llm preflight`: stop after the checks, do not train.
    only: bool = False
    # Health-check plugins, in order: allreduce, gpu, container, or a package's.
    checks: list[str] = field(default_factory=lambda: ["allreduce", "gpu", "container"])
    # All-reduce message sizes run from 8 B up to this many bytes (powers of two);
    # None: 256 MiB on GPUs, 1 MiB on CPU.
    max_bytes: Optional[int] = None
    # Timed all-reduces per size, after `warmup` untimed ones.
    iters: int = 5
    warmup: int = 2
    # Stop before training when the peak all-reduce bus bandwidth (GB/s) is lower.
    min_busbw_gbps: Optional[float] = None
    # Stop before training when a GPU's bf16 matmul TFLOP/s is lower (H100 SXM: ~700-800).
    min_tflops: Optional[float] = None
    # Square bf16 matmul size for the GPU check.
    matmul_size: int = 8192
    # On failure, requeue the job excluding the node(s) the checks named (when they
    # are only part of the allocation; counts against fault.max_failures).
    exclude_bad_nodes: bool = False


@dataclass
class WatchdogConfig:
    # Watch training throughput (tokens/s; MFU on GPUs is proportional to it).
    enabled: bool = False
    # Batches in the running median.
    window: int = 20
    # Warn when a batch runs below this fraction of the running median...
    fraction: float = 0.5
    # ...for this many batches in a row.
    patience: int = 3
    # warn: log it (and record it in results.json); requeue: also checkpoint and
    # requeue the job, as on preemption.
    action: str = "warn"


@dataclass
class StragglerConfig:
    # Find a slow node (docs/guides/long-runs.md, "Slow nodes"): each rank measures the time
    # per batch it is busy, waits inside collectives taken out (the slow node's ranks wait
    # least); the supervisor compares the nodes. Multi-node runs only.
    enabled: bool = True
    # A node whose busy time per batch is this many times the median of the other nodes'
    # is slow. 2: a node 3x slower is found; the test suite's 72 fault-free multi-node
    # attempts on a busy 2-core machine raised no verdict.
    factor: float = 2.0
    # Batches per window: each rank's figure is the median of a window's batches.
    window: int = 10
    # Windows in a row the same node must be slow: 2 finds a node 3x slower within 3 windows.
    patience: int = 2
    # warn: log and record the verdict; swap: save and put a spare in its place, in the
    # same job (as for a dead node; without a spare left, as exclude); exclude: leave it
    # out at the next requeue. Every verdict is in results.json with the figures per node.
    action: str = "warn"


@dataclass
class ContainerConfig:
    # Container runtime plugin: none (the node's Python), apptainer, or a package's.
    name: str = "none"
    # Image the tasks run in (apptainer: a .sif file on a filesystem every node sees).
    image: Optional[str] = None
    # Extra binds, "src[:dest[:ro|rw]]". The run dir, data.path, checkpoint folder,
    # the hpc_llm cache and cluster.scratch are bound automatically.
    binds: list[str] = field(default_factory=list)
    # Extra runtime flags, e.g. ["--writable-tmpfs"].
    flags: list[str] = field(default_factory=list)
    # Variables passed into the container by name only (added to the cluster's).
    env_passthrough: list[str] = field(default_factory=list)
    # Python inside the image.
    python: str = "python3"
    # GPU support (apptainer --nv); None: on when cluster.device=gpu.
    gpus: Optional[bool] = None
    # Copy the image to node-local scratch first (slow squashfuse on a shared FS).
    stage: bool = False
    # One quick exec per node before training; a node that fails is named.
    check: bool = True
    # The runtime's executable on the nodes.
    executable: str = "apptainer"


@dataclass
class LoggerConfig:
    # Experiment tracker: none, mlflow or wandb (conf/logger/), through Composer's loggers.
    name: str = "none"
    # mlflow: the tracking server (or MLFLOW_TRACKING_URI); experiment: null is one per sweep.
    tracking_uri: Optional[str] = None
    experiment: Optional[str] = None
    synchronous: bool = True
    # wandb: project, entity, mode (online / offline).
    project: Optional[str] = None
    entity: Optional[str] = None
    mode: str = "online"
    # Extra tags on the tracker run (hpc_llm adds run, sweep, nodes, Slurm job ids, commit).
    tags: dict[str, str] = field(default_factory=dict)


# -- the first hour (issue 32): checks before the queue ---------------------------------


@dataclass
class PrecheckConfig:
    # Before anything is submitted, put every point's train config through LLM Foundry's and
    # Composer's own code in the job's environment (the venv or the image; one process for
    # the whole sweep, no data or weights): bad times, precisions, optimizer and scheduler
    # arguments, registry names, loader arguments and batch splits are refused here instead
    # of after the queue wait. false (or HPC_LLM_PRECHECK=0 in the environment): skip it.
    enabled: bool = True
    # Keep the stack imported between submits in a warm checker of the user's on this host (one
    # per environment; docs/guides/precheck.md); false: one process per submit.
    warm: bool = True
    # The warm checker ends itself after this many seconds without a submit (it holds ~1 GB).
    idle_s: float = 600
    # Answer a point already checked with the same stack (and environment) from the cache of
    # verdicts in <hpc_llm home>/precheck/cache; false: check every point again.
    cache: bool = True


@dataclass
class PluginsConfig:
    # Plugins (entry-point or distribution names) not to load.
    block: list[str] = field(default_factory=list)


@dataclass
class HpcLlmConfig:
    # Experiment name, set by conf/experiment/<name>.yaml.
    experiment: str = "default"
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    resources: ResourcesConfig = field(default_factory=ResourcesConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    parallelism: ParallelismConfig = field(default_factory=ParallelismConfig)
    data: DataConfig = field(default_factory=DataConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    fault: FaultConfig = field(default_factory=FaultConfig)
    container: ContainerConfig = field(default_factory=ContainerConfig)
    preflight: PreflightConfig = field(default_factory=PreflightConfig)
    watchdog: WatchdogConfig = field(default_factory=WatchdogConfig)
    straggler: StragglerConfig = field(default_factory=StragglerConfig)
    plugins: PluginsConfig = field(default_factory=PluginsConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    precheck: PrecheckConfig = field(default_factory=PrecheckConfig)
    # An LLM Foundry train yaml (the file `composer train/train.py` takes), run as written:
    # it becomes `train` whole (docs/guides/your-yaml.md). None: train comes from the presets.
    yaml: Optional[str] = None
    # LLM Foundry train config (model, optimizer, max_duration, ...).
    train: dict[str, Any] = field(default_factory=dict)
