"""What the supervisor holds for its allocation, and what it knows: the state its concerns share.

:class:`SupervisorState` is what :mod:`~hpc_llm.job.supervisor.watch`,
:mod:`~hpc_llm.job.supervisor.facts` and :mod:`~hpc_llm.job.supervisor.act` read and change;
:class:`hpc_llm.job.supervisor.main.Supervisor` adds the loop that runs them. Stdlib only.
"""

from __future__ import annotations

from collections import deque
from dataclasses import fields

from hpc_llm import world
from hpc_llm.job import heartbeat, wire
from hpc_llm.job.env import JobEnv
from hpc_llm.job.supervisor.agents import Agents
from hpc_llm.job.supervisor.options import Policy
from hpc_llm.job.supervisor.stop import Settings
from hpc_llm.job.supervisor.timing import StopTiming
from hpc_llm.rundir.layout import RunDir
from hpc_llm.rundir.record import read_results
from hpc_llm.slurm import allocation
from hpc_llm.slurm.allocation import SlurmJob

#: a SIGTERM this close to the end time is Slurm's time limit, not a cancellation
TERM_AT_END_S = 5.0


class SupervisorState:
    def __init__(self, policy: Policy, command: list[str], relaunch: list[str] | None = None) -> None:
        self.policy = policy
        self.command = command
        self.run_dir = policy.run_dir
        env = JobEnv.current()
        self.job = SlurmJob.ask(env.job_id, env.ref, env.restart, env.nodelist)
        #: the batch host, or the node of the agent that took over: this process's own node
        self.node = heartbeat.node_name()
        #: the node whose supervisor this one replaced in this allocation (None: the batch script's)
        self.taken_over_from = world.environ().get(wire.TAKEN_OVER_FROM) or None
        #: the generation of ranks running or next (0 at the allocation's start)
        self.gen = 0
        #: Slurm's stop signals as the handler queued them: (signal, when)
        self.signals: deque[tuple[str, float]] = deque()
        #: nodes that failed their own check and train all the same (no spare): warned once
        self.check_warned: set[str] = set()
        #: when the batch step got SIGTERM (0: it did not)
        self.terminated_at = 0.0
        self.timing = StopTiming(
            end=self.job.end,
            lead_s=policy.signal_lead_s,
            signal_lead_s=policy.signal_lead_s,
            ask=self.job_info if self.job.job_id else None,
        )
        #: how long an agent waits for this supervisor before giving it up (bounded by Slurm's
        #: SlurmdTimeout, asked once: hpc_llm.job.wire.supervisor_silent_s)
        slurmd = allocation.slurmd_timeout_s(allocation.slurm_config()) if self.job.job_id else None
        self.slurmd_timeout_s = float(slurmd or 300)
        self.silent_s = wire.supervisor_silent_s(policy.heartbeat_s, policy.lease_s, slurmd)
        self.agents = Agents(policy, command, self.job, self.silent_s, relaunch=relaunch, here=self.node)
        if self.taken_over_from:
            # the lost node gets no agent; the old agent step holds the others' CPUs (our own task)
            self.agents.left_out.add(self.taken_over_from)
            self.agents.overlap = True

    @property
    def settings(self) -> Settings:
        """The policy's settings: the fields of :class:`Policy` it shares by name."""
        shared = {f.name: getattr(self.policy, f.name) for f in fields(Settings) if hasattr(self.policy, f.name)}
        return Settings(**shared, term_at_end_s=TERM_AT_END_S)

    def job_info(self) -> dict[str, str]:
        """``scontrol show job`` of this allocation now ({} off Slurm, or unanswered)."""
        return allocation.show_job(self.job.job_id) if self.job.job_id else {}

    def superseded(self) -> bool:
        """The job runs a newer allocation than this one: Slurm requeued it and started it again
        while this supervisor could not see it (its host cut off, or frozen, and back). Such a
        supervisor writes nothing: the next one writes. Not when the requeued job only waits in
        the queue (Slurm's own requeue at a preemption's end, say: this supervisor is still the
        last to know its attempt), nor when slurmctld does not answer. Also when an agent took its
        place in this allocation (:meth:`taken_over`)."""
        if self.taken_over():
            return True  # its host was lost, and is back
        info = self.job_info()
        newer = int(info.get("Restarts", "0") or 0) > self.job.restart
        return bool(info) and newer and info.get("JobState") in ("RUNNING", "CONFIGURING")

    def taken_over(self) -> bool:
        """An agent took this supervisor's place in this allocation (hpc_llm.job.agent.takeover):
        its claim names this node."""
        return RunDir(self.run_dir).takeover_claim(str(self.job.job_id), self.job.restart, self.node).exists()

    def status(self) -> str | None:
        """The run's status in results.json (None before there is one)."""
        results = read_results(self.run_dir)
        return str(results.get("status")) if results else None
