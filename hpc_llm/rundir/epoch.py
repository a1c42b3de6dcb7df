"""The run's epoch: the one token that says who may act for the job now, checked before every act.

A job's processes outlive their right to act: a batch host cut off or frozen comes back after an
agent has taken its place, a healed host's srun still holds the step its successor runs in, a
rank of an ended generation thaws in the middle of a save. Each used to be fenced by a different
signal (the board's generation and lease, Slurm's restart count, a takeover claim file, a
question to slurmctld at decision time), and the seams between them lost runs (issue #50). Now one
token names the holder:

* **the epoch** is (Slurm's restart count, the takeover count, the generation): the allocation,
  how many times command of it has changed hands (an agent took the supervisor's place, a
  supervisor resumed command after standing down, an agent requeued in its place), and the
  generation of ranks its holder started last. Epochs are ordered; the greatest is current.
* **where every process reads it**: the run's private directory, on the filesystem every node
  shares. Command of an allocation is one file, ``.hpc_llm/epoch/<job>.<restart>.<takeover>``,
  created with ``O_EXCL`` by the one process that takes it: the creation *is* the claim, so two
  agents racing to take over make one file and one holder. The file holds the generation, which
  only its holder rewrites (when it starts one). The current epoch is the greatest file and what
  it holds.
* **advanced only by the holder**: the supervisor of a new allocation claims (restart, 0); a
  takeover claims (restart, takeover + 1) and passes the claim to the supervisor it starts; the
  holder advances the generation before it starts one, and tells the ranks theirs
  (:data:`EPOCH_ENV`).
* **checked by one function**, :func:`check` (or :meth:`Holder.acting` for a change to Slurm),
  before every Slurm mutation and every write of the run's records, in the supervisor, the agents,
  an orphaned agent and the ranks alike: a process whose epoch is not the current one is
  refused (:class:`Stale`), says why, and does nothing more. A rank's check is also its
  generation's lease on its node's board (:mod:`hpc_llm.job.rank.fence`): a rank frozen past it
  may not write even before a newer epoch exists. A change to Slurm also asks Slurm: a job Slurm
  itself requeued (its restart count higher) or ended belongs to nobody in this allocation.

:mod:`hpc_llm.slurm.commands` runs no mutating command outside :meth:`Holder.acting` (or
:func:`as_user`, the login side's own commands), and :mod:`hpc_llm.rundir.record` writes nothing
without :func:`check`: ``tests/test_epoch.py`` lists every call site. Stdlib only: the job's
processes hold epochs; the login side, which holds none, reads the record through the same module.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from hpc_llm import world
from hpc_llm.rundir.layout import RunDir
from hpc_llm.slurm.commands import ACTING

#: the epoch a generation's ranks (and its agents) belong to, "<restart>.<takeover>.<generation>"
#: (hpc_llm.job.env.EPOCH, which JobEnv reads)
EPOCH_ENV = "HPC_LLM_EPOCH"
#: the command a takeover claimed for the supervisor it starts, "<restart>.<takeover>"
CLAIMED_ENV = "HPC_LLM_EPOCH_CLAIMED"
#: where this process's holder is kept (hpc_llm.world.local: one per process, simulated ones too)
_KEY = "epoch"


@dataclass(frozen=True, order=True)
class Epoch:
    restart: int
    takeover: int
    generation: int = 0

    @property
    def command(self) -> tuple[int, int]:
        """The allocation and the hand it is in: what a claim is of."""
        return (self.restart, self.takeover)

    def __str__(self) -> str:
        return f"{self.restart}.{self.takeover}.{self.generation}"

    @classmethod
    def parse(cls, text: str | None) -> Epoch | None:
        try:
            parts = [int(x) for x in (text or "").split(".")]
        except ValueError:
            return None
        if len(parts) == 2:
            parts.append(0)
        return cls(*parts) if len(parts) == 3 else None


class Refused(RuntimeError):
    """The check before an act said no."""

    def __init__(self, what: str, why: str) -> None:
        super().__init__(f"{what} refused: {why}")
        self.what, self.why = what, why


class Stale(Refused):
    """This process does not hold the job's current epoch: it must not act, now or later."""


class Unanswered(Refused):
    """slurmctld did not answer the check of a change to Slurm: whether this process still holds
    the job is not known now (its host may be cut off). Not a verdict: it may act once it knows."""


#: the start of :func:`slurm_refusal`'s answer when slurmctld could not be asked
UNANSWERED = "slurmctld did not answer"


def _dir(run_dir: Path | str) -> Path:
    return RunDir(run_dir).epochs


def _claims(run_dir: Path | str, job_id: str) -> list[tuple[int, int]]:
    """The commands claimed of ``job_id``, as (restart, takeover). Raises OSError when the
    directory cannot be read (the shared filesystem gone: nobody can tell who holds the job)."""
    prefix = f"{job_id}."
    out = []
    try:
        names = os.listdir(_dir(run_dir))
    except FileNotFoundError:
        return []
    for name in names:
        if name.startswith(prefix):
            found = Epoch.parse(name[len(prefix) :])
            if found is not None:
                out.append(found.command)
    return out


def current(run_dir: Path | str, job_id: str) -> Epoch | None:
    """The job's current epoch (None before any claim). Raises OSError as :func:`_claims`."""
    claims = _claims(run_dir, job_id)
    if not claims:
        return None
    restart, takeover = max(claims)
    path = _dir(run_dir) / f"{job_id}.{restart}.{takeover}"
    try:
        generation = int(json.loads(path.read_text()).get("generation", 0))
    except (OSError, ValueError, AttributeError):
        generation = 0  # being written: its generation is the one before, or 0 for a new claim
    return Epoch(restart, takeover, generation)


@dataclass
class Holder:
    """What this process holds of the job: its epoch, and how to tell when it no longer does."""

    #: where the run's epoch is kept, and the job's id (None: a rank with only its lease to check,
    #: one started without an epoch)
    run_dir: Path | None
    job_id: str | None
    epoch: Epoch
    #: who: "supervisor", "agent" or "rank" (a rank's epoch is its generation's, not a command)
    role: str
    #: why it may not write now, or None: a rank's lease on its node's board
    #: (hpc_llm.job.rank.fence); a supervisor's, slurmctld's word on its allocation (its state's
    #: ctld_lease)
    lease: Callable[[], str | None] | None = field(default=None, repr=False)

    def refusal(self, what: str, slurm: bool = False, lease: bool = True) -> str | None:
        """Why this process may not do ``what`` now (None: it may). ``slurm``: it changes Slurm
        (also ask Slurm whether this allocation is still the job's). ``lease``: the holder's lease
        counts too (False: the epoch alone, whoever holds it)."""
        if lease and self.lease is not None:
            why = self.lease()
            if why is not None:
                return why
        if self.run_dir is None or self.job_id is None:
            return None
        try:
            now = current(self.run_dir, self.job_id)
        except OSError as exc:
            return f"the run's epoch cannot be read ({exc}): nobody can tell who holds the job"
        mine = self.epoch
        if now is not None:
            if now.command > mine.command:
                return f"epoch {now} holds the job (this process holds {mine})"
            if self.role == "rank" and now.command == mine.command and now.generation > mine.generation:
                return f"generation {now.generation} runs now (this rank's is {mine.generation})"
            if self.role != "rank" and now.command < mine.command:
                return f"this process's claim {mine} is gone (the current epoch is {now})"
        if slurm:
            return slurm_refusal(self.job_id, mine.restart)
        return None

    def check(self, what: str, slurm: bool = False) -> None:
        why = self.refusal(what, slurm)
        if why is not None:
            raise (Unanswered if why.startswith(UNANSWERED) else Stale)(what, why)

    def advance(self, generation: int) -> None:
        """Start ``generation`` under this command (its holder only): checked, then written."""
        self.check(f"starting generation {generation}")
        self.epoch = Epoch(self.epoch.restart, self.epoch.takeover, generation)
        if self.run_dir is not None and self.job_id is not None:
            _write(self.run_dir, self.job_id, self.epoch, by=None)

    @contextlib.contextmanager
    def acting(self, what: str) -> Iterator[None]:
        """A change to Slurm by this holder: checked first (Slurm asked too); the commands run
        inside are the only mutating ones :mod:`hpc_llm.slurm.commands` lets through."""
        self.check(what, slurm=True)
        local = world.local()
        outer = local.get(ACTING)
        local[ACTING] = what
        try:
            yield
        finally:
            local[ACTING] = outer

    def env(self) -> dict[str, str]:
        """What a generation's processes are told of their epoch."""
        return {EPOCH_ENV: str(self.epoch)}


def slurm_refusal(job_id: str, restart: int, tries: int = 3) -> str | None:
    """Why allocation ``restart`` of ``job_id`` is not Slurm's running one now (None: it is).
    slurmctld not answering (asked ``tries`` times) is a refusal too: not knowing is not a yes."""
    from hpc_llm.slurm import allocation

    info: dict[str, str] = {}
    for i in range(tries):
        info = allocation.show_job(job_id)
        if info:
            break
        if i + 1 < tries:
            world.sleep(2.0 * (i + 1))
    if not info:
        return f"{UNANSWERED}: whether this allocation still holds the job is unknown"
    return slurm_refusal_of(info, restart)


def slurm_refusal_of(info: dict[str, str], restart: int) -> str | None:
    """Why allocation ``restart`` is not the running one of the job ``info`` (``scontrol show
    job``) describes (None: it is)."""
    restarts = int(info.get("Restarts", "0") or 0)
    if restarts > restart:
        return f"Slurm requeued the job (restart {restarts}; this allocation is restart {restart})"
    if info.get("JobState") not in ("RUNNING", "CONFIGURING"):
        return f"the job is {info.get('JobState')}"
    return None


def _write(run_dir: Path, job_id: str, epoch: Epoch, by: str | None) -> None:
    path = _dir(run_dir) / f"{job_id}.{epoch.restart}.{epoch.takeover}"
    data: dict[str, object] = {"generation": epoch.generation, "at": world.time(), "pid": world.pid()}
    if by is None:
        # a new generation under the same command: still its claimant's
        with contextlib.suppress(OSError, ValueError, AttributeError):
            by = json.loads(path.read_text()).get("by")
    if by is not None:
        data["by"] = by
    tmp = path.with_name(f".{path.name}.tmp-{world.pid()}")
    tmp.write_text(json.dumps(data))
    world.replace(tmp, path)


def claim(run_dir: Path | str, job_id: str, restart: int, takeover: int, by: str, generation: int = 0) -> Holder | None:
    """Take command (restart, takeover) of ``job_id``: the holder, or None when another process
    claimed it first (or a later one exists). ``by`` names the claimant (its node) for people."""
    run_dir = Path(run_dir)
    d = _dir(run_dir)
    d.mkdir(parents=True, exist_ok=True)
    try:
        now = current(run_dir, job_id)
    except OSError:
        return None
    if now is not None and now.command >= (restart, takeover):
        return None
    path = d / f"{job_id}.{restart}.{takeover}"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return None
    with os.fdopen(fd, "w") as f:
        json.dump({"generation": generation, "by": by, "at": world.time(), "pid": world.pid()}, f)
    return Holder(run_dir, job_id, Epoch(restart, takeover, generation), "supervisor")


def claimed_by(run_dir: Path | str, job_id: str, restart: int, takeover: int) -> str | None:
    """Who claimed command (restart, takeover) of ``job_id`` (None: nobody yet)."""
    path = _dir(run_dir) / f"{job_id}.{restart}.{takeover}"
    try:
        return str(json.loads(path.read_text()).get("by") or "?")
    except FileNotFoundError:
        return None
    except (OSError, ValueError, AttributeError):
        return "?"


def adopt(run_dir: Path | str, job_id: str, claimed: str, role: str = "supervisor") -> Holder | None:
    """The holder of a command another process of this one's lineage claimed for it (an agent that
    took over claims, then starts the supervisor): None when it is not there, or not current."""
    found = Epoch.parse(claimed)
    if found is None:
        return None
    try:
        now = current(run_dir, job_id)
    except OSError:
        return None
    if now is None or now.command != found.command:
        return None
    return Holder(Path(run_dir), job_id, Epoch(found.restart, found.takeover, now.generation), role)


# -- this process's holder -------------------------------------------------------------------


def install(holder: Holder | None) -> None:
    """``holder`` is what this process holds from now on (None: nothing; not a process of a job)."""
    world.local()[_KEY] = holder


def held() -> Holder | None:
    found: Holder | None = world.local().get(_KEY)
    return found


def refusal(what: str) -> str | None:
    """Why this process may not ``what`` now (None: it may; a process that holds no epoch, the
    login side or a local run, always may)."""
    holder = held()
    return None if holder is None else holder.refusal(what)


def check(what: str) -> None:
    """Raise :class:`Stale` when this process may not ``what`` (the one check before every write
    of the run's records)."""
    holder = held()
    if holder is not None:
        holder.check(what)


@contextlib.contextmanager
def acting(what: str) -> Iterator[None]:
    """This process's holder changes Slurm (:meth:`Holder.acting`). A process that holds no
    epoch gets no check, and so no mutating command through (hpc_llm.slurm.commands refuses it)."""
    holder = held()
    if holder is None:
        yield
        return
    with holder.acting(what):
        yield


@contextlib.contextmanager
def as_user(what: str) -> Iterator[None]:
    """A change to Slurm a person asked for from the login node (``hpc-llm cancel``, the
    dev cluster): no job's epoch is involved."""
    local = world.local()
    outer = local.get(ACTING)
    local[ACTING] = f"the user: {what}"
    try:
        yield
    finally:
        local[ACTING] = outer
