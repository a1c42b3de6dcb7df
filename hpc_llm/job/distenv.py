"""torch.distributed environment of one rank, derived from what Slurm sets.

``srun`` gives every task SLURM_PROCID / SLURM_LOCALID / SLURM_NODEID /
SLURM_NTASKS / SLURM_STEP_TASKS_PER_NODE; Composer wants RANK / LOCAL_RANK /
WORLD_SIZE / LOCAL_WORLD_SIZE / NODE_RANK / MASTER_ADDR / MASTER_PORT.
MASTER_ADDR and MASTER_PORT are resolved on the host, from the allocation,
by the batch script (or the local launcher) and passed in, since ``scontrol``
may not exist inside a container. The local launcher sets the same SLURM_*
variables, so both paths run this code.

No torch import: this runs before the training stack is loaded.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from hpc_llm.plan import PORT_BASE, PORT_SPAN


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
    """A port every task of a job agrees on without talking, from the job id (hpc_llm.plan)."""
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
