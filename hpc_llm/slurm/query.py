"""What the login node asks slurmctld: partitions, the queue, a job, the cluster's settings.

Every call goes through :func:`hpc_llm.slurm.commands.run` (a timeout, a retry while slurmctld
is busy) and raises :class:`~hpc_llm.slurm.commands.SlurmUnreachable` in one line when Slurm
could not be asked, so a missing or unreachable cluster is reported before anything is
submitted. What each command prints is read by :mod:`hpc_llm.slurm.parse`.
"""

from __future__ import annotations

import shutil

from hpc_llm.errors import ConfigError
from hpc_llm.slurm import parse
from hpc_llm.slurm.commands import HOW_TO_START, SlurmUnreachable, asked, no_config, run, said
from hpc_llm.slurm.parse import Associations, Node, Partition


def partitions() -> dict[str, Partition]:
    out = run(["sinfo", "-h", "-o", "%P|%D|%c|%a"])
    if out.returncode != 0:
        raise SlurmUnreachable(f"no Slurm reachable (sinfo: {said(out)}); {HOW_TO_START}")
    return parse.partitions(out.stdout)


def default_partition(parts: dict[str, Partition]) -> Partition | None:
    return next((p for p in parts.values() if p.default), None)


def job_states(job_ids: list[str]) -> dict[str, str] | None:
    """Current state of each job squeue still knows (PENDING, RUNNING, REQUEUED...); a job
    missing from the answer has left the queue. None when squeue itself failed (slurmctld
    busy or unreachable, RPC limits): nothing is known, and nothing may be called finished."""
    try:
        return queue(job_ids)
    except SlurmUnreachable:
        return None


def queue(job_ids: list[str]) -> dict[str, str]:
    """:func:`job_states`, but a failed squeue raises SlurmUnreachable saying why (the caller
    names it) instead of answering None. A held job's state is ``HELD``."""
    return {job: state for job, (state, _reason) in queue_reasons(job_ids).items()}


def queue_reasons(job_ids: list[str]) -> dict[str, tuple[str, str]]:
    """:func:`queue` with Slurm's reason of each job (why it pends, or is held)."""
    if not job_ids:
        return {}
    # -r: one line per array task (pending tasks are otherwise shown collapsed, 12_[3-9%4])
    out = asked(["squeue", "-h", "-r", "-j", ",".join(job_ids), "-o", parse.QUEUE_FORMAT])
    # None: every id unknown to slurmctld (gone past MinJobAge): they have all left the queue
    return parse.queue_reasons(out or "")


def show_job(job_id: str) -> dict[str, str] | None:
    """A job's fields from slurmctld (``scontrol show job``); None when it does not know the
    job (never submitted, or gone past MinJobAge). Raises SlurmUnreachable."""
    out = asked(["scontrol", "show", "job", job_id])
    return parse.show_job(out) if out else None


#: flags that say nothing about whether the scheduler could run the job
_NOT_ASKED = ("output", "open_mode", "signal", "export", "job_name", "requeue")


def test_only(flags: dict[str, object]) -> str | None:
    """``sbatch --test-only`` for a job of these #SBATCH flags: None if the scheduler could run
    it, else its reason ("Requested node configuration is not available", ...). Nothing is
    queued; each call uses up one job id."""
    args = ["sbatch", "--test-only", "--wrap=true"]
    for key, value in sorted(flags.items()):
        if key in _NOT_ASKED or value is None or value is False:
            continue
        args.append(f"--{key.replace('_', '-')}" + ("" if value is True else f"={value}"))
    out = run(args, timeout=60)
    return parse.test_only_reason(out.returncode, out.stderr)


def cancel(job_ids: list[str]) -> None:
    """``scancel`` these jobs (or arrays); what cannot be cancelled (gone already) is no error."""
    if job_ids:
        run(["scancel", *job_ids], timeout=60)


# -- what `hpc-llm doctor` asks: the cluster's settings, partitions, nodes, associations ------


def show_config() -> dict[str, str]:
    """slurmctld's running configuration (``scontrol show config``). Raises SlurmUnreachable."""
    return parse.show_config(asked(["scontrol", "show", "config"]) or "")


def show_partitions() -> dict[str, dict[str, str]]:
    """Every partition's settings from slurmctld. Raises SlurmUnreachable."""
    return parse.show_partitions(asked(["scontrol", "show", "partition"]) or "")


def time_limit_s(text: str | None) -> int | None:
    """A partition's MaxTime as Slurm prints it (``UNLIMITED``, ``1-00:00:00``, ``30:00``) in
    seconds; None: no limit (or one that does not parse)."""
    if not text or text.upper() in ("UNLIMITED", "INFINITE", "NONE"):
        return None
    from hpc_llm.config.plan import parse_time_limit

    try:
        return parse_time_limit(text)
    except ConfigError:
        return None


def nodes() -> list[Node]:
    """Every node of every partition (``sinfo -N``). Raises SlurmUnreachable."""
    return parse.nodes(asked(["sinfo", "-N", "-h", "-o", parse.NODE_FORMAT]) or "")


def associations(user: str) -> Associations | None:
    """The user's accounts and QOS; None when sacctmgr cannot be asked (no accounting)."""
    if shutil.which("sacctmgr") is None or no_config() is not None:
        return None
    fmt = ["format=account,qos,defaultqos"]
    try:
        assoc = run(["sacctmgr", "-n", "-P", "show", "assoc", f"user={user}", *fmt])
        default = run(["sacctmgr", "-n", "-P", "show", "user", user, "format=defaultaccount"])
    except SlurmUnreachable:  # slurmdbd does not answer in time
        return None
    if assoc.returncode != 0:
        return None
    return parse.associations(assoc.stdout, default.stdout if default.returncode == 0 else "")
