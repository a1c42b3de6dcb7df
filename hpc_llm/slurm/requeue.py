"""Putting this job back in the queue, from inside it: one sequence for the supervisor and for an
orphaned agent.

:func:`requeue` is what both call (the supervisor when its policy decides a requeue; an agent
whose supervisor's host died, for a ``--no-kill`` job Slurm keeps RUNNING without its batch
script): the caller sizes the job to what its partition still holds (:func:`fit_partition`,
decided before anything is asked: the requeue ends the caller's own step within seconds), then
:func:`requeue` runs ``scontrol requeue``,
then one ``scontrol update`` of the pending job (its ``ExcNodeList`` and size:
:func:`update_pending`), then, on Slurm < 24.05 after a node death, a hold until that node is
let go (:func:`hold_if_dead_node_lingers`). :func:`ending_for_good` is the other end: a job that
must not come back. Stdlib only.
"""

from __future__ import annotations

from dataclasses import dataclass

from hpc_llm import world
from hpc_llm.slurm import parse
from hpc_llm.slurm.allocation import partition_up, preempting, show_job, slurm_config, slurm_version, slurmd_timeout_s
from hpc_llm.slurm.commands import SlurmUnreachable, all_said, run, unreachable_why


@dataclass(frozen=True)
class Size:
    """What a requeued job's size is decided from (:func:`fit_partition`): the nodes it asks for
    now, the nodes it was submitted with (its training nodes and spares), the fewest nodes the
    run trains on (``resources.min_nodes``, else its training nodes), its partition, the nodes it
    will not get (its ExcNodeList after the requeue), its training nodes (0: ``needed``) and the
    nodes it found dead."""

    asked: int
    full: int
    needed: int
    partition: str | None
    excluded: tuple[str, ...] = ()
    nodes: int = 0
    #: nodes the run found dead that sinfo may still call up (slurmctld calls them DOWN only at
    #: SlurmdTimeout): not counted as up
    doubtful: tuple[str, ...] = ()
    #: nodes known to be up whatever sinfo says (the caller's own: sinfo may call a node not
    #: responding for a while after a cut has healed)
    known_up: tuple[str, ...] = ()

    @property
    def train(self) -> int:
        """The nodes the run trains on when it has them all."""
        return self.nodes or self.needed


@dataclass(frozen=True)
class Requeued:
    """How a :func:`requeue` went. ``refused``: Slurm did not requeue the job (it runs on, or
    ends with this allocation); the rest are about the pending job it became."""

    refused: str | None = None
    #: the pending job's new size and why (fit_partition), when it changed
    resized: str | None = None
    #: Slurm refused the pending job's new ExcNodeList or size
    update_error: str | None = None
    #: Slurm refused the hold after a dead node (< 24.05)
    hold_error: str | None = None

    @property
    def ok(self) -> bool:
        return self.refused is None


def requeue(
    ref: str,
    *,
    exclude: list[str] | None,
    resize: tuple[int, str] | None,
    per_node: int,
    after_dead_node: bool,
    by_ending: bool = False,
) -> Requeued:
    """Requeue job ``ref``: ``exclude`` becomes its ExcNodeList (None: unchanged); ``resize``, the
    nodes it now asks for and why (:func:`fit_partition`, decided by the caller before anything
    is asked: the requeue ends the caller's own step within seconds); ``after_dead_node``: a node
    of it died (hold it on Slurm < 24.05). ``by_ending``: the end of the batch script is the
    requeue (:func:`requeued_by_ending`): nothing to ask but the hold."""
    if not by_ending:
        refused = requeue_job(ref)
        if refused is not None:
            return Requeued(refused=refused)
    update_error = None
    if exclude is not None or resize:
        update_error = update_pending(ref, exclude=exclude, nodes=resize[0] if resize else None, per_node=per_node)
    hold_error = hold_if_dead_node_lingers(ref) if after_dead_node else hold_for_cleanup(ref)
    return Requeued(resized=resize[1] if resize else None, update_error=update_error, hold_error=hold_error)


def requeue_job(ref: str) -> str | None:
    """``scontrol requeue``: None when Slurm accepted it, else its one-line complaint."""
    try:
        out = run(["scontrol", "requeue", ref], timeout=60)
    except SlurmUnreachable as exc:
        return unreachable_why(exc)
    said = " ".join(out.stderr.split())
    if out.returncode == 0 or "Job is pending execution" in said:
        # ESLURM_JOB_PENDING (job_mgr.c, _job_requeue_op): slurmctld requeued the job itself first
        # (a preemption whose grace time ended, a node failure) while this stop was decided; what
        # we asked for has happened (seen on the dev cluster: a preemption in the post-train
        # stage was failed for it)
        return None
    return said or f"exit {out.returncode}"


def fit_partition(size: Size) -> tuple[int, str] | None:
    """How many nodes a requeued job should ask for, and why; None when it fits as it is (or
    sinfo cannot tell). With fewer up in its partition outside its exclusions than it asks for, it
    asks for what is up, never fewer than it needs: the run starts with fewer spares (then, with
    ``resources.min_nodes``, on fewer nodes) rather than pending for nodes that may never come back
    (a dead node stays DOWN until an operator returns it). With more up again, a job shrunk before
    asks for its spares and nodes back. Decided
    before the requeue (the requeue ends the agents' step), applied after it by
    :func:`update_pending` (only a pending job's size can change)."""
    up = partition_up(size.partition, size.known_up)
    if not up or size.full <= size.needed:
        return None
    free = len([n for n in up if n not in size.excluded and n not in size.doubtful])
    want = min(size.full, max(free, size.needed))
    if want == size.asked:
        return None
    train = size.train
    if want < train:
        why = (
            f"only {free} node(s) of partition {size.partition} are up outside the excluded: the job now asks "
            f"for {want}: the run goes on with {want} of its {train} node(s) (resources.min_nodes={size.needed})"
        )
    elif want < size.asked:
        why = (
            f"only {free} node(s) of partition {size.partition} are up outside the excluded: the job now asks "
            f"for {want} ({want - train} spare(s) instead of {size.asked - train})"
        )
    else:
        what = f"{want - train} spare(s)" if size.full > train else f"all its {train} node(s) again"
        why = f"{free} node(s) of partition {size.partition} are up again: the job asks for {want} ({what})"
    return want, why


#: tries of ``scontrol update`` a second apart while the requeued job is not pending yet
UPDATE_TRIES = 5


def update_pending(
    ref: str, exclude: list[str] | None = None, nodes: int | None = None, per_node: int = 1
) -> str | None:
    """One ``scontrol update`` of the job just requeued: its ``ExcNodeList`` and/or its size
    (``NumNodes`` and ``NumTasks``: see :func:`fit_partition`). None when Slurm took it, else
    its one-line complaint. Asked again for a few seconds while slurmctld does not see the job
    pending yet. One call, not one per field: after an agent's requeue, Slurm is ending the
    agent's own step.

    Verified on the dev cluster (22.05), as a user who is not an operator, on a pending 3-node
    job with ``--ntasks-per-node=1``: ``NumNodes=2 NumTasks=2`` is accepted and the job starts
    on 2 nodes; ``NumNodes`` alone only lowers ``min_nodes`` (slurmctld: "setting min_nodes from
    3 to 2") and the job, still ``NumTasks=3``, waits for a third; ``NumNodes=3 NumTasks=3``
    afterwards is accepted too (a pending job's size is the user's to change both ways)."""
    fields = [f"ExcNodeList={','.join(exclude)}"] if exclude is not None else []
    if nodes is not None:
        fields += [f"NumNodes={nodes}", f"NumTasks={nodes * per_node}"]
    if not fields:
        return None
    for attempt in range(UPDATE_TRIES):
        try:
            out = run(["scontrol", "update", f"JobId={ref}", *fields], timeout=60)
        except SlurmUnreachable as exc:
            return unreachable_why(exc)
        said = " ".join(out.stderr.split())
        # a job just requeued may not be pending yet in slurmctld's view: ask again, briefly
        if out.returncode == 0 or "pending" not in said.lower() or attempt == UPDATE_TRIES - 1:
            break
        world.sleep(1.0)
    return None if out.returncode == 0 else (said or f"exit {out.returncode}")


def give_back(ref: str, keep: list[str]) -> str | None:
    """Shrink the running job to the nodes ``keep`` (``scontrol update JobId=J NodeList=...``):
    the others go back to Slurm, and nobody pays for a node the run no longer uses. None when
    Slurm took it, else its one-line complaint. Slurm (job_mgr.c, ``_update_job``, 24.11) lets a
    running job shrink unless SchedulerParameters has ``disable_job_shrink``, never without its
    batch host; it kills the job's processes on the nodes let go (``abort_job_on_nodes``), only
    their tasks of each step (``kill_step_on_node`` without a node failure), and the steps go on
    on the nodes kept (verified: docs/design/verified/slurm.md)."""
    try:
        out = run(["scontrol", "update", f"JobId={ref}", f"NodeList={','.join(keep)}"], timeout=30)
    except SlurmUnreachable as exc:
        return unreachable_why(exc)
    return None if out.returncode == 0 else (" ".join(out.stderr.split()) or f"exit {out.returncode}")


#: Slurm >= 24.05 books a batch job that ends after its preemption's grace-time signal as
#: PREEMPTED and requeues it (proc_req.c, the job's GRACE_PREEMPT flag: SchedMD commit a689104d,
#: "Treat jobs completing after being signalled for GraceTime as preempted"). The flag is cleared
#: on that path only: neither `scontrol requeue` nor slurmctld's own requeue at the end of the
#: grace time clears it. Seen on 24.11.5 (22.05 has no such flag): after the supervisor's own
#: `scontrol requeue` of a preempted run, the next attempt trained to the end and was booked
#: PREEMPTED and requeued once more (a third attempt, "nothing to do"); with Requeue=0 set before
#: that end it was not requeued but still booked PREEMPTED. So on >= 24.05 the supervisor ends the
#: batch script in the grace time instead of `scontrol requeue` (:func:`requeued_by_ending`: one
#: PREEMPTED row, then COMPLETED), and sets Requeue=0 before any end for good
#: (:func:`ending_for_good`), for a flag left by slurmctld's own requeue (a save longer than the
#: grace time): such a run is not started again, only booked PREEMPTED.
GRACE_PREEMPT_REQUEUES_SINCE = (24, 5)


def requeued_by_ending(job_id: str | None, partition: str | None = None) -> bool:
    """Whether the end of this batch script is itself the job's requeue: on Slurm >= 24.05, in a
    preemption's grace time (PreemptTime set), for a --requeue job on a partition that preempts by
    REQUEUE. Slurm then books the attempt PREEMPTED, requeues the job and clears its grace-time
    flag; `scontrol requeue` instead would leave the flag set (GRACE_PREEMPT_REQUEUES_SINCE).
    False when any of it is not so, or cannot be asked: `scontrol requeue` as on 22.05. (A new
    ExcNodeList needs that too: Slurm takes it only once the job is pending again, "Job is no
    longer pending execution" on a running one, seen on 24.11; 22.05's job_mgr.c has the same
    ESLURM_JOB_NOT_PENDING check.)"""
    version = slurm_version()
    if not job_id or version is None or version < GRACE_PREEMPT_REQUEUES_SINCE:
        return False
    info = show_job(job_id)
    if not preempting(info) or info.get("Requeue") != "1":
        return False
    part = info.get("Partition") or partition
    try:
        out = run(["scontrol", "show", "partition", "-o", part], timeout=10) if part else None
    except SlurmUnreachable:
        return False
    return out is not None and "REQUEUE" in parse.show_job(out.stdout).get("PreemptMode", "")


def ending_for_good(ref: str) -> str | None:
    """The batch script is about to end and the job must not come back (the run is done, or
    failed): on Slurm >= 24.05 set the job's Requeue=0, so that an earlier preemption's grace-time
    flag cannot requeue it (GRACE_PREEMPT_REQUEUES_SINCE). None when done or not needed, else
    Slurm's complaint (the run's outcome stands either way)."""
    version = slurm_version()
    if version is None or version < GRACE_PREEMPT_REQUEUES_SINCE:
        return None
    try:
        out = run(["scontrol", "update", f"JobId={ref}", "Requeue=0"], timeout=10)
    except SlurmUnreachable as exc:
        return unreachable_why(exc)
    return None if out.returncode == 0 else all_said(out)


#: Slurm < 24.05, seen on 22.05.8: a job requeued (`scontrol requeue`) while a dead node still
#: holds it COMPLETING is started again the moment Slurm calls that node DOWN (its begin time was
#: set at the requeue, long past by then), racing the survivors' clean-up of the old allocation:
#: the new batch step failed in job_container/tmpfs ("container_p_join: open failed for
#: .../<job>/.ns") and the job ended FAILED, the run lost. 24.11 requeues at the DOWN and waits
#: cred_expire before the next start (slurmctld: "Requeuing JobId=2" then "Allocate" 11 s later).
REQUEUE_DELAY_SINCE = (24, 5)


#: seconds beyond cred_expire a job hpc_llm requeued waits on Slurm < 24.05 whatever the cause:
#: seen on 22.05.8 under load, the requeued job (same job id) was allocated its old batch host
#: again 11 s after the requeue (cred_expire=10) while the old allocation's job container was
#: still being torn down there; the new batch step failed in job_container/tmpfs
#: ("container_p_join: open failed for .../<node>/<job>/.ns"), the job ended FAILED, and the
#: run was left "requeued" for good (tests/test_faults.py, a node's ECC error, requeued)
CLEANUP_S = 10


def hold_after_dead_node(conf: dict[str, str]) -> int:
    """Seconds a job requeued around a dead node must not start again (Slurm < 24.05,
    REQUEUE_DELAY_SINCE): until Slurm can have called the node DOWN (SlurmdTimeout and up to a
    third more), plus the cred_expire Slurm's own requeue would wait after that."""
    return int(slurmd_timeout_s(conf) * 4 / 3) + parse.cred_expire_s(conf)


def hold_for_cleanup(ref: str) -> str | None:
    """On Slurm < 24.05, hold a job just requeued for cred_expire + :data:`CLEANUP_S`: its old
    allocation's job containers are gone by then (None when held or not needed)."""
    version = slurm_version()
    if version is None or version >= REQUEUE_DELAY_SINCE:
        return None
    return hold_start(ref, parse.cred_expire_s(slurm_config()) + CLEANUP_S)


def hold_if_dead_node_lingers(ref: str) -> str | None:
    """On Slurm < 24.05 (REQUEUE_DELAY_SINCE), hold a job just requeued around a dead node until
    Slurm has let that node go (:func:`hold_after_dead_node`); None when held or not needed,
    else why it could not be."""
    version = slurm_version()
    if version is None or version >= REQUEUE_DELAY_SINCE:
        return None
    return hold_start(ref, hold_after_dead_node(slurm_config()))


def hold_start(ref: str, seconds: int) -> str | None:
    """The requeued job may not start before ``seconds`` from now (its StartTime)."""
    try:
        out = run(["scontrol", "update", f"JobId={ref}", f"StartTime=now+{seconds}"], timeout=10)
    except SlurmUnreachable as exc:
        return unreachable_why(exc)
    return None if out.returncode == 0 else all_said(out)
