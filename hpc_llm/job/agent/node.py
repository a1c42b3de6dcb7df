"""What an agent needs of its node: its board file, a free rendezvous port, its own log, the
environment of the ranks it forks. Stdlib only."""

from __future__ import annotations

import random
import tempfile
from pathlib import Path

from hpc_llm import world
from hpc_llm.config.ports import PORT_BASE, PORT_SPAN
from hpc_llm.job import heartbeat, messages, wire
from hpc_llm.job.env import JobEnv
from hpc_llm.rundir.layout import RunDir


def board_file() -> Path:
    """This agent's board file: in /dev/shm (memory, and per job where Slurm's job_container
    gives each job its own), else the temp dir; named by the agent's pid."""
    base = world.shm_dir() or Path(tempfile.gettempdir())
    return base / f"{heartbeat.BOARD_PREFIX}{world.pid()}"


def rank_env(msg: messages.Start, rank: int, local_rank: int) -> dict[str, str]:
    """What torch.distributed wants of rank ``rank`` of the generation ``msg`` starts: RANK,
    LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, NODE_RANK and the rendezvous. A forked rank is no
    srun task: it gets torch's own variables, and srun's task variables (the agent's own task,
    :data:`hpc_llm.job.env.SRUN_TASK_VARS`) are taken out of its environment by the forker, so
    JobEnv and DistEnv read these."""
    per_node = msg.tasks_per_node
    return {
        "RANK": str(rank),
        "LOCAL_RANK": str(local_rank),
        "WORLD_SIZE": str(per_node * msg.nnodes),
        "LOCAL_WORLD_SIZE": str(per_node),
        "NODE_RANK": str(msg.node_rank),
        "MASTER_ADDR": msg.master_addr,
        "MASTER_PORT": str(msg.master_port),
    }


def free_port() -> int:
    """A port free on this node now, for the generation's rendezvous (torch's TCPStore binds it),
    outside the kernel's ephemeral range.

    A port from ``bind(0)`` is an ephemeral one: any outgoing connection on the node may take it
    as its source port before rank 0's store binds it, and a rank on the same host that retries
    its connection to it before the store listens can be handed it as its own source port and
    connect to itself (TCP self-connect: connect() succeeds, no store answers). Seen under load
    on the dev cluster, where every node is one host: a generation stuck in start-up with both
    ranks in "build", and "Gloo connectFullMesh failed". The ports of the srun path
    (``hpc_llm.config.ports``, below 32768) are used instead, from a random start
    (two jobs on one node), the first that binds."""
    lo, hi = wire.ephemeral_ports()
    start = random.randrange(PORT_SPAN)
    for i in range(PORT_SPAN):
        port = PORT_BASE + (start + i) % PORT_SPAN
        if lo <= port <= hi:
            continue
        if world.bindable(port):
            return port
    s = world.listener("", 1)  # every one taken: any free port
    try:
        return int(s.getsockname()[1])
    finally:
        s.close()


def own_output(payload_path: Path) -> None:
    """This agent's stdout and stderr straight into its log file, and stdin from /dev/null: not
    through srun. srun writes a step's ``--output`` files itself, so once it dies with the batch
    host, what an agent writes through it reaches no file, and those are the lines that say what
    the orphaned agents did. The file is this attempt's own (a stale agent of an earlier attempt,
    on a host cut off and healed, never writes into the file of the one after it); srun's
    ``--output`` file keeps what came before this call."""
    job = JobEnv.current()
    world.redirect_output(RunDir.of_payload(payload_path).agent_log(job.rank, job.restart))
