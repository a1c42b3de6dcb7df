"""What the fault policy decides on and what it decides: its settings, the facts of a stop, a decision.

:class:`Settings` is ``fault.*`` as the policy reads it; :class:`Stop` the facts of one stop of
a generation, gathered by the supervisor (:mod:`hpc_llm.job.supervisor.facts`); :class:`Decision`
what :func:`hpc_llm.job.supervisor.policy.decide` returns, carried out by
:mod:`hpc_llm.job.supervisor.act`. Plain data, stdlib only.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hpc_llm.job.failures import RankExit, RankFailure
from hpc_llm.rundir.outcome import Action, Cause, State

#: a day, in seconds (the rate cap's window, the default forgiveness)
DAY_S = 86400.0


@dataclass(frozen=True)
class Settings:
    """``fault.*`` as the policy reads them."""

    #: nodes the run needs (an exclusion never leaves fewer; the supervisor checks the partition)
    nodes: int = 1
    recover: bool = True
    restart_in_place: bool = True
    #: failures in a row without a new checkpoint
    max_failures: int = 5
    #: failures in any 24 h of wall clock (None: no cap)
    max_failures_per_day: float | None = 24.0
    #: attempts in a row without a new checkpoint, whatever their cause
    max_attempts_without_progress: int = 10
    #: preemptions over the run's life (None: no limit)
    max_preemptions: int | None = None
    #: time-limit requeues over the run's life (None: no limit)
    max_timeouts: int | None = None
    #: a node's blame expires after this long without a new failure on it
    forgive_after_s: float = DAY_S
    #: a SIGTERM this close to the end time is the time limit
    term_at_end_s: float = 5.0
    #: resources.min_nodes: the run may go on with as few nodes (None: ``nodes``, never fewer)
    min_nodes: int | None = None


@dataclass(frozen=True)
class Stop:
    """The facts of one stop of a generation, gathered by the supervisor
    (:mod:`hpc_llm.job.supervisor.facts`)."""

    returncode: int
    now: float
    #: why the supervisor forwarded a stop signal to the ranks (time_limit | preemption | signal | drain)
    stop_cause: Cause | None = None
    #: when the batch step got SIGTERM (Slurm ending the allocation), if it did
    sigterm_at: float | None = None
    #: the job's end time, read again when the stop was decided (``scontrol update TimeLimit`` moves it)
    end_time: float | None = None
    #: a preemption's grace time is running (scontrol's PreemptTime)
    preempting: bool = False
    #: Slurm itself is requeueing the job (its JobState, e.g. NODE_FAIL): the allocation ends
    slurm_requeueing: str | None = None
    #: a hang the supervisor named: (reason, nodes of the silent ranks)
    hang: tuple[str, tuple[str, ...]] | None = None
    #: a checkpoint save or upload that stalled (the supervisor's reason): the store's, not a node's
    storage_stall: str | None = None
    #: the supervisor itself stalled (its host frozen) past the agents' patience: they ended
    self_stall: str | None = None
    #: nodes whose agent was confirmed dead (silent, then no answer from its host), with why
    dead_nodes: tuple[tuple[str, str], ...] = ()
    #: agents gone on a host that still answers (their probe port refused), with why
    agents_died: tuple[tuple[str, str], ...] = ()
    #: agents that ended of their own error (a bug, not the node), with why
    agent_errors: tuple[tuple[str, str], ...] = ()
    #: the supervisor's own node (the batch host)
    batch_host: str | None = None
    #: the generation's nodes other than the batch host, and how many of their agents the
    #: supervisor still heard at this stop
    remote_nodes: int = 0
    remote_heard: int = 0
    #: whether slurmctld answered the supervisor at this stop (None: not asked, or off Slurm)
    slurmctld_answers: bool | None = None
    #: Slurm's verdict on the silent nodes (:attr:`dead_nodes`) when nothing else vouched for the
    #: batch host's own link (no other agent heard): those slurmctld found DOWN or NOT_RESPONDING
    #: within SlurmdTimeout and a ping of their silence; None: not asked (another agent was heard,
    #: slurmctld did not answer, or off Slurm)
    slurm_gone: tuple[str, ...] | None = None
    #: how long the supervisor waited for that verdict (seconds)
    verdict_waited_s: float = 0.0
    #: the start-up phase (imports, container, rendezvous, data) that outlived fault.startup_timeout_s
    startup: str | None = None
    #: the allocation holds fewer usable nodes than the run needs (why): a new allocation is needed
    too_few: str | None = None
    #: slurmctld stopped answering the supervisor for longer than it may train on (why): Slurm may
    #: be calling this host DOWN and requeueing the job elsewhere
    ctld_lost: str | None = None
    #: ... and it answered again, with this allocation still running here
    ctld_answered: bool = False
    failures: tuple[RankFailure, ...] = ()
    #: the ranks that did not exit 0, first to end first (those the supervisor killed are marked)
    rank_exits: tuple[RankExit, ...] = ()
    #: nodes the agent step's srun reported failed (Slurm's NODE_FAIL)
    failed_nodes: tuple[str, ...] = ()
    #: nodes the agent step's srun could not start its task on (no answer from their slurmd)
    launch_failed: tuple[str, ...] = ()
    #: another node's agent was heard at this stop: the batch host's own link works (None: not
    #: known, a stop gathered by hand)
    vouched: bool | None = None
    on_slurm: bool = True
    #: warm agents of this allocation outside the generation's layout (resources.spare_nodes):
    #: the nodes a swap may put in the place of the nodes it leaves out
    spares: tuple[str, ...] = ()
    #: nodes of the generation Slurm shows draining (stop_cause drain: the supervisor stopped for them)
    draining: tuple[str, ...] = ()
    #: slow nodes of the generation a straggler verdict named (stop_cause straggler: the supervisor
    #: stopped to swap them)
    stragglers: tuple[str, ...] = ()
    #: the nodes the generation trained on
    trained_nodes: int = 0
    #: the generation's layout, the nodes its ranks ran on (empty: no generation started yet)
    trainers: tuple[str, ...] = ()
    #: the allocation's nodes the run has not left out (with the trainers and the spares)
    usable_nodes: tuple[str, ...] = ()
    #: the allocation outlives a node's loss (``--no-kill``): the run may go on here without it
    shrinkable: bool = False
    #: spares that took a place in this generation (new in its layout since the last one)
    joined: tuple[str, ...] = ()


@dataclass(frozen=True)
class Decision:
    action: Action
    cause: Cause
    reason: str
    #: the attempt's state to record (completed | stopped | failed | running)
    state: State
    #: nodes blamed for this stop
    suspects: tuple[str, ...] = ()
    #: nodes hpc_llm leaves out of the next allocation (blame still in force), sorted
    exclude: tuple[str, ...] = ()
    #: other things to record on the run (a budget's reason, a warning)
    notes: tuple[str, ...] = field(default_factory=tuple)
    #: seconds to wait before a restart in place (backoff after transient storage errors)
    delay_s: float = 0.0
    #: on a swap: the nodes of this generation left out, each replaced by a spare (sorted); on a
    #: shrink: the nodes left out, spares in the places they can fill
    swap_out: tuple[str, ...] = ()
    #: on a ``network`` stop: the nodes the batch host could not reach (blamed only if again)
    unreachable: tuple[str, ...] = ()
