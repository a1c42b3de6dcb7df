"""Running Slurm's client commands: one runner, one error type, for the login side and the job.

Every call of ``sinfo``, ``squeue``, ``scontrol``, ``sacct``, ``sacctmgr`` and ``scancel`` in
hpc_llm goes through :func:`run` (``sbatch`` goes through submitit): a timeout on each, a
retry while slurmctld is too busy to answer ("Socket timed out on send/recv operation": the
RPC queue is full, not the controller gone), and :class:`SlurmUnreachable` when Slurm could not
be asked at all (no such command, no config, a timeout, a controller that never answered).
A command that ran and said no (an unknown job, a refused update) is not an error here: the
caller reads Slurm's answer (:func:`said`).

Stdlib only: the job's supervisor and agents call it on the batch host and the compute nodes.
"""

from __future__ import annotations

import os
import subprocess

from hpc_llm import world
from hpc_llm.errors import ConfigError

HOW_TO_START = (
    "start the dev cluster with `hpc-llm dev-cluster up` and run the `export SLURM_CONF=...` "
    "line it prints, or run from a Slurm login node"
)
#: what a client prints when slurmctld (or slurmdbd) took too long: worth asking again
BUSY = ("Socket timed out on send/recv operation", "Resource temporarily unavailable")
#: tries of a command that found the controller busy, and the first pause between them
BUSY_TRIES = 3
BUSY_PAUSE_S = 1.0
#: the commands that change Slurm's state (the first words of their command line)
MUTATING = (
    ("scontrol", "requeue"),
    ("scontrol", "update"),
    ("scontrol", "hold"),
    ("scontrol", "release"),
    ("scancel",),
)
#: what the process is doing, when a change to Slurm has been checked against the run's epoch
#: (hpc_llm.rundir.epoch: Holder.acting, as_user): kept in hpc_llm.world.local
ACTING = "epoch.acting"


class Unchecked(RuntimeError):
    """A change to Slurm asked outside the run's epoch check: a bug of hpc_llm, not of Slurm."""


class SlurmUnreachable(ConfigError):
    """No Slurm answered (no client commands, no config, a controller that does not respond):
    not the same as Slurm answering no. On the login node it is bad input's kind of error (one
    line, before anything is submitted); in the job the caller decides what not knowing means."""


def no_config() -> SlurmUnreachable | None:
    """The configured SLURM_CONF does not exist: a client would first spend ~20 s on DNS SRV
    look-ups for a config server before it failed."""
    conf = world.environ().get("SLURM_CONF")
    if conf and not os.path.isfile(conf):
        return SlurmUnreachable(f"no Slurm reachable: SLURM_CONF={conf} does not exist; {HOW_TO_START}")
    return None


def run(
    args: list[str], *, timeout: float = 20, env: dict[str, str] | None = None, tries: int = BUSY_TRIES
) -> subprocess.CompletedProcess[str]:
    """Run one client command and return how it ended (any exit status). Raises
    :class:`SlurmUnreachable` when it could not be asked: the command is missing, SLURM_CONF
    names no file, it timed out, or slurmctld stayed too busy to answer over ``tries`` tries
    (``timeout`` is for all of them together)."""
    if mutating(args) and not world.local().get(ACTING):
        raise Unchecked(f"`{' '.join(args[:3])}` asked without the run's epoch check (hpc_llm.rundir.epoch)")
    if world.which(args[0]) is None:
        raise SlurmUnreachable(f"no Slurm reachable: `{args[0]}` is not on PATH; {HOW_TO_START}")
    gone = no_config()
    if gone is not None:
        raise gone
    full = {**world.environ(), **env} if env else None
    deadline = world.monotonic() + timeout
    pause = BUSY_PAUSE_S
    for attempt in range(tries):
        left = deadline - world.monotonic()
        try:
            out = world.run(args, timeout=max(left, 0.1), env=full)
        except subprocess.TimeoutExpired:
            raise SlurmUnreachable(f"no Slurm reachable: `{' '.join(args)}` timed out; {HOW_TO_START}") from None
        except OSError as exc:
            raise SlurmUnreachable(f"no Slurm reachable: `{args[0]}`: {exc}; {HOW_TO_START}") from None
        busy = out.returncode != 0 and any(b in out.stderr for b in BUSY)
        if not busy:
            return out
        if attempt + 1 == tries or world.monotonic() + pause >= deadline:
            break
        world.sleep(pause)
        pause *= 2
    raise SlurmUnreachable(f"no Slurm reachable: {args[0]}: {said(out)}; {HOW_TO_START}")


def mutating(args: list[str]) -> bool:
    """Whether ``args`` changes Slurm's state (:data:`MUTATING`)."""
    name = args[0].rsplit("/", 1)[-1] if args else ""
    return any((name, *args[1 : len(m)]) == m for m in MUTATING)


def said(out: subprocess.CompletedProcess[str]) -> str:
    """What a command that failed said, in one line: its last error line, else its exit status."""
    lines = [ln.strip() for ln in out.stderr.splitlines() if ln.strip()]
    return lines[-1] if lines else f"exit status {out.returncode}"


def all_said(out: subprocess.CompletedProcess[str]) -> str:
    """Everything a command wrote on stderr, as one line (``scontrol`` spreads one refusal over
    lines); its exit status when it wrote nothing."""
    return " ".join(out.stderr.split()) or f"exit {out.returncode}"


def asked(args: list[str], *, unknown_job: str = "Invalid job id", timeout: float = 20) -> str | None:
    """stdout of a Slurm query; None when Slurm answered that it does not know the job(s).
    Raises :class:`SlurmUnreachable` (Slurm's last error line) when Slurm could not be asked."""
    out = run(args, timeout=timeout)
    if out.returncode == 0:
        return out.stdout
    if unknown_job in out.stderr:
        return None
    raise SlurmUnreachable(f"no Slurm reachable: {args[0]}: {said(out)}; {HOW_TO_START}")


def unreachable_why(exc: SlurmUnreachable) -> str:
    """What could not be asked, without the how-to-start advice (for a status line)."""
    return str(exc).removeprefix("no Slurm reachable: ").removesuffix(f"; {' '.join(HOW_TO_START.split())}")
