"""Who this process is inside the job: read in one place from Slurm's, torch's and hpc_llm's variables.

:class:`JobEnv` (after submitit's ``JobEnvironment``) is the one reader of the
``SLURM_*`` job variables and of the variables the job's supervisor sets for
the ranks of a step it runs; no other module reads them (tests/test_layout.py).
:class:`DistEnv` is what torch.distributed wants, derived from it:

``srun`` gives every task SLURM_PROCID / SLURM_LOCALID / SLURM_NODEID /
SLURM_NTASKS / SLURM_STEP_TASKS_PER_NODE; Composer wants RANK / LOCAL_RANK /
WORLD_SIZE / LOCAL_WORLD_SIZE / NODE_RANK / MASTER_ADDR / MASTER_PORT. A rank
a node's agent forks gets torch's variables only (:data:`SRUN_TASK_VARS`).
MASTER_ADDR and MASTER_PORT are resolved on the host, from the allocation,
by the batch script (or the local launcher) and passed in, since ``scontrol``
may not exist inside a container. The local launcher sets the same SLURM_*
variables, so both paths run this code.

No torch import: this runs before the training stack is loaded, and in the
supervisor on the batch host.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from hpc_llm import world
from hpc_llm.config.ports import PORT_BASE, PORT_SPAN

# What the job's supervisor tells the ranks of a step it runs.
#: set for every rank of a supervised step: a stop is recorded, and the supervisor acts on it
SUPERVISED = "HPC_LLM_SUPERVISED"
#: the generation of ranks inside the allocation (0, then 1 after a restart in place, ...)
GENERATION = "HPC_LLM_GENERATION"
#: the allocation's nodes, comma-separated
NODES = "HPC_LLM_NODES"
#: when Slurm started the allocation (epoch seconds)
ALLOC_START = "HPC_LLM_ALLOC_START"
#: seconds between a rank's heartbeats
HEARTBEAT_S = "HPC_LLM_HEARTBEAT_S"
#: when the node's agent forked the ranks of this generation (epoch seconds)
FORKED_AT = "HPC_LLM_FORKED_AT"
#: the run's epoch this generation belongs to, "<restart>.<takeover>.<generation>"
#: (hpc_llm.rundir.epoch.EPOCH_ENV), and the run directory where it is kept
EPOCH = "HPC_LLM_EPOCH"
RUN_DIR = "HPC_LLM_RUN_DIR"
#: what srun tells the one task it starts of a step: the agent's own place in the agent step. A
#: rank the agent forks is no srun task: these are taken out of its environment and it gets
#: torch's own variables instead (RANK, LOCAL_RANK, WORLD_SIZE, ...: agent.node.rank_env), which
#: JobEnv and DistEnv read where these are absent
SRUN_TASK_VARS = (
    "SLURM_PROCID",
    "SLURM_LOCALID",
    "SLURM_NODEID",
    "SLURM_GTIDS",
    "SLURM_TASK_PID",
    "SLURM_NTASKS",
    "SLURM_NPROCS",
    "SLURM_NNODES",
    "SLURM_TASKS_PER_NODE",
    "SLURM_STEP_ID",
    "SLURM_STEPID",
    "SLURM_STEP_NODELIST",
    "SLURM_STEP_NUM_NODES",
    "SLURM_STEP_NUM_TASKS",
    "SLURM_STEP_TASKS_PER_NODE",
)


def container_image() -> str | None:
    """The image this process runs in; None outside one. Apptainer (or Singularity) says so in
    its own variables. enroot sets none inside the container, so under pyxis it is the step's
    ``PYXIS_CONTAINER_IMAGE`` (the batch script exports it, and pyxis, loaded by slurmstepd, runs
    every srun step of the job in that image: ``hpc_llm/builtin/container_runtimes.py``); the
    batch step itself runs on the host, so it counts only in a process of an srun step."""
    env = world.environ()
    found = env.get("APPTAINER_CONTAINER") or env.get("SINGULARITY_CONTAINER")
    if not found and env.get("SLURM_STEP_ID", "batch") not in ("batch", "extern", ""):
        found = env.get("PYXIS_CONTAINER_IMAGE")
    return found or None


def _int(value: str | None, default: int = 0) -> int:
    return int(value) if value not in (None, "") else default


@dataclass(frozen=True)
class JobEnv:
    """This process's place in the job; every field has a value off Slurm too (a local run)."""

    job_id: str | None = None
    array_job_id: str | None = None
    array_task_id: str | None = None
    #: Slurm's restart count: 0, then 1 after the first requeue, ...
    restart: int = 0
    #: the generation of ranks this process belongs to, inside the allocation
    generation: int = 0
    #: global rank (SLURM_PROCID, else RANK), 0 in the batch step
    rank: int = 0
    #: rank on this node (SLURM_LOCALID, else LOCAL_RANK): its slot in the node's heartbeat file
    local_rank: int = 0
    #: ranks of the job (SLURM_NTASKS, else WORLD_SIZE)
    ntasks: int = 1
    #: this node's index in the allocation (SLURM_NODEID)
    node_id: int = 0
    #: the allocation's node list as Slurm writes it (``n[1-2]``)
    nodelist: str | None = None
    #: the allocation's nodes, as the supervisor expanded them
    nodes: tuple[str, ...] = field(default_factory=tuple)
    #: when the allocation started (epoch seconds; from the supervisor)
    alloc_start: float | None = None
    supervised: bool = False
    #: seconds between heartbeats; None: no heartbeat (no supervisor, or recovery off)
    heartbeat_s: float | None = None
    #: when the node's agent forked this rank (epoch seconds; None: not forked by an agent)
    forked_at: float | None = None
    #: the run's epoch of this process's generation ("r.t.g"; None: not told one) and the run dir
    epoch: str | None = None
    run_dir: str | None = None
    environ: Mapping[str, str] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def current(cls, env: Mapping[str, str] | None = None) -> JobEnv:
        e = world.environ() if env is None else env
        alloc, beat, forked = e.get(ALLOC_START), e.get(HEARTBEAT_S), e.get(FORKED_AT)
        return cls(
            job_id=e.get("SLURM_JOB_ID") or None,
            array_job_id=e.get("SLURM_ARRAY_JOB_ID") or None,
            array_task_id=e.get("SLURM_ARRAY_TASK_ID") or None,
            restart=_int(e.get("SLURM_RESTART_COUNT")),
            generation=_int(e.get(GENERATION)),
            rank=_int(e.get("SLURM_PROCID", e.get("RANK"))),
            local_rank=_int(e.get("SLURM_LOCALID", e.get("LOCAL_RANK"))),
            ntasks=_int(e.get("SLURM_NTASKS", e.get("WORLD_SIZE")), 1),
            node_id=_int(e.get("SLURM_NODEID")),
            nodelist=e.get("SLURM_JOB_NODELIST") or None,
            nodes=tuple(n for n in e.get(NODES, "").split(",") if n),
            alloc_start=float(alloc) if alloc else None,
            supervised=bool(e.get(SUPERVISED)),
            heartbeat_s=float(beat) if beat else None,
            forked_at=float(forked) if forked else None,
            epoch=e.get(EPOCH) or None,
            run_dir=e.get(RUN_DIR) or None,
            environ=e,
        )

    @property
    def on_slurm(self) -> bool:
        return self.job_id is not None

    @property
    def ref(self) -> str | None:
        """What ``scontrol requeue``/``update`` take: ``<array job>_<task>`` for an array task."""
        if self.array_job_id and self.array_task_id:
            return f"{self.array_job_id}_{self.array_task_id}"
        return self.job_id

    @property
    def generation_tag(self) -> str:
        """``<job>.<restart>.<generation>``: which generation of ranks a file belongs to."""
        return f"{self.job_id or 'local'}.{self.restart}.{self.generation}"

    @property
    def is_rank0(self) -> bool:
        return self.rank == 0

    def dist(self) -> DistEnv:
        """What torch.distributed wants, from the same variables."""
        return from_environ(self.environ)

    def for_generation(
        self,
        generation: int,
        nodes: list[str],
        alloc_start: float | None,
        heartbeat_s: float | None,
        epoch: str | None = None,
        run_dir: str | None = None,
    ) -> dict[str, str]:
        """The environment of a supervised generation's ranks: this one plus what the supervisor tells them."""
        env = dict(self.environ)
        env[SUPERVISED] = "1"
        env[GENERATION] = str(generation)
        if epoch is not None:
            env[EPOCH] = epoch
        if run_dir is not None:
            env[RUN_DIR] = run_dir
        env[NODES] = ",".join(nodes)
        if alloc_start is not None:
            env[ALLOC_START] = str(alloc_start)
        if heartbeat_s is not None:
            env[HEARTBEAT_S] = str(heartbeat_s)
        return env


@dataclass(frozen=True)
class DistEnv:
    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    node_rank: int
    num_nodes: int
    master_addr: str
    master_port: int

    def as_environ(self) -> dict[str, str]:
        return {
            "RANK": str(self.rank),
            "LOCAL_RANK": str(self.local_rank),
            "WORLD_SIZE": str(self.world_size),
            "LOCAL_WORLD_SIZE": str(self.local_world_size),
            "NODE_RANK": str(self.node_rank),
            "MASTER_ADDR": self.master_addr,
            "MASTER_PORT": str(self.master_port),
        }


_TASKS_ITEM = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")


def expand_tasks_per_node(spec: str) -> list[int]:
    """Expand Slurm's compressed task counts: ``"2(x3),1"`` -> ``[2, 2, 2, 1]``."""
    counts: list[int] = []
    for item in spec.split(","):
        m = _TASKS_ITEM.match(item.strip())
        if not m:
            raise ValueError(f"unparsable Slurm tasks-per-node value {spec!r}")
        counts.extend([int(m.group(1))] * int(m.group(2) or 1))
    return counts


def default_port(job_id: str | None) -> int:
    """A port every task of a job agrees on without talking, from the job id (hpc_llm.config.plan)."""
    digits = re.sub(r"\D", "", job_id or "")
    return PORT_BASE + (int(digits) % PORT_SPAN if digits else 0)


def from_environ(env: Mapping[str, str]) -> DistEnv:
    """The rank's DistEnv from SLURM_* (preferred) or already-set torch variables."""
    if "SLURM_PROCID" in env:
        node_rank = int(env.get("SLURM_NODEID", "0"))
        per_node_spec = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE")
        world = int(env.get("SLURM_STEP_NUM_TASKS") or env.get("SLURM_NTASKS") or 1)
        if per_node_spec:
            per_node = expand_tasks_per_node(per_node_spec)
            local_world = per_node[node_rank]
            num_nodes = len(per_node)
        else:
            local_world, num_nodes = world, 1
        rank = int(env["SLURM_PROCID"])
        local_rank = int(env.get("SLURM_LOCALID", "0"))
    elif "RANK" in env:
        rank = int(env["RANK"])
        world = int(env.get("WORLD_SIZE", "1"))
        local_rank = int(env.get("LOCAL_RANK", "0"))
        local_world = int(env.get("LOCAL_WORLD_SIZE", str(world)))
        node_rank = int(env.get("NODE_RANK", "0"))
        num_nodes = max(1, world // max(local_world, 1))
    else:
        rank, world, local_rank, local_world, node_rank, num_nodes = 0, 1, 0, 1, 0, 1
    addr = env.get("MASTER_ADDR")
    if not addr:
        if world > 1:
            raise RuntimeError(
                "MASTER_ADDR is not set for a multi-rank job; the batch script or "
                "launcher must export it (resolved from the allocation's first node)"
            )
        addr = "127.0.0.1"
    port = int(env.get("MASTER_PORT") or default_port(env.get("SLURM_JOB_ID")))
    return DistEnv(rank, local_rank, world, local_world, node_rank, num_nodes, addr, port)
