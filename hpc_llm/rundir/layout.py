"""Every path of a run directory, in one object (after submitit's ``JobPaths``).

A run directory is where the login side and the job meet: the launcher
writes the payload and the batch script into it, the job writes its logs,
heartbeats, checkpoints and record into it, and ``status`` / ``report`` read
them back. No other module joins these names by hand (tests/test_layout.py
fails on a run-directory name literal anywhere else).

::

    <run dir>/
      results.json            the run's record (hpc_llm.rundir.record)
      train_config.yaml       the LLM Foundry train config the job ran
      sbatch.sh               the batch script (Slurm launcher)
      logs/rank<N>.log        one log per rank
      logs/agent<N>.log       the agent of the allocation's N-th node
      logs/slurm-<job>.<n>.out  each attempt's batch log (the supervisor's; n: Slurm's restart count)
      logs/slurm-<job>.out    Slurm's own batch output (slurmstepd's messages)
      logs/agent<i>.<n>.log   each attempt's log of the agent on the i-th node
      checkpoints/            the default local checkpoint folder
      checkpoints/unfinished/ saves a dead attempt did not finish
      .hydra/                 Hydra's own files
      .submitit/              submitit's pickles
      .hpc_llm/               hpc_llm's private files:
        job.pkl, return.pkl   the payload the ranks run, and rank 0's return value
        attempts.json         every start of the run and how it ended
        progress.json         the live batch counter
        trained.json          what the run has trained so far (loss history, tokens/s, MFU)
        provenance.json, git.diff
        heartbeat/ failures/  the ranks' beats (one file per node) and failure reports
        code/, array/         the code snapshot and array logs (a sweep dir's)

Stdlib only: the job's supervisor and the login side both use it.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

#: hpc_llm's private folder inside a run dir (and a sweep dir)
PRIVATE = ".hpc_llm"
RESULTS = "results.json"


@dataclass(frozen=True)
class RunDir:
    """The layout of one run directory (or a sweep directory, for the sweep-level paths)."""

    root: Path

    def __init__(self, root: str | os.PathLike[str]) -> None:
        object.__setattr__(self, "root", Path(root))

    def __fspath__(self) -> str:
        return str(self.root)

    # -- what a person reads -------------------------------------------------
    @property
    def results(self) -> Path:
        return self.root / RESULTS

    @property
    def train_config(self) -> Path:
        return self.root / "train_config.yaml"

    @property
    def sbatch_script(self) -> Path:
        return self.root / "sbatch.sh"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    def rank_log(self, rank: int | str) -> Path:
        return self.logs / f"rank{rank}.log"

    def agent_log(self, node_index: int | str, restart: int | str | None = None) -> Path:
        """The log of the agent on the allocation's ``node_index``-th node (srun's ``%t``):
        srun's own ``--output`` without ``restart``, else the agent's own file for that attempt
        (its output from its start on: hpc_llm.job.agent.node.own_output)."""
        if restart is None:
            return self.logs / f"agent{node_index}.log"
        return self.logs / f"agent{node_index}.{restart}.log"

    def batch_log(self, job_id: str) -> Path:
        """Slurm's own batch output file (``--output``): what slurmstepd writes of the job (a
        requeue's, a cancel's, an OOM's message) and nothing of the script, which writes its
        attempt's file (:meth:`attempt_log`). An array task's id is ``<array>_<task>``."""
        return self.logs / f"slurm-{job_id}.out"

    def attempt_log(self, job_id: str, restart: int | str) -> Path:
        """One attempt's batch log (the supervisor's): ``restart`` is SLURM_RESTART_COUNT. One file
        per attempt, not Slurm's one per job id: a stale attempt on a host cut off and healed
        writes into its own, never into the one the next attempt uses."""
        return self.logs / f"slurm-{job_id}.{restart}.out"

    def takeover_log(self, job_id: str, restart: int | str, node: str) -> Path:
        """The log of a supervisor an agent on ``node`` started in place of a lost one, in the
        same attempt (hpc_llm.job.agent.takeover)."""
        return self.logs / f"slurm-{job_id}.{restart}.{node}.out"

    def attempt_logs(self, job_id: str) -> list[Path]:
        """The job's attempt logs that exist, first attempt first (in an attempt, the batch
        host's supervisor before any that took its place)."""

        def order(p: Path) -> tuple[int, str]:
            restart, _, node = p.name.removeprefix(f"slurm-{job_id}.").removesuffix(".out").partition(".")
            return (int(restart) if restart.isdigit() else -1, node)

        return sorted(self.logs.glob(f"slurm-{job_id}.*.out"), key=order)

    @property
    def batch_log_pattern(self) -> Path:
        """sbatch's ``--output`` for one job (``%j``: the job id)."""
        return self.logs / "slurm-%j.out"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    def run_name(self, experiment: str) -> str:
        """The run's name, the same on every attempt: Composer's autoresume keys on it, and a
        checkpoint folder in an object store is named after it (``<location>/<run name>``)."""
        return f"{experiment}-{self.root.parent.name}-{self.root.name}"

    @property
    def hydra(self) -> Path:
        return self.root / ".hydra"

    @property
    def submitit(self) -> Path:
        return self.root / ".submitit"

    # -- hpc_llm's private files ---------------------------------------------
    @property
    def private(self) -> Path:
        return self.root / PRIVATE

    @property
    def epochs(self) -> Path:
        """Who holds the job: one file per command claimed, written by its holder only
        (hpc_llm.rundir.epoch)."""
        return self.private / "epoch"

    @property
    def payload(self) -> Path:
        return self.private / "job.pkl"

    @property
    def return_value(self) -> Path:
        return self.private / "return.pkl"

    @property
    def attempts(self) -> Path:
        return self.private / "attempts.json"

    @property
    def progress(self) -> Path:
        return self.private / "progress.json"

    @property
    def trained(self) -> Path:
        """What the run has trained so far: its kept loss history, tokens/s and MFU, written by
        rank 0 at every checkpoint, as training ends and at every close (hpc_llm.rundir.record)."""
        return self.private / "trained.json"

    @property
    def provenance(self) -> Path:
        return self.private / "provenance.json"

    @property
    def supervisor_lost(self) -> Path:
        """What an agent saw when it requeued a job whose supervisor (batch host) was gone."""
        return self.private / "supervisor_lost.json"

    @property
    def spares(self) -> Path:
        """The spare nodes' account, the supervisor its only writer (hpc_llm.job.supervisor.spares)."""
        return self.private / "spares.json"

    def takeover_claim(self, job_id: str, restart: int, node: str) -> Path:
        """Created (O_EXCL) by the one agent that takes the place of the supervisor lost with
        ``node`` in this allocation (hpc_llm.job.agent.takeover): the others, and that supervisor
        if it comes back, find it and stand aside."""
        return self.private / f"takeover-{job_id}.{restart}.{node}"

    @property
    def git_diff(self) -> Path:
        return self.private / "git.diff"

    @property
    def heartbeats(self) -> Path:
        return self.private / "heartbeat"

    def heartbeat_of_node(self, node: str) -> Path:
        """One file per node, a fixed-size slot per rank on it (hpc_llm.job.heartbeat)."""
        return self.heartbeats / node

    @property
    def failure_reports(self) -> Path:
        return self.private / "failures"

    def failure_report(self, generation_tag: str, rank: int | str) -> Path:
        """A rank's failure report; ``rank="*"`` (and a ``generation_tag`` of ``"*"``) glob."""
        return self.failure_reports / f"{generation_tag}.{rank}.json"

    # -- a sweep directory's ----------------------------------------------
    @property
    def code_snapshot(self) -> Path:
        return self.private / "code"

    @property
    def array_logs(self) -> Path:
        return self.private / "array"

    @classmethod
    def of_payload(cls, payload: str | os.PathLike[str]) -> RunDir:
        """The run dir a payload file lies in."""
        return cls(Path(payload).parent.parent)


def job_scratch(base: str | None, job_id: str | None, run_dir: str | os.PathLike[str]) -> Path:
    """A job's node-local scratch: ``<base, else $TMPDIR, else /tmp>/hpc_llm-<job id>`` (a run off
    Slurm: a hash of its run dir). Each node's ranks work in ``node<node rank>`` inside it
    (docs/upstream-fixes.md, upstream fix 1); the node's agent, or the local launcher, removes it."""
    root = base or os.environ.get("TMPDIR") or tempfile.gettempdir()
    name = job_id or hashlib.sha1(str(run_dir).encode()).hexdigest()[:10]
    return Path(root) / f"hpc_llm-{name}"


# -- inside a checkpoint folder (the run dir's checkpoints/, or one in an object store) -----------

#: what Composer names a checkpoint by (save_filename ``ep{epoch}-ba{batch}-rank{rank}.pt``,
#: a sharded checkpoint's folder ``ep{epoch}-ba{batch}``)
CHECKPOINT_NAME = re.compile(r"^ep(\d+)-ba(\d+)(?:-rank\d+\.pt)?$")
#: Composer's link to the latest checkpoint (in an object store: this name + ``.symlink``, an
#: object holding the save's key)
LATEST = "latest-rank0.pt"
LATEST_SHARDED = "latest-sharded-rank0"
#: where saves a dead attempt did not finish are set aside
UNFINISHED = "unfinished"


def unfinished_checkpoints(folder: str | os.PathLike[str]) -> Path:
    """Where saves a dead attempt did not finish are set aside, inside a checkpoint folder."""
    return Path(folder) / UNFINISHED
