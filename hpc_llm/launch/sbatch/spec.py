"""One composed job config + the Slurm launcher's options -> an SbatchSpec.

Pure (login node). Used by the Slurm launcher for what it submits and by
``hpc-llm render`` for what it prints, so the two cannot drift apart.
The launcher is a general Hydra launcher: it reads the job's resources from
``<resources_key>`` and cluster-profile defaults from ``<cluster_key>`` when
the app has them, and falls back to one task on one node.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, OmegaConf

from hpc_llm.config import stores
from hpc_llm.config.plan import check_gpu_type, parse_time_limit
from hpc_llm.errors import ConfigError
from hpc_llm.launch.job_python import job_python
from hpc_llm.launch.sbatch.render import SbatchSpec
from hpc_llm.rundir.layout import RunDir

DEFAULT_TEMPLATE = "default.sh.j2"


@dataclass(frozen=True)
class JobResources:
    nodes: int = 1
    tasks_per_node: int = 1
    gpus_per_node: int = 0
    cpus_per_task: int = 1
    mem_per_node: str | None = None
    time_s: int = 3600
    #: a GRES type (h100): --gpus-per-node=h100:8; None: any GPU
    gpu_type: str | None = None
    #: nodes kept warm beside the training nodes, in the same allocation (--no-kill)
    spare_nodes: int = 0
    #: the fewest nodes the run goes on with (--no-kill below ``nodes``); None: ``nodes``
    min_nodes: int | None = None

    @property
    def no_kill(self) -> bool:
        """A dead node leaves the job instead of ending it: a spare takes its place, or the run
        goes on with fewer nodes (resources.min_nodes)."""
        return bool(self.spare_nodes) or (self.min_nodes is not None and self.min_nodes < self.nodes)

    @property
    def alloc_nodes(self) -> int:
        """The nodes the job asks Slurm for: the training nodes and the spares."""
        return self.nodes + self.spare_nodes

    @property
    def gpus_flag(self) -> str | int | None:
        """The one --gpus-per-node value of the job (None: no GPUs)."""
        if not self.gpus_per_node:
            return None
        return f"{self.gpu_type}:{self.gpus_per_node}" if self.gpu_type else self.gpus_per_node


def job_resources(cfg: DictConfig, opts: DictConfig) -> JobResources:
    """The job's resources; raises on an unparsable time limit or a GPU request outside them."""
    r = OmegaConf.select(cfg, str(opts.resources_key), default=None) or {}
    time_text = opts.time or r.get("time") or "01:00:00"
    gpus = int(r.get("gpus_per_node", 0) or 0)
    res = JobResources(
        nodes=int(r.get("nodes", 1)),
        tasks_per_node=int(r.get("tasks_per_node", 1)),
        gpus_per_node=gpus,
        cpus_per_task=int(r.get("cpus_per_task", 1)),
        mem_per_node=r.get("mem_per_node"),
        time_s=parse_time_limit(time_text),
        gpu_type=check_gpu_type(r.get("gpu_type"), gpus),
        spare_nodes=int(r.get("spare_nodes", 0) or 0),
        min_nodes=r.get("min_nodes"),
    )
    if res.spare_nodes < 0:
        raise ConfigError(
            f"{opts.resources_key}.spare_nodes={res.spare_nodes}: must be >= 0 (0: no spares, the default)"
        )
    check_gpu_passthrough(cfg, opts, res)
    return res


#: #SBATCH keys that ask for GPUs per node or in all (gres only for its gpu entries)
GPU_FLAGS = ("gpus_per_node", "gpus", "gres")


def _asks_gpus(key: str, value: Any) -> bool:
    if key != "gres":
        return True
    # --gres=gpu:h100:8,nvme:1 (or gres/gpu:8): a GPU request only in its gpu entries
    return any(e.strip().split(":")[0].removeprefix("gres/") == "gpu" for e in str(value).split(","))


def check_gpu_passthrough(cfg: DictConfig, opts: DictConfig, res: JobResources) -> None:
    """GPUs are asked for in one place, ``resources.gpus_per_node`` (+ ``resources.gpu_type``),
    rendered as one ``--gpus-per-node``: a gres / gpus_per_node / gpus flag passed through
    beside it would be a second, conflicting request (Slurm takes both)."""
    sources = (
        (f"{opts.cluster_key}.sbatch", OmegaConf.select(cfg, f"{opts.cluster_key}.sbatch", default=None)),
        ("hydra.launcher.extra_sbatch", opts.extra_sbatch),
    )
    for where, flags in sources:
        for key, value in (flags or {}).items():
            name = str(key).replace("-", "_")
            if name in GPU_FLAGS and value not in (None, False) and _asks_gpus(name, value):
                n, kind = res.gpus_per_node, res.gpu_type
                asked = (
                    f"beside resources.gpus_per_node={n} (--gpus-per-node={res.gpus_flag})"
                    if n
                    else "outside resources.gpus_per_node (0 here)"
                )
                raise ConfigError(
                    f"{where}.{key}={value!r} asks Slurm for GPUs {asked}; allowed: GPUs only through "
                    f"resources.gpus_per_node, with resources.gpu_type for a GPU type (resources.gpu_type="
                    f"{kind or 'h100'} renders --gpus-per-node={kind or 'h100'}:{n or 8}); remove {where}.{key}"
                )


def slurm_time(seconds: int) -> str:
    days, rest = divmod(int(seconds), 86400)
    h, rest = divmod(rest, 3600)
    m, s = divmod(rest, 60)
    return f"{days}-{h:02d}:{m:02d}:{s:02d}" if days else f"{h:02d}:{m:02d}:{s:02d}"


def python_command(opts: DictConfig, cfg: DictConfig | None = None) -> list[str]:
    """How each task starts Python (a container runtime may wrap it): hydra.launcher.python, else
    the trainer's environment (:mod:`hpc_llm.launch.job_python`)."""
    return job_python(cfg, opts.python)


#: Signals srun passes to the tasks unchanged: it kills the step on TERM, HUP and
#: QUIT, prints a status on the first INT and aborts on the second, and keeps
#: CONT, ALRM and PIPE to itself (Slurm's src/srun/srun_job.c, _srun_signal_mgr;
#: docs/design/control-plane.md). Of USR1 and USR2, NCCL uses USR1.
STOP_SIGNALS = ("USR2",)


def stop_signal(name: str) -> str:
    """The launcher's stop signal, checked: one srun forwards to the ranks as it is."""
    bare = str(name).upper().removeprefix("SIG")
    if bare not in STOP_SIGNALS:
        why = {
            "USR1": "NCCL uses SIGUSR1",
            "TERM": "srun answers SIGTERM by killing the step (the ranks could not save)",
            "HUP": "srun answers SIGHUP by killing the step",
            "QUIT": "srun answers SIGQUIT by killing the step",
            "INT": "srun only prints a status on the first SIGINT",
        }.get(bare, "srun would not pass it to the ranks unchanged")
        raise ConfigError(f"hydra.launcher.signal={name!r}: {why}; allowed: {', '.join(STOP_SIGNALS)}")
    return bare


def supervisor_command(
    cfg: DictConfig, opts: DictConfig, run_dir: str, res: JobResources, sig: str | None
) -> list[str]:
    """``python -m hpc_llm.job.supervisor`` with the run's fault-tolerance policy (``fault.*``).

    A Hydra app without a ``fault`` section gets one attempt and no stop signal."""
    fault = OmegaConf.select(cfg, "fault", default=None)
    args = [
        *python_command(opts, cfg),
        "-u",
        "-m",
        "hpc_llm.job.supervisor",
        "--run-dir",
        run_dir,
        "--nodes",
        str(res.nodes),
        "--tasks-per-node",
        str(res.tasks_per_node),
    ]
    if fault is None or not fault.enabled or sig is None:
        return [*args, "--no-recover"]
    args += [
        "--signal",
        sig,
        "--signal-lead-s",
        str(int(opts.signal_lead_s)),
        "--max-preemptions",
        str(fault.max_preemptions),
        "--max-failures",
        str(fault.max_failures),
        "--max-attempts-without-progress",
        str(fault.max_attempts_without_progress),
        "--forgive-after-s",
        f"{float(fault.forgive_after_h) * 3600:g}",
        "--heartbeat-s",
        f"{float(fault.heartbeat_s):g}",
        "--node-timeout-s",
        f"{float(fault.node_timeout_s):g}",
        "--probe-timeout-s",
        f"{float(fault.probe_timeout_s):g}",
        "--hang-factor",
        f"{float(fault.hang_factor):g}",
        "--hang-floor-s",
        f"{float(fault.hang_floor_s):g}",
        "--hang-timeout-s",
        f"{float(fault.hang_timeout_s):g}",
    ]
    if fault.startup_timeout_s is not None:
        args += ["--startup-timeout-s", f"{float(fault.startup_timeout_s):g}"]
    if fault.max_failures_per_day is not None:
        args += ["--max-failures-per-day", f"{float(fault.max_failures_per_day):g}"]
    if fault.max_timeouts is not None:
        args += ["--max-timeouts", str(fault.max_timeouts)]
    if fault.stop_lead_s is not None:
        args += ["--stop-lead-s", f"{float(fault.stop_lead_s):g}"]
    if not fault.restart_in_place:
        args.append("--no-restart-in-place")
    if not fault.take_over:
        args.append("--no-take-over")
    if res.min_nodes is not None and res.min_nodes < res.nodes:
        args += ["--min-nodes", str(res.min_nodes)]
    straggler = OmegaConf.select(cfg, "straggler", default=None)
    if straggler is not None and straggler.enabled and res.nodes > 1:
        args += [
            "--straggler-factor",
            f"{float(straggler.factor):g}",
            "--straggler-patience",
            str(int(straggler.patience)),
            "--straggler-action",
            str(straggler.action),
        ]
    return args


#: what a job needs from the submitting environment, besides the secrets passed by name
#: (env_passthrough). sbatch --export lists them, so a site with SBATCH_EXPORT=NONE still
#: gets them and nothing else leaks in; SLURM_* always pass.
JOB_ENVIRONMENT = (
    "PATH",
    "LD_LIBRARY_PATH",
    "PYTHONPATH",
    "VIRTUAL_ENV",
    "CONDA_PREFIX",
    "HOME",
    "USER",
    "LANG",
    "LC_ALL",
    "TZ",
    "HF_HOME",
    "HF_HUB_OFFLINE",
    "HF_DATASETS_OFFLINE",
    "TRANSFORMERS_OFFLINE",
    "HPC_LLM_CACHE",
    "HPC_LLM_RUNS",
    "HPC_LLM_HOME",
    "HPC_LLM_DATA",
    "HPC_LLM_BLOCK_PLUGINS",
    "HPC_LLM_NO_EXTERNAL_PLUGINS",
    # experiment trackers (conf/logger/): where they log; secrets by name only
    "MLFLOW_TRACKING_URI",
    "MLFLOW_TRACKING_TOKEN",
    "WANDB_API_KEY",
    "WANDB_MODE",
    "WANDB_DIR",
    "WANDB_PROJECT",
    "WANDB_ENTITY",
)


def export_list(passthrough: list[str]) -> str:
    return ",".join(sorted({*JOB_ENVIRONMENT, *passthrough}))


def build_spec(cfg: DictConfig, opts: DictConfig, run_dir: str, code_dir: str | None = None) -> SbatchSpec:
    res = job_resources(cfg, opts)
    fault_enabled = bool(OmegaConf.select(cfg, "fault.enabled", default=False))
    sig = stop_signal(opts.signal) if fault_enabled else None
    cluster = OmegaConf.select(cfg, str(opts.cluster_key), default=None) or {}
    name = str(OmegaConf.select(cfg, "experiment", default=None) or cfg.hydra.job.name)
    rd = RunDir(run_dir)
    container = OmegaConf.select(cfg, "container", default=None)
    # the variables the job's object-store clients read (credentials, endpoint, region, session
    # token, profile) reach the ranks by name whenever its data or checkpoints use a store
    passthrough = sorted(
        {*(cluster.get("env_passthrough") or []), *(opts.env_passthrough or []), *stores.client_variables(cfg)}
    )
    if container is not None and container.name != "none":
        passthrough = sorted({*passthrough, *(container.env_passthrough or [])})
    flags: dict[str, Any] = {
        "job_name": f"hpc_llm-{name}",
        "nodes": res.alloc_nodes,
        "ntasks_per_node": res.tasks_per_node,
        "cpus_per_task": res.cpus_per_task,
        "time": slurm_time(res.time_s),
        "output": str(rd.batch_log_pattern),
        "open_mode": "append",
        # B: only the batch step (the supervisor) gets it; it forwards it to the ranks
        "signal": f"B:{sig}@{int(opts.signal_lead_s)}" if sig else None,
        "requeue": True,
        "partition": opts.partition or cluster.get("partition"),
        "account": opts.account or cluster.get("account"),
        "qos": opts.qos or cluster.get("qos"),
        "mem": res.mem_per_node,
        "exclusive": bool(opts.exclusive if opts.exclusive is not None else cluster.get("exclusive", False)),
        "export": export_list(passthrough),
    }
    if res.no_kill:
        # a dead node leaves the job instead of ending it: a spare takes its place, or the run goes
        # on with fewer nodes (docs/design/control-plane.md, "Spare nodes")
        flags["no_kill"] = True
    if res.gpus_flag is not None:
        flags["gpus_per_node"] = res.gpus_flag
    for key, value in sorted((cluster.get("sbatch") or {}).items()):
        flags[str(key)] = value
    for key, value in sorted((opts.extra_sbatch or {}).items()):
        flags[str(key)] = value
    env = {str(k): str(v) for k, v in (cluster.get("env") or {}).items()}
    env["SUBMITIT_EXECUTOR"] = "slurm"
    if sig:
        # the ranks save and stop on this signal (hpc_llm.job.rank.preemption)
        env["HPC_LLM_STOP_SIGNAL"] = sig
    env.setdefault("OMP_NUM_THREADS", str(res.cpus_per_task))
    srun_args = [
        "--unbuffered",
        # sbatch --export=<list> sets SLURM_EXPORT_ENV, which srun takes as its own --export:
        # without this the agents would lose what the batch script exported (MASTER_ADDR, ...)
        "--export=ALL",
        # one agent per node, with every CPU the node's ranks have: the agent forks them
        f"--nodes={res.alloc_nodes}",
        f"--ntasks={res.alloc_nodes}",
        "--ntasks-per-node=1",
        # with spares, a dead node must not end the agent step on every node (Slurm kills a step
        # with a task on a dead node everywhere unless it has --no-kill)
        *(["--no-kill"] if res.no_kill else []),
        f"--cpus-per-task={res.cpus_per_task * res.tasks_per_node}",
        # an agent that ends (its node died) must not take the others with it: the supervisor decides
        "--kill-on-bad-exit=0",
        f"--output={RunDir(run_dir).agent_log('%t')}",
        "--open-mode=append",
        *[str(a) for a in opts.srun_args or []],
    ]
    # each node's agent (hpc_llm.job.agent): warm once, then it forks the node's ranks of every
    # generation, which write logs/rank<N>.log themselves
    entry = ["-u", "-m", "hpc_llm.job.agent", str(rd.payload)]
    container_lines: list[str] = []
    if container is not None and container.name != "none":
        # an hpc_llm app: its container runtime plugin wraps the task command
        from hpc_llm.config.validate import components

        job = components(cfg, run_dir)
        mounts = job.mounts(cfg)
        command = job.container.wrap(container, mounts, [str(container.python), *entry])
        container_lines = job.container.script_lines(container, mounts, passthrough)
    else:
        command = [*python_command(opts, cfg), *entry]
    return SbatchSpec(
        run_dir=run_dir,
        cluster=str(cluster.get("name", "default")),
        template=str(opts.template or cluster.get("template") or DEFAULT_TEMPLATE),
        flags=flags,
        srun_args=srun_args,
        command=command,
        env=env,
        passthrough=passthrough,
        setup=[*(cluster.get("setup") or []), *(opts.setup or [])],
        container_lines=container_lines,
        supervisor=supervisor_command(cfg, opts, run_dir, res, sig),
        stop_signal=sig,
        code_dir=code_dir,
    )
