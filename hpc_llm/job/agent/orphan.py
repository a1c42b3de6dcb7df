"""An agent whose supervisor is gone: take its place, or requeue the job, once, when its host died.

A job with spare nodes runs with ``sbatch --no-kill``, and Slurm keeps such a job RUNNING when
its batch host dies, with no batch script left to requeue it (docs/design/control-plane.md,
"Spare nodes"). Its agents then see their supervisor's connection drop (or go silent) without
an ``end``. Once Slurm confirms the host gone, the first agent alive takes the supervisor's place
in the same allocation (:mod:`hpc_llm.job.agent.takeover`); where it cannot,
:func:`requeue_orphaned` requeues the job with that host excluded, sized to what
the partition can still hold (:func:`hpc_llm.slurm.requeue.requeue`, the same sequence the
supervisor runs). Either way it leaves what it saw in ``.hpc_llm/supervisor_lost.json`` for the
next supervisor to book (:mod:`hpc_llm.job.supervisor.lost`).

The agents ask in node order, each only while the job still runs this allocation. Not when
the agent's own node was frozen (its loop stalled: the supervisor left it out), nor while the
supervisor still accepts connections after it closed ours (it dropped this agent). A host
that neither answers nor refuses (frozen, powered off, or cut off from this node alone) is
judged by Slurm: requeue only once slurmctld finds it not responding too. Stdlib only.
"""

from __future__ import annotations

import contextlib
import logging
import signal
from dataclasses import dataclass
from pathlib import Path

from hpc_llm import world
from hpc_llm.job import wire
from hpc_llm.job.agent import takeover
from hpc_llm.rundir import epoch
from hpc_llm.rundir.layout import RunDir
from hpc_llm.rundir.record import write_json
from hpc_llm.slurm import allocation, requeue

log = logging.getLogger("hpc_llm.agent")

#: an orphaned agent waits this long x its node index before it requeues the job: the first one
#: alive asks, the others find the job requeued already
ORPHAN_STAGGER_S = 2.0
#: an orphaned agent waits this long before it asks the supervisor's address whether it refuses
ORPHAN_SETTLE_S = 0.3
#: an orphaned agent whose supervisor's host does not refuse a connection (frozen, or cut off from
#: this node only) waits for Slurm's verdict on that host this long beyond SlurmdTimeout
VERDICT_SLACK_S = 60.0
VERDICT_POLL_S = 2.0


@dataclass(frozen=True)
class Orphan:
    """What an agent knows when its supervisor is gone."""

    node: str
    node_id: int
    job_id: str
    job_ref: str
    restart: int
    run_dir: Path
    #: the supervisor's address, host:port
    supervisor: str
    #: its connection went silent (still open) rather than closed
    silent: bool
    #: when the supervisor was found gone (epoch seconds)
    lost_at: float
    #: (nodes the run needs, nodes submitted with, ranks per node)
    requeue_on_loss: tuple[int, int, int]
    #: the run's epoch of the last generation this agent ran ("r.t.g"; None: it ran none, a spare)
    epoch: str | None = None


def requeue_orphaned(o: Orphan) -> None:
    """Requeue the job whose batch host died (see the module's docstring), or leave it be."""
    # a process being killed closes its sockets one by one: asked 1 ms after our connection
    # dropped, its listener still accepted, and the agent took the supervisor for alive
    world.sleep(ORPHAN_SETTLE_S)
    answer = ask_supervisor(o)
    if answer == "accepted" and not o.silent:
        # it dropped this agent (it took this node for dead: it could not reach it a while) and
        # lives on; it may still die before it starts new agents, leaving the job with nobody:
        # this agent keeps an eye on it from here until then
        log.warning("hpc_llm agent on %s: the supervisor dropped this agent: watching it from here", o.node)
        lingered = linger(o)
        if lingered is None:
            return
        answer = lingered
    refused = answer == "refused"
    # the batch host (whose death orphans us) is the allocation's first node: the next asks at once
    world.sleep(ORPHAN_STAGGER_S * max(0, o.node_id - 1))
    log.info(
        "hpc_llm agent on %s: the supervisor's address %s: asking Slurm",
        o.node,
        "refuses" if refused else "does not answer",
    )
    info = job_info(o.job_id)
    lost = takeover.supervisor_node()  # a supervisor that took over runs on another node than BatchHost
    host = lost or batch_host(info) or "?"
    how = "refused connections"
    argv = takeover.command()
    # A supervisor that ends leaves its batch script ending the job: only a host Slurm finds gone
    # keeps the job RUNNING for another supervisor (one that took over ends no batch script)
    if not refused or (argv is not None and host == info.get("BatchHost")):
        verdict = await_verdict(o, host, follow_batch_host=lost is None)
        if verdict is None:
            return
        info, host = verdict, lost or batch_host(verdict) or host
        how = "refused connections, and not responding to slurmctld" if refused else "not responding to slurmctld"
    if not allocation.still_this_allocation(info, o.restart):
        log.warning("hpc_llm agent on %s: the job is %s already: not requeueing", o.node, info.get("JobState"))
        return
    holder = take_command(o)
    if holder is None:
        return
    needed = o.requeue_on_loss[0]
    why = takeover.why_not(argv, allocation.hostnames(info.get("NodeList")), host, needed) if host != "?" else "?"
    if argv is not None and why is None:
        seen = {"job_id": o.job_id, "restart": o.restart, "node": host, "how": how, "by": o.node}
        takeover.take_over(argv, o.run_dir, o.job_ref, o.restart, o.node, host, {**seen, "detected_at": o.lost_at})
        why = "the supervisor could not be started here"
    if argv is not None:
        log.warning("hpc_llm agent on %s: cannot take the supervisor's place (%s): requeueing", o.node, why)
    _requeue(o, info, host, how, holder, refused=why if argv is not None else None)


#: how often a dropped agent asks whether its supervisor still lives, and slurmctld about the job
LINGER_POLL_S = 5.0
LINGER_ASK_SLURM_S = 60.0


def ask_supervisor(o: Orphan) -> str:
    """ "accepted", "refused" (its host is up, the process is not) or "silent" (no answer at all)."""
    try:
        wire.connect(o.supervisor, timeout_s=2.0).close()
    except ConnectionRefusedError:
        return "refused"
    except OSError:
        return "silent"
    return "accepted"


def linger(o: Orphan) -> str | None:
    """A dropped agent watches its supervisor: the supervisor's answer once it stops accepting
    (then the orphan's path goes on), or None when there is nothing left to watch for: another
    process took command of the job (the supervisor resumed it, an agent took over), or Slurm
    moved the job on or ended it (it kills this agent with it anyway)."""
    known = epoch.Epoch.parse(o.epoch) or epoch.Epoch(o.restart, 0)
    asked = world.monotonic()
    while True:
        world.sleep(LINGER_POLL_S)
        with contextlib.suppress(OSError):
            now = epoch.current(o.run_dir, o.job_id)
            if now is not None and (now.restart != o.restart or now.command > known.command):
                return None
        answer = ask_supervisor(o)
        if answer != "accepted":
            return answer
        if world.monotonic() - asked > LINGER_ASK_SLURM_S:
            asked = world.monotonic()
            info = allocation.show_job(o.job_id)
            if info and not allocation.still_this_allocation(info, o.restart):
                return None


def take_command(o: Orphan) -> epoch.Holder | None:
    """Claim the next command of this allocation (:mod:`hpc_llm.rundir.epoch`): this agent acts
    for the job from now on, and no other process of it (another orphaned agent, the lost
    supervisor come back) may. None when another process holds the job already (it took over,
    requeued, or the supervisor resumed command): then this agent ends."""
    try:
        now = epoch.current(o.run_dir, o.job_id)
    except OSError as exc:
        log.warning("hpc_llm agent on %s: the run's epoch cannot be read (%s): doing nothing", o.node, exc)
        return None
    # the command this agent served; one that was never told (started by an older hpc_llm) served
    # the batch script's, the allocation's first
    known = epoch.Epoch.parse(o.epoch) or epoch.Epoch(o.restart, 0)
    if now is not None and (now.restart != o.restart or now.command > known.command):
        by = epoch.claimed_by(o.run_dir, o.job_id, now.restart, now.takeover)
        log.warning("hpc_llm agent on %s: epoch %s holds the job (claimed by %s): ending", o.node, now, by)
        return None
    holder = epoch.claim(
        o.run_dir, o.job_id, o.restart, known.takeover + 1, by=o.node, generation=(now or known).generation
    )
    if holder is None:
        found = epoch.current(o.run_dir, o.job_id)
        by = epoch.claimed_by(o.run_dir, o.job_id, found.restart, found.takeover) if found else "?"
        log.warning("hpc_llm agent on %s: the agent on %s took command of the job first: ending", o.node, by)
        return None
    holder.role = "agent"
    epoch.install(holder)
    log.warning("hpc_llm agent on %s: took command of the job (epoch %s)", o.node, holder.epoch)
    return holder


def await_verdict(o: Orphan, host: str, follow_batch_host: bool = True) -> dict[str, str] | None:
    """Wait until slurmctld finds the supervisor's host ``host`` gone (then the job's info now), or
    give up (None) after SlurmdTimeout and :data:`VERDICT_SLACK_S`, or when the job moved on.
    ``follow_batch_host``: ``host`` is the job's BatchHost, as slurmctld names it."""
    deadline = world.monotonic() + allocation.slurmd_timeout_s(allocation.slurm_config()) + VERDICT_SLACK_S
    log.warning("hpc_llm agent on %s: waiting for Slurm's verdict on the batch host %s", o.node, host)
    info: dict[str, str] = {}
    # staggered like the first ask: at scale, not every agent polls slurmctld at once
    while host == "?" or not (taken_out(info, host) or allocation.node_gone(host)):
        world.sleep(VERDICT_POLL_S + ORPHAN_STAGGER_S * (o.node_id % 8))
        info = job_info(o.job_id)
        host = (batch_host(info) if follow_batch_host else None) or host
        if info and not allocation.still_this_allocation(info, o.restart):
            log.warning("hpc_llm agent on %s: the job is %s already: not requeueing", o.node, info.get("JobState"))
            return None
        if world.monotonic() > deadline and not taken_out(info, host):
            log.warning("hpc_llm agent on %s: Slurm still finds %s alive: not requeueing", o.node, host)
            return None
    return job_info(o.job_id)


def taken_out(info: dict[str, str], host: str) -> bool:
    """Slurm took the supervisor's host out of this ``--no-kill`` job (it called it DOWN once):
    the verdict, even when the host is back up by now (rebooted, registered again: then
    ``node_gone`` is false for good, and the job would be left RUNNING with nobody in it)."""
    return bool(info.get("NodeList")) and host not in allocation.hostnames(info.get("NodeList"))


def _requeue(o: Orphan, info: dict[str, str], host: str, how: str, holder: epoch.Holder, refused: str | None) -> None:
    """Decided and recorded first: the requeue ends this agent's step within seconds. The job
    asks for what the partition can still hold (requeue.fit_partition): with every node of it
    allocated, a job whose batch host died would otherwise pend until an operator returns that
    host. ``refused``: why no agent could take the supervisor's place, when one was offered (the
    record says so)."""
    needed, full, per_node = o.requeue_on_loss
    exclude = [n for n in allocation.hostnames(info.get("ExcNodeList")) if n != host]
    partition = info.get("Partition") or None
    # this node is up, whatever sinfo says (it may call it not responding a while after a cut
    # has healed: the simulator's seed 3056, nothing up but the lost host, which was excluded)
    up = allocation.partition_up(partition, known_up=(o.node,))
    kept: str | None = None
    if host != "?" and up and len([n for n in up if n not in exclude and n != host]) < needed:
        # the partition cannot hold the run without the lost host: Slurm keeps it out while it is
        # DOWN, and an exclusion would keep it out once it is back, rebooted and sound, with
        # nothing else left to run on (the simulator's seed 1253: pending for good)
        kept = "the partition cannot hold the run without it"
        log.warning("hpc_llm agent on %s: not excluding %s: %s", o.node, host, kept)
    elif host != "?":
        exclude.append(host)
    if host == "?":
        kept = "no BatchHost"
    # what the requeued job will ask for is not its NodeList now (a job that gave nodes back asks
    # for its allocated size again), nor known here: taken as the most it can be, so that a short
    # partition always gets the job sized down to what is up, never left pending
    asked = full
    shrunk = requeue.fit_partition(
        requeue.Size(asked, full, needed, partition, tuple(exclude), doubtful=(host,), known_up=(o.node,))
    )
    seen = {
        "job_id": o.job_id,
        "restart": o.restart,
        "node": host,
        "how": how,
        "by": o.node,
        "detected_at": o.lost_at,
        "requeued_at": world.time(),
        "exclude_error": kept,
        "shrunk": shrunk[1] if shrunk else None,
        "takeover_refused": refused,
    }
    lost = RunDir(o.run_dir).supervisor_lost
    with contextlib.suppress(OSError, epoch.Refused):
        write_json(lost, seen)
    log.info("hpc_llm agent on %s: job %s is %s: requeueing it", o.node, o.job_ref, info.get("JobState"))
    world.on_signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        with holder.acting("requeueing the job its supervisor was lost from"):
            done = requeue.requeue(
                o.job_ref,
                exclude=exclude if host != "?" else None,
                resize=shrunk,
                per_node=per_node,
                after_dead_node=True,
            )
    except epoch.Refused as exc:
        log.error("hpc_llm agent on %s: not requeueing: %s", o.node, exc.why)
        return
    if not done.ok:
        with contextlib.suppress(OSError):
            lost.unlink()
        log.error("hpc_llm agent on %s: the supervisor is gone; scontrol requeue failed: %s", o.node, done.refused)
        return
    err = done.update_error or kept
    log.warning(
        "hpc_llm agent on %s: the supervisor is gone, its batch host %s %s: job requeued%s%s%s",
        o.node,
        host,
        how,
        f" (could not exclude {host}: {err})" if err else f", {host} excluded",
        f"; {done.resized}" if done.resized and not err else "",
        f"; could not hold it: {done.hold_error}" if done.hold_error else "",
    )


def batch_host(info: dict[str, str]) -> str | None:
    """The job's BatchHost (None once Slurm took it out of the job: scontrol says ``(null)``)."""
    host = info.get("BatchHost")
    return None if host in (None, "", "(null)", "None") else host


def job_info(job_id: str) -> dict[str, str]:
    """``scontrol show job``, asked up to 5 times: one slow answer from slurmctld must not leave
    a job with no supervisor RUNNING until its time limit ({} when it never answers)."""
    for i in range(5):
        info = allocation.show_job(job_id)
        if info:
            return info
        world.sleep(2.0 * (i + 1))
    return {}
