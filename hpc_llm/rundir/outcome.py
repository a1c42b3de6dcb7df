"""The words an attempt's record uses for how it ended: its state, the cause, the action taken.

The job's fault policy (:mod:`hpc_llm.job.supervisor.policy`) decides them, the records
(:mod:`hpc_llm.rundir.record`: attempts.json, results.json) keep them, and the login side reads
them (status, report). Each is a ``str`` enum: a member is its value wherever a string goes (it
compares equal to it, JSON writes it as it, an f-string prints it), so the files read the same
as when these were bare strings. Python >= 3.10 (``StrEnum`` is 3.11). Stdlib only.
"""

from __future__ import annotations

from enum import Enum


class _Word(str, Enum):
    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return str(self.value).__format__(spec)


class State(_Word):
    """How an attempt stands (``attempts[].state``)."""

    #: not ended yet, or died unrecorded (the next start closes it)
    RUNNING = "running"
    COMPLETED = "completed"
    #: stopped on a signal or a request after saving
    STOPPED = "stopped"
    FAILED = "failed"
    #: its allocation ended with nobody there to record it
    LOST = "lost"


class Cause(_Word):
    """Why an attempt ended (``attempts[].cause``)."""

    COMPLETED = "completed"
    # -- failures of the machine: counted by fault.max_failures and the rate cap
    FAILURE = "failure"
    TRANSIENT = "transient"
    HANG = "hang"
    NODE_FAILURE = "node_failure"
    #: nodes went silent that Slurm finds responding: a link between them and the batch host
    NETWORK = "network"
    LOST = "lost"
    WATCHDOG = "watchdog"
    PREFLIGHT = "preflight"
    STARTUP = "startup"
    # -- stops the run asked for or Slurm imposed
    TIME_LIMIT = "time_limit"
    PREEMPTION = "preemption"
    SIGNAL = "signal"
    #: the supervisor stopped for a node an operator drains
    DRAIN = "drain"
    #: the supervisor stopped to put a spare in a slow node's place (straggler.action=swap)
    STRAGGLER = "straggler"
    # -- the run ends
    USER_ERROR = "user_error"
    PREFLIGHT_FAILED = "preflight_failed"
    CANCELLED = "cancelled"
    BUDGET = "budget"


class Action(_Word):
    """What the supervisor did about a stop (``attempts[].action``)."""

    DONE = "done"
    #: the next generation in this allocation, on the same nodes
    RESTART = "restart"
    #: the next generation in this allocation, spares in the place of left-out nodes
    SWAP = "swap"
    #: the next generation in this allocation on fewer nodes: left-out nodes with no spare for
    #: them, down to resources.min_nodes (the global batch stays)
    SHRINK = "shrink"
    REQUEUE = "requeue"
    FAIL = "fail"
    #: Slurm ends this allocation and requeues the job itself: nothing for us to do
    SLURM_REQUEUES = "slurm_requeues"
    #: the supervisor found its own host cut off: it writes nothing, ends what it runs there, and
    #: leaves the job to Slurm
    STAND_DOWN = "stand_down"


#: causes that are a failure of the machine (counted by fault.max_failures and the rate cap)
FAILURE_CAUSES = frozenset(
    {
        Cause.FAILURE,
        Cause.TRANSIENT,
        Cause.HANG,
        Cause.NODE_FAILURE,
        Cause.NETWORK,
        Cause.LOST,
        Cause.WATCHDOG,
        Cause.PREFLIGHT,
        Cause.STARTUP,
    }
)
#: causes of a stop the run asked for or Slurm imposed: not failures
STOP_CAUSES = frozenset({Cause.TIME_LIMIT, Cause.PREEMPTION, Cause.SIGNAL})
#: causes that end the run: no budget, no retry
FINAL_CAUSES = (Cause.USER_ERROR, Cause.CANCELLED, Cause.BUDGET, Cause.PREFLIGHT_FAILED)
