"""What a failed generation left behind, and whether the user or the machine is to blame.

Every rank that dies of an exception writes
``<run dir>/.hpc_llm/failures/<job>.<restart>.<generation>.<rank>.json`` (type, one-line
message, the batch it had finished, node) before it exits (:func:`report`, called by
:mod:`hpc_llm.job.rank.entry`). A rank killed by a signal writes nothing; its agent reports its
exit status instead (:class:`RankExit`, from the agents' ``exit`` messages). The agent step's
srun names the nodes Slurm found failed on stderr (:func:`failed_nodes`). The supervisor reads
all three; the fault policy (:func:`hpc_llm.job.supervisor.policy.decide`) says whose fault the
generation's end was. Stdlib only.
"""

from __future__ import annotations

import json
import re
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path

from hpc_llm import world
from hpc_llm.job.env import JobEnv
from hpc_llm.rundir.layout import RunDir
from hpc_llm.rundir.record import write_json

#: exception text that means the machine (GPU, driver, network, a peer), not the code
INFRA_PATTERNS = re.compile(
    "|".join(
        (
            r"NCCL",
            r"CUDA error",
            r"cudaError",
            r"CUBLAS_STATUS",
            r"CUDNN_STATUS",
            r"uncorrectable ECC",
            r"Xid",
            r"DistBackendError",
            r"DistNetworkError",
            r"DistStoreError",
            r"Connection closed by peer",
            r"Connection reset by peer",
            r"Connection refused",
            r"Broken pipe",
            r"Timed out",
            r"timed out",
            r"Socket Timeout",
            r"ProcessGroupGloo",
            # gloo's own words for its transport (torch raises them as RuntimeError): a mesh that
            # could not be built ("connectFullMesh failed ... Connect timeout"), a peer's socket
            r"connectFullMesh",
            r"gloo/transport",
            r"ProcessGroupNCCL",
            r"Watchdog caught collective operation timeout",
            r"Stale file handle",
            r"Input/output error",
        )
    )
)


@dataclass(frozen=True)
class RankFailure:
    rank: int
    node: str
    type: str
    message: str
    #: the last batch this rank finished (-1: none in this process)
    batch: int
    time: float
    traceback: str = ""

    @property
    def infrastructure(self) -> bool:
        return bool(INFRA_PATTERNS.search(f"{self.type}: {self.message}"))

    @property
    def signature(self) -> tuple[str, str, int]:
        """What makes two failures "the same exception at the same batch"."""
        return (self.type, self.message, self.batch)


def report(run_dir: Path | str, exc: BaseException, *, rank: int, node: str, batch: int) -> Path:
    """Write this rank's failure (called as the exception leaves the task function)."""
    rd = RunDir(run_dir)
    rd.failure_reports.mkdir(parents=True, exist_ok=True)
    message = " ".join(str(exc).split())[:2000]
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)[-6:])[-4000:]
    failure = RankFailure(rank, node, type(exc).__name__, message, batch, world.time(), tb)
    return write_json(rd.failure_report(JobEnv.current().generation_tag, rank), asdict(failure))


def read(run_dir: Path | str, tag: str) -> list[RankFailure]:
    """Every rank's failure of one generation (``tag``: :attr:`JobEnv.generation_tag`), earliest first."""
    rd = RunDir(run_dir)
    out = []
    for path in (
        sorted(rd.failure_reports.glob(rd.failure_report(tag, "*").name)) if rd.failure_reports.is_dir() else []
    ):
        try:
            out.append(RankFailure(**json.loads(path.read_text())))
        except (OSError, ValueError, TypeError):
            continue
    return sorted(out, key=lambda f: (f.time, f.rank))


def read_all(run_dir: Path | str) -> list[RankFailure]:
    return read(run_dir, "*")


@dataclass(frozen=True)
class RankExit:
    """How one rank of a generation ended, as its agent reported it (or lost with its node)."""

    rank: int
    node: str
    #: os.waitstatus_to_exitcode: the exit code, or minus the signal; None: lost with its node
    status: int | None
    #: what the status means, in words ("exited with 1", "killed by SIGKILL", "lost with the node")
    what: str
    #: ended by the supervisor (the agents killed the generation), not of its own
    killed: bool = False
    #: when the supervisor learnt of it (epoch seconds)
    at: float = 0.0

    @property
    def by_signal(self) -> bool:
        """Killed by a signal (the OOM killer, a GPU off the bus) or lost with its node: no
        exception, so no report of its own."""
        return self.status is None or self.status < 0

    def __str__(self) -> str:
        return f"rank {self.rank} on {self.node}: {self.what}"


#: srun's line for a node Slurm found failed (the same on 22.05 and 24.11,
#: tests/fixtures/slurm/*/srun_errors.txt)
_SRUN_NODE_FAIL = re.compile(r"(?:Node failure on|node failure on|NODE_FAIL.*on) (?P<node>[\w\-\[\],.]+)")


#: srun could not start a task on a node (its slurmd unreachable from the batch host)
_SRUN_LAUNCH_FAILED = re.compile(r"Task launch for \S+ failed on node (?P<nodes>[\w.,\[\]-]+)")


def launch_failed(lines: list[str]) -> list[str]:
    """The nodes the agent step's srun could not start its task on (``srun: error: Task launch for
    StepId=J.S failed on node n2: Communication connection failure``)."""
    return [n for line in lines if (m := _SRUN_LAUNCH_FAILED.search(line)) for n in m["nodes"].split(",") if n]


def failed_nodes(lines: list[str]) -> list[str]:
    """The nodes the agent step's srun reported failed, from its stderr lines (its one task per
    node is an agent, not a rank: how the ranks ended comes from the agents)."""
    return [m["node"] for line in lines if (m := _SRUN_NODE_FAIL.search(line))]
