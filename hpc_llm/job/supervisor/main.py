"""The job's supervisor: runs the ranks through the node agents, watches them, decides what each stop means.

The batch script ``exec``s it on the batch host::

    python -m hpc_llm.job.supervisor --run-dir DIR [policy] -- srun <args> python -m hpc_llm.job.agent <payload>

It is the batch step's main process, so Slurm's ``--signal=B:USR2@lead`` reaches it (the batch
script ignores that signal until then: a signal that comes before is never fatal). With spares,
an agent execs the same command line in its place when the batch host is lost
(:mod:`hpc_llm.job.agent.takeover`): that supervisor books the lost generation, runs the next
ones without the host, and cancels its job at the end (:func:`end_taken_over`). Once per
allocation it starts the agent step (the command after ``--``: one agent per node,
:mod:`hpc_llm.job.agent`), then runs one generation of ranks after another:

1. **watch** a generation (:mod:`~hpc_llm.job.supervisor.watch`): start it on the warm agents
   (:mod:`~hpc_llm.job.supervisor.agents`), pass Slurm's stop signal on when
   :mod:`~hpc_llm.job.supervisor.timing` says, and end it when a rank fails, a node dies or the
   heartbeats show a hang;
2. **decide**: gather the facts of its end (:mod:`~hpc_llm.job.supervisor.facts`) and ask the
   fault policy (:func:`hpc_llm.job.supervisor.policy.decide`, pure);
3. **act** (:mod:`~hpc_llm.job.supervisor.act`): done; fail; restart in place (the next
   generation on the same warm agents, or a new agent step if one is gone); swap in spares;
   requeue (the records first, SIGTERM ignored, the blamed nodes excluded).

A Slurm requeue it did not ask for leaves the last attempt "running" in attempts.json; the next
start closes it as lost (:mod:`~hpc_llm.job.supervisor.lost`). In-job side, but stdlib only: no
training stack on the batch host.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import sys
from typing import Any

from hpc_llm import world
from hpc_llm.job import failures, heartbeat, wire
from hpc_llm.job.env import JobEnv
from hpc_llm.job.supervisor import act, facts, lost, policy
from hpc_llm.job.supervisor.generation import GenerationEnd
from hpc_llm.job.supervisor.options import parse_args
from hpc_llm.job.supervisor.state import SupervisorState
from hpc_llm.job.supervisor.watch import GenerationRun
from hpc_llm.rundir import epoch
from hpc_llm.rundir.layout import RunDir
from hpc_llm.rundir.record import Attempt, Attempts, update_results
from hpc_llm.slurm import allocation, query
from hpc_llm.slurm.commands import SlurmUnreachable

log = logging.getLogger("hpc_llm.supervisor")

#: the stop lead: this many times the longest checkpoint save, plus a margin to exit
LEAD_SAVES = 2.0
LEAD_MARGIN_S = 30.0


class Supervisor(SupervisorState):
    # -- the loop: watch a generation, decide, act ------------------------------------------
    def run(self) -> int:
        self._install_handlers()
        why = self.take_command()
        if why is not None:
            return act.stand_aside(self, why)
        try:
            while True:
                try:
                    return self._run()
                except epoch.Unanswered as exc:
                    # a write refused before any decision (booking an earlier attempt, the start):
                    # slurmctld does not vouch for this allocation; wait as a stand-down does, and
                    # with command back start over from the record
                    done = act.unanswered(self, exc.why)
                    if done != act.RESUME:
                        return int(done)
        except epoch.Stale as exc:
            # a write or a change to Slurm was refused: another process holds the job now
            return act.stand_aside(self, exc.why)
        finally:
            self.agents.end()

    def _run(self) -> int:
        attempts = Attempts.load(self.run_dir)
        lost.close(self.run_dir, self.job, attempts)
        if self.taken_over_from:
            self.gen = lost.taken_over(self.run_dir, self.job, attempts, self.taken_over_from)
        elif self.restarted:
            self.gen = lost.supervisor_died(self.job, attempts, self.died_status)
        if self.status() == "completed":
            # a run that already completed has nothing to do. Budgets are the policy's, counted
            # per stop (failures in a row without progress), so a resubmitted failed run goes on
            log.warning("hpc_llm supervisor: the run already completed; nothing to do")
            self.agents.close()
            act.end_for_good(self)
            return 0
        self.timing.lead_s = self._lead(attempts)
        self._missed_preemption()
        heartbeat.clear(self.run_dir)
        while True:
            decision = self.decide(GenerationRun(self).run())
            if decision is not None:
                return decision
            self.gen += 1

    def decide(self, end: GenerationEnd) -> int | None:
        """Record what happened and act: an exit code, or None to run the next generation. The
        decision is the fault policy's (:func:`hpc_llm.job.supervisor.policy.decide`); this
        gathers its facts and carries it out. A supervisor that stood down and has command back
        decides the same stop again, with what Slurm says now."""
        while True:
            try:
                done = self._decide(end)
            except epoch.Unanswered as exc:
                # a write refused: slurmctld no longer vouches for this allocation
                done = act.unanswered(self, exc.why)
            if done != act.RESUME:
                return done if isinstance(done, int) or done is None else None
            # slurmctld answers again: what the stand-down was decided on is the past
            end.ctld_answered = True

    def _decide(self, end: GenerationEnd) -> int | str | None:
        attempts = Attempts.load(self.run_dir)
        if end.returncode == 0 and not self.policy.recover and not attempts.items:
            # a Hydra app other than hpc_llm's task keeps no attempts: its ranks' exit code is all
            return 0
        a = self.this_attempt(attempts)
        # rank 0 notes progress every few seconds; the heartbeats saw the generation's last batches
        if end.top_batch > a.last_batch:
            a.last_batch, a.train_s = end.top_batch, max(a.train_s, round(end.heartbeat_train_s, 3))
        a.detected_at = a.detected_at or end.detected_at
        a.stragglers.extend(end.stragglers)
        a.stopped_at = a.stopped_at or end.stopped_at
        stop = facts.gather(self, end)
        earlier = [f for f in failures.read_all(self.run_dir) if f not in stop.failures]
        history = [x for x in attempts.items if x is not a]
        if len(self.job.nodes) > len(a.nodes):
            a.alloc_nodes = len(self.job.nodes)  # spares included: allocated node-seconds (goodput)
        decision = policy.decide(history, a, stop, self.settings, earlier)
        return act.act(self, attempts, a, decision)

    def this_attempt(self, attempts: Attempts) -> Attempt:
        """This generation's attempt, as rank 0 opened it; the supervisor opens it when rank 0
        never got that far."""
        for a in reversed(attempts.items):
            if (a.job_id, a.restart, a.generation) == (self.job.job_id, self.job.restart, self.gen):
                return a
        a = Attempt(
            job_id=self.job.job_id,
            restart=self.job.restart,
            started_at=world.time(),
            generation=self.gen,
            nodes=list(self.job.nodes),
            alloc_started_at=self.job.start,
        )
        if attempts.items:
            a.resumed_at_batch = a.last_batch = attempts.items[-1].last_batch
        attempts.items.append(a)
        return a

    # -- at the start --------------------------------------------------------------------------
    def _install_handlers(self) -> None:
        def on_stop(signum: int, frame: Any) -> None:
            self.signals.append((signal.Signals(signum).name, world.time()))

        def on_term(signum: int, frame: Any) -> None:
            self.terminated_at = self.terminated_at or world.time()

        if self.policy.stop_signal:
            world.on_signal(getattr(signal, f"SIG{self.policy.stop_signal}"), on_stop)
        world.on_signal(signal.SIGTERM, on_term)

    def _missed_preemption(self) -> None:
        """The batch script ignores the stop signal until this process has its handler (a
        signal then cannot end the job unrecorded); a preemption signalled in that window is
        still known to Slurm (a PreemptTime): take it as received now. A time-limit signal lost
        there is covered by :meth:`StopTiming.time_is_up`."""
        if self.policy.stop_signal and self.job.job_id and allocation.preempting(self.job_info()):
            log.warning("hpc_llm supervisor: the job was being preempted before the supervisor started")
            self.signals.append((f"SIG{self.policy.stop_signal}", world.time()))

    def _lead(self, attempts: Attempts) -> float:
        """How long before the time limit to stop: twice the longest save measured so far (a
        periodic save's time includes any eval at that batch) plus 30 s to exit. Not capped by
        the sbatch --signal lead: when the need is longer, the supervisor stops the ranks itself
        at the lead (:meth:`StopTiming.time_is_up`) and records a warning to raise signal_lead_s."""
        if self.policy.stop_lead_s is not None:
            return self.policy.stop_lead_s
        saves = [s for a in attempts.items for s in (a.save_s, a.checkpoint_save_s) if s is not None]
        if not saves:
            return self.policy.signal_lead_s
        need = LEAD_SAVES * max(saves) + LEAD_MARGIN_S
        if need > self.policy.signal_lead_s:
            warning = (
                f"hydra.launcher.signal_lead_s={self.policy.signal_lead_s:g} is shorter than a stop needs: "
                f"checkpoints took up to {max(saves):.0f}s; stopping {need:.0f}s before the limit instead"
            )
            log.warning("hpc_llm supervisor: %s", warning)
            update_results(self.run_dir, attempts, self.status() or "running", {"warnings": [warning]})
        return need


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s: %(message)s")
    args = sys.argv[1:] if argv is None else argv
    policy, command = parse_args(args)
    if not command:
        raise SystemExit("hpc_llm.job.supervisor: nothing to run after --")
    if world.environ().get(wire.TAKEN_OVER_FROM):
        # this supervisor runs in a step of its own (hpc_llm.job.agent.takeover), whose srun may
        # die before it: its output goes to its own file, not through srun
        job = JobEnv.current()
        world.redirect_output(RunDir(policy.run_dir).takeover_log(str(job.ref), job.restart, heartbeat.node_name()))
    sup = None
    try:
        sup = Supervisor(policy, command, relaunch=[sys.executable, "-u", "-m", "hpc_llm.job.supervisor", *args])
        code = sup.run()
    except Exception as exc:  # a bug here must still leave a record, not a run stuck "interrupted"
        log.exception("hpc_llm supervisor failed")
        error = f"hpc_llm supervisor: {type(exc).__name__}: {exc}"
        with contextlib.suppress(epoch.Refused):
            update_results(policy.run_dir, Attempts.load(policy.run_dir), "failed", {"error": error})
        code = 1
    if sup is not None and sup.taken_over_from:
        end_taken_over(sup)
    raise SystemExit(code)


def end_taken_over(sup: Supervisor) -> None:
    """A supervisor that took over has no batch script whose end ends the job: Slurm would keep
    it RUNNING to its time limit. Unless the job moved on (requeued, or ended), cancel it: the
    record says how the run ended. Not when another process holds the job now (an agent took
    this one's place in turn).

    slurmctld is asked again until it answers, however long that takes: a ``scontrol show job``
    that timed out on a busy controller once left the job RUNNING to its time limit (CI, 2-core
    machine), with nothing left that would ever end it. This process is the job's owner: it is
    the one that must end it."""
    if sup.stale() is not None or not sup.job.job_id:
        return
    while True:
        info = sup.job_info()
        if info and not allocation.still_this_allocation(info, sup.job.restart):
            return  # requeued or ended: Slurm has it
        if info:
            log.warning(
                "hpc_llm supervisor: ending job %s (its batch script was lost with %s)",
                sup.job.ref,
                sup.taken_over_from,
            )
            sys.stdout.flush()
            sys.stderr.flush()
            try:
                with epoch.acting("cancelling the job (its batch script is gone)"):
                    query.cancel([str(sup.job.ref)])
                return
            except SlurmUnreachable as exc:
                why = f"scancel: {exc}"
            except epoch.Refused as exc:
                if sup.stale() is not None:
                    return  # another process holds the job now: it ends it
                why = exc.why
        else:
            why = "slurmctld did not answer scontrol show job"
        log.warning("hpc_llm supervisor: %s; asking again", why)
        world.sleep(3)
