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
from hpc_llm.rundir import epoch
from hpc_llm.rundir.record import read_results
from hpc_llm.slurm import allocation, parse
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
        #: the batch script started this supervisor again after the one before died (its status)
        self.restarted = int(world.environ().get(wire.SUPERVISOR_RESTARTS) or 0) > 0 and not self.taken_over_from
        self.died_status = world.environ().get(wire.SUPERVISOR_DIED)
        #: the generation of ranks running or next (0 at the allocation's start)
        self.gen = 0
        #: Slurm's stop signals as the handler queued them: (signal, when)
        self.signals: deque[tuple[str, float]] = deque()
        #: nodes that failed their own check and train all the same (no spare): warned once
        self.check_warned: set[str] = set()
        #: when the batch step got SIGTERM (0: it did not)
        self.terminated_at = 0.0
        #: slurmctld has shown this allocation preempted (a PreemptTime): a requeue that follows is
        #: the preemption's, at the end of its grace time, not another allocation's
        self.preempted = False
        self.timing = StopTiming(
            end=self.job.end,
            lead_s=policy.signal_lead_s,
            signal_lead_s=policy.signal_lead_s,
            ask=self.job_info if self.job.job_id else None,
        )
        #: how long an agent waits for this supervisor before giving it up (bounded by Slurm's
        #: SlurmdTimeout, asked once: hpc_llm.job.wire.supervisor_silent_s)
        conf = allocation.slurm_config() if self.job.job_id else {}
        slurmd = allocation.slurmd_timeout_s(conf) if self.job.job_id else None
        self.slurmd_timeout_s = float(slurmd or 300)
        self.message_timeout_s = float(parse.seconds_setting(conf, "MessageTimeout", 10))
        self.silent_s = wire.supervisor_silent_s(policy.heartbeat_s, policy.lease_s, slurmd)
        #: what this supervisor holds of the job (hpc_llm.rundir.epoch; None off Slurm)
        self.holder: epoch.Holder | None = None
        #: when slurmctld last answered this supervisor (monotonic): never, if it did not answer
        #: the question about this allocation just asked (a supervisor started again while its
        #: host was cut off wrote the record on the strength of its own start: seed 1461)
        answered = self.job.start is not None or not self.job.job_id
        self.ctld_seen = world.monotonic() if answered else float("-inf")
        #: slurmctld's last answer about this allocation ({}: none yet)
        self.ctld_info: dict[str, str] = {}
        self.agents = Agents(policy, command, self.job, self.silent_s, relaunch=relaunch, here=self.node)
        # a requeue asks for the size the job was allocated with, not the one it shrank to
        # (docs/design/verified/slurm.md, "A running job gives nodes back"): the batch script's
        # SLURM_JOB_NODELIST, which a supervisor started again after a give-back still has (the
        # simulator's seed 485: sized for 2, the requeued job asked for 3 and pended for good)
        self.agents.asked = max(self.agents.asked, len(allocation.hostnames(env.nodelist)))
        if self.taken_over_from:
            # the lost node gets no agent; the old agent step holds the others' CPUs (our own task)
            self.agents.left_out.add(self.taken_over_from)
            self.agents.overlap = True
        if self.restarted:
            # the dead supervisor's agent step may live on a while: the new one shares the CPUs
            self.agents.overlap = True

    @property
    def settings(self) -> Settings:
        """The policy's settings: the fields of :class:`Policy` it shares by name."""
        shared = {f.name: getattr(self.policy, f.name) for f in fields(Settings) if hasattr(self.policy, f.name)}
        return Settings(**shared, term_at_end_s=TERM_AT_END_S)

    def job_info(self, timeout: float = 10) -> dict[str, str]:
        """``scontrol show job`` of this allocation now ({} off Slurm, or unanswered). An answer
        renews :attr:`ctld_seen`."""
        if not self.job.job_id:
            return {}
        info = allocation.show_job(self.job.job_id, timeout=timeout)
        if info:
            self.ctld_seen = world.monotonic()
            self.ctld_info = info
            self.preempted = self.preempted or allocation.preempting(info)
        return info

    def requeued_elsewhere(self, info: dict[str, str]) -> str | None:
        """Why this allocation no longer holds the job, from slurmctld's answer ``info`` (None: it
        still does). A requeue Slurm made while it still waits for this host is no such reason:

        * a preemption's, at the end of the grace time: 22.05 shows the job PENDING at restart + 1
          while this allocation's processes run, and the next allocation cannot start before they
          have ended (CI saw a poll in that window end the supervisor of a run preempted in its
          post-train stage unbooked: test_post_train_stop);
        * a node failure's (no ``--no-kill``): Slurm waits for the batch host, which is up, to end
          its processes too.

        It is one when Slurm runs the job again, or found this very host dead (the simulator's
        seed 836: the batch host, healed from a partition after Slurm had called it DOWN and
        requeued the job, wrote the record of an allocation that no longer held the job)."""
        why = epoch.slurm_refusal_of(info, self.job.restart)
        if why is None or self.preempted or allocation.preempted_here(info):
            return None
        requeued = int(info.get("Restarts", "0") or 0) > self.job.restart
        if requeued and info.get("JobState") != "RUNNING" and allocation.node_gone(self.node) is False:
            return None
        return why

    @property
    def ctld_poll_s(self) -> float:
        """How often a generation asks slurmctld about the job, to know that it still can."""
        return max(1.0, self.slurmd_timeout_s / 6)

    @property
    def ctld_patience_s(self) -> float:
        """How long this supervisor goes on without an answer from slurmctld before it takes
        itself for cut off from it. slurmctld calls a node it cannot ping DOWN SlurmdTimeout after
        its last answer, which may be a ping interval (a third of it) before this supervisor's
        last: by half of SlurmdTimeout, and the lease, every rank here has stopped writing, before
        Slurm can have requeued the job elsewhere."""
        return max(self.slurmd_timeout_s / 2 - self.policy.lease_s, 3 * self.ctld_poll_s)

    def take_command(self) -> str | None:
        """Hold the job's epoch: claim command of this allocation (restart, 0), or adopt the claim
        the agent that started this supervisor made for it (a takeover: :data:`epoch.CLAIMED_ENV`).
        None when it holds it (or there is no job: a run off Slurm), else why not."""
        if not self.job.job_id:
            return None
        claimed = world.environ().get(epoch.CLAIMED_ENV)
        if claimed:
            holder = epoch.adopt(self.run_dir, self.job.job_id, claimed)
        elif self.restarted:
            # the batch script started this supervisor again: the dead one's command passes on
            try:
                now = epoch.current(self.run_dir, self.job.job_id)
            except OSError as exc:
                return f"the run's epoch cannot be read ({exc})"
            if now is not None and now.restart == self.job.restart:
                # only the batch script's own line of supervisors passes command on this way: an
                # agent that took the dead one's place holds it now (the simulator's seed 3201: the
                # restarted supervisor claimed over it, then stood down, and nobody trained)
                by = epoch.claimed_by(self.run_dir, self.job.job_id, now.restart, now.takeover)
                if by not in (None, self.node):
                    return f"epoch {now} holds the job (claimed by {by}, which took the dead supervisor's place)"
            takeover = now.takeover + 1 if now is not None and now.restart == self.job.restart else 0
            holder = epoch.claim(self.run_dir, self.job.job_id, self.job.restart, takeover, by=self.node)
        else:
            holder = epoch.claim(self.run_dir, self.job.job_id, self.job.restart, 0, by=self.node)
        if holder is None:
            try:
                now = epoch.current(self.run_dir, self.job.job_id)
            except OSError as exc:
                return f"the run's epoch cannot be read ({exc})"
            return f"epoch {now} holds the job"
        self.hold(holder)
        return None

    def hold(self, holder: epoch.Holder) -> None:
        holder.lease = self.ctld_lease
        self.holder = holder
        epoch.install(holder)

    def ctld_lease(self) -> str | None:
        """A supervisor writes the run's record only while slurmctld vouches for its allocation:
        one not heard from for :attr:`ctld_patience_s` is asked once more, and no answer is a
        refusal (:class:`epoch.Unanswered`). Why: a host cut off from slurmctld is called DOWN at
        SlurmdTimeout and the job requeued elsewhere, where the next allocation writes the same
        record; the simulator's seed 583 had a supervisor, its loop held up in a give-back,
        write ``results.json`` 40 s after Slurm had requeued its job. Its answer then, if it says
        the job was requeued, refuses too (:class:`epoch.Stale`)."""
        # A recent answer counts as it is: it may already say Slurm requeued the job (the
        # simulator's seed 836: a supervisor healed from a partition learnt it in the answer it
        # gathered its stop's facts with, then wrote the record on the strength of that answer's
        # freshness). A preemption's requeue is no such answer (requeued_elsewhere).
        if not self.job.job_id:
            return None
        if world.monotonic() - self.ctld_seen <= self.ctld_patience_s:
            return self.requeued_elsewhere(self.ctld_info) if self.ctld_info else None
        # asked patiently: one slow answer on a loaded controller must not stand a supervisor down
        info = self.job_info() or self.job_info()
        if not info:
            silent = world.monotonic() - self.ctld_seen
            return f"{epoch.UNANSWERED} for {silent:.0f} s: Slurm may have requeued the job elsewhere"
        return self.requeued_elsewhere(info)

    def stale(self) -> str | None:
        """Why this supervisor no longer holds the job (None: it does, or there is no job), from the
        run's epoch alone (no question to Slurm)."""
        return self.holder.refusal("command", lease=False) if self.holder is not None else None

    def status(self) -> str | None:
        """The run's status in results.json (None before there is one)."""
        results = read_results(self.run_dir)
        return str(results.get("status")) if results else None
