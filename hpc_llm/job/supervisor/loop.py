"""The job's supervisor: runs the ranks through the node agents, watches them, decides what each stop means.

The batch script ``exec``s it on the batch host::

    python -m hpc_llm.job.supervisor --run-dir DIR [policy] -- srun <args> python -m hpc_llm.job.agent <payload>

It is the batch step's main process, so Slurm's ``--signal=B:USR2@lead``
reaches it (the batch script ignores that signal until then: a signal that
comes before is never fatal). Once per allocation it starts the agent step
(the command after ``--``: one agent per node, :mod:`hpc_llm.job.agent`) and
listens for the agents (:mod:`hpc_llm.job.supervisor.fleet`). Then, one
generation of ranks after another (:mod:`hpc_llm.job.supervisor.generation`):

* it tells every agent to start its node's ranks of generation G (node rank,
  layout, a fresh rendezvous port): a fork of a warm process, not a cold start;
* it passes the stop signal on to every rank through the agents, telling a
  time-limit signal from a preemption by the job's end time;
* it watches: a rank that exits badly ends the generation at once (the agents
  kill the rest); a node whose agent is silent and does not answer a probe is
  dead (never a hang, and its bystanders are never blamed); the ranks'
  heartbeats name a frozen rank, a stuck collective (no batch for k x the
  run's median step) or a storage stall (:mod:`hpc_llm.job.supervisor.hang_watch`);
* when the generation has ended, it gathers the facts, asks the fault policy
  (:func:`hpc_llm.job.supervisor.policy.decide`, pure) and carries the
  decision out: done; fail; restart in place (generation G+1 on the same warm
  agents, or a new agent step if one is gone); requeue (the records first,
  SIGTERM ignored, with the blamed nodes excluded). Each cause has its budget.

A Slurm requeue it did not ask for leaves the last attempt "running" in
attempts.json; the next start closes it as lost. The rest lives beside it:
:mod:`~hpc_llm.job.supervisor.agent_step` (the srun agent step),
:mod:`~hpc_llm.job.supervisor.options` (the policy the batch script passes),
:mod:`~hpc_llm.job.supervisor.lost` (booking an allocation that ended unrecorded),
:mod:`~hpc_llm.job.supervisor.slurm_job` (asking Slurm about this
allocation, requeueing it). In-job side, but stdlib only: no training stack
on the batch host.
"""

from __future__ import annotations

import logging
import os
import secrets
import signal
import sys
import time
from collections import deque
from dataclasses import fields
from pathlib import Path
from typing import Any

from hpc_llm.job import failures, heartbeat, messages, wire
from hpc_llm.job.env import JobEnv
from hpc_llm.job.supervisor import lost, policy, slurm_job
from hpc_llm.job.supervisor.agent_step import Step, for_nodes, rendered_nodes
from hpc_llm.job.supervisor.fleet import Cleared, Dead, Fleet, FleetEvent, Heard, Suspect
from hpc_llm.job.supervisor.generation import Generation, GenerationEnd
from hpc_llm.job.supervisor.hang_watch import HangWatch
from hpc_llm.job.supervisor.options import Policy, parse_args
from hpc_llm.job.supervisor.slurm_job import SlurmJob
from hpc_llm.ports import PORT_BASE, PORT_SPAN
from hpc_llm.rundir.record import Attempt, Attempts, update_results

log = logging.getLogger("hpc_llm.supervisor")

#: seconds between checks of the generation, the heartbeats and pending signals
POLL_S = 0.2
#: a B: signal this close to the time limit (beyond the lead) is the time-limit one
#: (Slurm may send it up to a minute early)
TIME_LIMIT_SLACK_S = 60.0
#: the stop lead: this many times the longest checkpoint save, plus a margin to exit
LEAD_SAVES = 2.0
#: a SIGTERM this close to the end time is Slurm's time limit, not a cancellation
TERM_AT_END_S = 5.0
LEAD_MARGIN_S = 30.0
#: seconds between re-reads of the job's end time while a generation runs
END_REFRESH_S = 60.0
#: how often a generation with a warm spare asks Slurm whether a node of it is being drained (one
#: sinfo for the generation's nodes)
DRAIN_POLL_S = 10.0
#: seconds between tries to learn from slurmctld why a stop signal came, while it does not answer
ASK_AGAIN_S = 10.0
#: seconds the agents get to report a killed generation's ranks gone before they count as lost
KILL_WAIT_S = 60.0
#: seconds the agents get to clean up and exit at the end of the allocation
END_WAIT_S = 15.0
#: seconds to wait for node rank 0's agent to name a free rendezvous port
PORT_WAIT_S = 10.0


class Supervisor:
    def __init__(self, policy: Policy, command: list[str]) -> None:
        self.policy = policy
        self.command = command
        self.run_dir = policy.run_dir
        self.job = SlurmJob.current()
        self.step = 0
        self._signals: deque[tuple[str, float]] = deque()
        self._terminated = False
        self._terminated_at = 0.0
        #: seconds before the time limit the ranks are told to save (<= the sbatch --signal lead)
        self.lead_s = policy.signal_lead_s
        self.token = secrets.token_hex(16)
        self.fleet: Fleet | None = None
        self.agent_step: Step | None = None
        self._agents_since: float | None = None
        #: the nodes the ranks run on, in node-rank order
        self.layout: list[str] = []
        self._drain_noted: set[str] = set()
        #: nodes of this allocation a swap left out (their places taken by spares): never used again here
        self.left_out: set[str] = set()
        #: fleet events read while waiting for something else, for the generation's loop
        self._held: list[FleetEvent] = []

    def _lead(self, attempts: Attempts) -> float:
        """How long before the time limit to stop: twice the longest save measured so far (a
        periodic save's time includes any eval at that batch) plus 30 s to exit. Not capped by
        the sbatch --signal lead: when the need is longer, the supervisor stops the ranks itself
        at the lead (:meth:`_time_is_up`) and records a warning to raise signal_lead_s."""
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
            update_results(self.run_dir, attempts, _read_status(self.run_dir) or "running", {"warnings": [warning]})
        return need

    # -- the loop ------------------------------------------------------------
    def run(self) -> int:
        self._install_handlers()
        attempts = Attempts.load(self.run_dir)
        lost.close(self.run_dir, self.job, attempts)
        early = self._already_completed()
        if early is not None:
            self._end_for_good()
            return early
        self.lead_s = self._lead(attempts)
        self._missed_preemption()
        heartbeat.clear(self.run_dir)
        self.fleet = self.new_fleet()
        try:
            while True:
                end = self.run_generation()
                decision = self.decide(end)
                if decision is not None:
                    return decision
                self.step += 1
        finally:
            self._end_agents()

    def _install_handlers(self) -> None:
        def on_stop(signum: int, frame: Any) -> None:
            self._signals.append((signal.Signals(signum).name, time.time()))

        def on_term(signum: int, frame: Any) -> None:
            if not self._terminated:
                self._terminated, self._terminated_at = True, time.time()

        if self.policy.stop_signal:
            signal.signal(getattr(signal, f"SIG{self.policy.stop_signal}"), on_stop)
        signal.signal(signal.SIGTERM, on_term)

    def _missed_preemption(self) -> None:
        """The batch script ignores the stop signal until this process has its handler (a
        signal then cannot end the job unrecorded); a preemption signalled in that window is
        still known to Slurm (a PreemptTime): take it as received now. A time-limit signal lost
        there is covered by :meth:`_time_is_up`."""
        if self.policy.stop_signal and self.job.job_id and slurm_job.preempting(self._job_info()):
            log.warning("hpc_llm supervisor: the job was being preempted before the supervisor started")
            self._signals.append((f"SIG{self.policy.stop_signal}", time.time()))

    def _already_completed(self) -> int | None:
        """A run that already completed has nothing to do. Budgets are the policy's, counted
        per stop (failures in a row without progress), so a resubmitted failed run goes on."""
        if _read_status(self.run_dir) == "completed":
            log.warning("hpc_llm supervisor: the run already completed; nothing to do")
            return 0
        return None

    # -- the agents ----------------------------------------------------------------
    def new_fleet(self) -> Fleet:
        """A listening fleet for this allocation's agents, its I/O thread started."""
        p = self.policy
        fleet = Fleet(
            self.token,
            beat_s=p.heartbeat_s,
            node_timeout_s=p.node_timeout_s,
            probe_timeout_s=p.probe_timeout_s,
            lease_s=p.lease_s,
        )
        fleet.start()
        return fleet

    def _agent_env(self) -> dict[str, str]:
        env = dict(os.environ)
        assert self.fleet is not None
        host = env.get("MASTER_ADDR") or "127.0.0.1"
        env[wire.SUPERVISOR] = f"{host}:{self.fleet.port}"
        env[wire.TOKEN] = self.token
        env[wire.LEASE_S] = f"{self.policy.lease_s:g}"
        full = self._full_size()
        if self.job.ref and self.policy.recover and full > self.policy.nodes:
            # submitted with spares (even if fewer are left): a --no-kill job outlives its batch
            # host; the agents requeue it then
            env[wire.REQUEUE_ON_LOSS] = f"{self.policy.nodes},{full},{self.policy.tasks_per_node}"
        env["HPC_LLM_HEARTBEAT_S"] = f"{self.policy.heartbeat_s:g}"
        return env

    def _full_size(self) -> int:
        """The nodes the run was submitted with, spares included (its allocation may be fewer)."""
        return rendered_nodes(self.command) or len(self.job.nodes)

    def _ensure_agents(self) -> None:
        """The agent step runs, and every agent in it is alive; else a new agent step (a cold
        start: an agent gone of its own error, or the first generation)."""
        assert self.fleet is not None
        alive = [a for a in self.fleet.view().values() if a.alive]
        if self.agent_step is not None and self.agent_step.running and len(alive) >= self.policy.nodes:
            return
        if self.agent_step is not None:
            self._end_agents()
            self.fleet.close()
            self.fleet = self.new_fleet()
        self.agent_step = Step(for_nodes(self.command, self.job.nodes, self.left_out), self._agent_env())
        self._agents_since = time.monotonic()

    def _end_agents(self) -> None:
        """The allocation is done: tell the agents (they clean their scratch and exit), then end
        the agent step, by srun's own abort if it has not ended by then."""
        if self.fleet is not None:
            for node, a in self.fleet.view().items():
                if a.alive:
                    self.fleet.send(node, messages.End())
        step, self.agent_step = self.agent_step, None
        if step is not None and step.running and step.wait(timeout=END_WAIT_S) is None:
            step.kill()

    def _warm_nodes(self) -> list[str]:
        """The warm agents' nodes this allocation may train on, in the allocation's node order."""
        assert self.fleet is not None
        view = self.fleet.view()
        warm = (n for n, a in view.items() if a.state == "warm" and n not in self.left_out)
        return sorted(warm, key=lambda n: view[n].node_id)

    def _drain_to_swap(self, gen: Generation) -> tuple[str, ...]:
        """Nodes of ``gen`` an operator drains, when warm spares can take all their places (the
        generation then stops with a save and the next one runs without them); else nothing: the
        drain waits for the job to end, as Slurm's does."""
        spares = self._spares()
        if not self.job.job_id or not self.policy.stop_signal or not spares:
            return ()
        found = set(slurm_job.draining([*gen.layout, *spares]) or ())
        if drained_spares := found & set(spares):
            # a spare being drained takes no node's place: it would only be drained from again
            log.warning("hpc_llm supervisor: spare(s) %s draining: not swapped in", ",".join(sorted(drained_spares)))
            self.left_out |= drained_spares
            spares = self._spares()
        draining = [n for n in gen.layout if n in found and n not in self.left_out]
        if not draining:
            return ()
        if len(draining) > len(spares):
            if set(draining) != self._drain_noted:
                self._drain_noted = set(draining)
                log.warning("hpc_llm supervisor: %s draining; too few spares to swap", ",".join(draining))
            return ()
        log.warning("hpc_llm supervisor: %s draining: saving, then swapping in spares", ",".join(draining))
        return tuple(sorted(draining))

    def _spares(self) -> tuple[str, ...]:
        """Warm agents outside the generation's layout (resources.spare_nodes): a swap's candidates."""
        return tuple(n for n in self._warm_nodes() if n not in self.layout)

    def _start_generation(self) -> Generation:
        """Generation ``self.step`` on the warm agents: node ranks kept from the last generation,
        a spare in the place of a node gone (:func:`next_layout`)."""
        assert self.fleet is not None
        view = self.fleet.view()
        self.layout = next_layout(self.layout, self._warm_nodes(), self.policy.nodes)
        master = self.layout[0]
        self.fleet.send(master, messages.FindPort(self.step))
        port = None
        deadline = time.monotonic() + PORT_WAIT_S
        held: list[FleetEvent] = []
        while port is None and time.monotonic() < deadline:
            for ev in self.fleet.events(timeout=0.05):
                match ev:
                    case Heard(msg=messages.PortFound(gen=self.step, port=found)):
                        port = found
                    case _:
                        held.append(ev)
        self._held = held
        gen = Generation(self.step, {n: i for i, n in enumerate(self.layout)}, self.policy.tasks_per_node)
        env = JobEnv.current().for_step(
            self.step, self.layout, self.job.start, self.policy.heartbeat_s if self.policy.recover else None
        )
        ours = {k: v for k, v in env.items() if k.startswith("HPC_LLM_")}
        for node_rank, node in enumerate(self.layout):
            self.fleet.send(
                node,
                messages.Start(
                    gen=self.step,
                    node_rank=node_rank,
                    nnodes=len(self.layout),
                    tasks_per_node=self.policy.tasks_per_node,
                    master_addr=view[master].addr,
                    master_port=port or slurm_port(self.job.job_id, self.job.restart, self.step),
                    env=ours,
                ),
            )
        log.info(
            "hpc_llm supervisor: generation %d on %s (rendezvous %s:%s)",
            self.step,
            ",".join(self.layout),
            view[master].addr,
            port,
        )
        return gen

    # -- one generation ---------------------------------------------------------------
    def run_generation(self) -> GenerationEnd:
        assert self.fleet is not None
        self._ensure_agents()
        assert self.agent_step is not None
        end = GenerationEnd(returncode=0, srun_errors=self.agent_step.errors)
        p = self.policy
        gen: Generation | None = None
        self._held = []
        watch = HangWatch(
            floor_s=p.hang_floor_s,
            factor=p.hang_factor,
            timeout_s=p.hang_timeout_s,
            silence_s=max(3 * p.heartbeat_s, p.hang_floor_s),
        )
        gen_started = 0.0
        killed_at: float | None = None
        refreshed = drain_polled = time.monotonic()
        pending: tuple[str, float] | None = None
        ask_at: float | None = None  # when to ask slurmctld why the pending signal came
        forward_at = 0.0
        while True:
            events = self._held + self.fleet.events(timeout=POLL_S)
            self._held = []
            now = time.monotonic()
            if gen is None:
                detected = end.detected_at
                for ev in events:
                    self._before_start(ev, end)
                if (end.dead_nodes or end.agent_errors) and len(self._warm_nodes()) >= p.nodes:
                    # a spare lost (or a node lost between generations) while enough warm agents
                    # are left: no stop, the generation starts on the others
                    lost = {**end.dead_nodes, **end.agent_errors}
                    log.warning("hpc_llm supervisor: lost %s; training on the warm agents left", lost)
                    self.left_out |= set(lost)
                    end.dead_nodes.clear()
                    end.agent_errors.clear()
                    end.detected_at = detected
                if end.dead_nodes or end.agent_errors:
                    break
                if len(self._warm_nodes()) >= p.nodes:
                    gen = self._start_generation()
                    gen_started = time.monotonic()
                    continue
                if not self.agent_step.running:
                    end.returncode = self.agent_step.wait() or 1
                    end.agent_errors["*"] = (
                        f"the agent step ended before every agent was up (srun exited {end.returncode})"
                    )
                    break
                waited = now - (self._agents_since or now)
                if p.startup_timeout_s is not None and waited > p.startup_timeout_s:
                    ready = len(self._warm_nodes())
                    end.startup = f"the agents' start (container, srun or imports: {ready} of {p.nodes} ready)"
                    break
            else:
                for ev in events:
                    self._during(ev, gen, end)
                if (end.dead_nodes or end.agent_errors or gen.failed() is not None) and not gen.killing:
                    self._kill(gen, end)
                    killed_at = now
            while self._signals:
                # act first, ask after: a signal far from the end time we know is passed on at
                # once (a preemption's grace time runs); slurmctld is asked only once it is
                # (or, near the end, to hold it back until the lead), so a slow one cannot hold it
                pending = self._signals.popleft()
                end.stop_cause, end.stop_cause_asked = self._cached_cause(pending[1]), False
                forward_at = self._forward_at(pending[1], end.stop_cause)
                ask_at = time.monotonic()
            if (
                pending
                and ask_at is not None
                and time.monotonic() >= ask_at
                and (end.stop is not None or end.stop_cause == "time_limit")
            ):
                cause = self._signal_cause(pending[1])
                if cause is None:
                    # slurmctld did not answer (a loaded one can take the whole 10 s timeout): keep
                    # the guess and ask again, not every poll; never call it a signal sent by hand.
                    # Hold it back only once Slurm says it is the time limit: a preemption held
                    # past its grace time is killed unsaved, a time limit passed on early only
                    # saves a little sooner (seen under load in the 1-minute time-limit test)
                    ask_at = time.monotonic() + ASK_AGAIN_S
                    if end.stop is None:
                        forward_at = pending[1]
                else:
                    ask_at, end.stop_cause, end.stop_cause_asked = None, cause, True
                    if end.stop is None:
                        forward_at = self._forward_at(pending[1], end.stop_cause)
            if self.job.job_id and time.monotonic() - refreshed >= END_REFRESH_S:
                # `scontrol update TimeLimit=` moves the end: the stop lead counts from the new one
                refreshed = time.monotonic()
                self.job.end = slurm_job.slurm_time(self._job_info().get("EndTime")) or self.job.end
                if pending is not None and end.stop is None and end.stop_cause == "time_limit":
                    forward_at = self._forward_at(pending[1], "time_limit")
            if (
                pending is None
                and gen is not None
                and gen.all_started
                and not gen.killing
                and time.monotonic() - drain_polled >= DRAIN_POLL_S
            ):
                end.draining = self._drain_to_swap(gen)
                drain_polled = time.monotonic()  # after the call: a slow sinfo is not asked back to back
                if end.draining:
                    pending = (f"SIG{self.policy.stop_signal}", time.time())
                    end.stop_cause, end.stop_cause_asked, forward_at = policy.DRAIN, True, pending[1]
            if pending is None and self._time_is_up():
                log.warning("hpc_llm supervisor: no time-limit signal from Slurm, %.0f s left: stopping", self.lead_s)
                pending = (f"SIG{self.policy.stop_signal}", time.time())
                end.stop_cause, end.stop_cause_asked, forward_at = "time_limit", True, pending[1]
            if pending and end.stop is None and time.time() >= forward_at:
                if gen is None:
                    # nothing started to save: the stop is this generation's end
                    end.stop, end.stop_time = pending[0], pending[1]
                    end.detected_at = end.detected_at or time.time()
                    break
                if gen.all_started and not gen.killing:
                    end.stop, end.stop_time = pending[0], pending[1]
                    end.detected_at = end.detected_at or time.time()
                    log.warning(
                        "hpc_llm supervisor: forwarding %s to the ranks (%s%s)",
                        pending[0],
                        end.stop_cause,
                        f"; {self.job.end - time.time():.0f} s before the end time" if self.job.end else "",
                    )
                    for node in gen.layout:
                        self.fleet.send(node, messages.Signal(gen.gen, pending[0]))
            if self._terminated and not end.terminated:
                end.terminated = True
                end.detected_at = end.detected_at or time.time()
            if gen is not None and p.recover and not gen.killing:
                # a rank that has ended beats no more, and is not silent for it
                beats = {r: b for r, b in self.fleet.beats().items() if b.gen == gen.gen and r not in gen.exits}
                hang = watch.check(beats, now)
                stuck = watch.startup_stuck(beats, now - gen_started, gen.ntasks, p.startup_timeout_s)
                if hang is not None and end.stop is None and not end.dead_nodes:
                    if hang.cause == "storage":
                        end.storage_stall = hang.reason
                    else:
                        end.hang = (hang.reason, hang.nodes)
                    log.error("hpc_llm supervisor: %s; ending generation %d", hang.reason, gen.gen)
                    self._kill(gen, end)
                    killed_at = now
                elif stuck is not None and end.stop is None:
                    end.startup = stuck
                    log.error("hpc_llm supervisor: start-up stuck in %s; ending generation %d", stuck, gen.gen)
                    self._kill(gen, end)
                    killed_at = now
            if gen is not None and gen.done:
                break
            if gen is not None and not self.agent_step.running:
                # the whole agent step is gone (Slurm killed it: a node failure, a cancel, the limit)
                for node in gen.layout:
                    if node not in gen.stopped:
                        gen.lose(node, "the agent step ended")
                break
            if gen is not None and killed_at is not None and now - killed_at > KILL_WAIT_S:
                for node in gen.layout:
                    if node not in gen.stopped:
                        gen.lose(node, f"its ranks were not gone {KILL_WAIT_S:g}s after the kill")
                break
        if gen is not None:
            end.returncode = gen.returncode() or end.returncode
            end.task_errors = gen.task_errors()
            end.stopped_at = time.time()
        end.top_batch, end.heartbeat_train_s = watch.top_batch, watch.train_s
        return end

    def _before_start(self, ev: FleetEvent, end: GenerationEnd) -> None:
        match ev:
            case Dead(node=node, why=why):
                end.dead_nodes[node] = why
                end.detected_at = end.detected_at or time.time()
                log.error("hpc_llm supervisor: node %s is dead: %s", node, why)
            case Heard(node=node, msg=messages.Bye(why=why) as bye) if not bye.on_purpose:
                end.agent_errors[node] = why
                end.detected_at = end.detected_at or time.time()
                log.error("hpc_llm supervisor: the agent on %s ended: %s", node, why)

    def _during(self, ev: FleetEvent, gen: Generation, end: GenerationEnd) -> None:
        match ev:
            case Dead(node=node) | Heard(node=node, msg=messages.Bye()) if node in gen.layout:
                self._before_start(ev, end)
                if node in end.dead_nodes or node in end.agent_errors:
                    gen.lose(node, end.dead_nodes.get(node) or end.agent_errors[node])
            case Heard(node=node, msg=messages.Started(gen=gen.gen, pids=pids)):
                gen.on_started(node, pids)
            case Heard(msg=messages.Exit(gen=gen.gen) as msg):
                e = gen.on_exit(msg)
                if e is not None and not e.killed and e.status not in (0, None):
                    end.detected_at = end.detected_at or e.at
                    log.error("hpc_llm supervisor: rank %d on %s: %s", e.rank, e.node, e.what)
            case Heard(node=node, msg=messages.Stopped(gen=gen.gen)):
                gen.stopped.add(node)
            case Heard(node=node, msg=messages.Stalled(gap_s=gap_s)) if node in gen.layout:
                # its loop stalled past the lease (a frozen or starved node) and it ended its ranks
                end.hang = (f"the agent on {node} stalled for {gap_s}s (frozen?)", (node,))
                end.detected_at = end.detected_at or time.time()
            case Suspect(node=node, why=why):
                log.warning("hpc_llm supervisor: node %s %s", node, why)
            case Cleared(node=node):
                log.warning("hpc_llm supervisor: node %s answered: alive", node)

    def _kill(self, gen: Generation, end: GenerationEnd) -> None:
        """End generation ``gen`` now: every agent kills its ranks' process groups."""
        assert self.fleet is not None
        gen.killing = True
        end.detected_at = end.detected_at or time.time()
        for node in gen.layout:
            if node in end.dead_nodes or node in end.agent_errors:
                continue
            self.fleet.send(node, messages.Kill(gen.gen))

    # -- what the end of a generation means ---------------------------------------------
    def decide(self, end: GenerationEnd) -> int | None:
        """Record what happened and act: an exit code, or None to run the next generation. The
        decision is the fault policy's (:func:`hpc_llm.job.supervisor.policy.decide`); this
        gathers its facts and carries it out."""
        attempts = Attempts.load(self.run_dir)
        if end.returncode == 0 and not self.policy.recover and not attempts.items:
            # a Hydra app other than hpc_llm's task keeps no attempts: its step's exit code is all
            return 0
        a = self._this_attempt(attempts)
        # rank 0 notes progress every few seconds; the heartbeats saw the generation's last batches
        if end.top_batch > a.last_batch:
            a.last_batch, a.train_s = end.top_batch, max(a.train_s, round(end.heartbeat_train_s, 3))
        a.detected_at = a.detected_at or end.detected_at
        a.stopped_at = a.stopped_at or end.stopped_at
        facts = self._facts(end)
        earlier = [f for f in failures.read_all(self.run_dir) if f not in facts.failures]
        history = [x for x in attempts.items if x is not a]
        if len(self.job.nodes) > len(a.nodes):
            a.alloc_nodes = len(self.job.nodes)  # spares included: allocated node-seconds (goodput)
        decision = policy.decide(history, a, facts, self.settings, earlier)
        return self._act(attempts, a, decision)

    def _facts(self, end: GenerationEnd) -> policy.Stop:
        """The facts of this stop the policy decides on: Slurm is asked again (the end time moves
        with ``scontrol update TimeLimit``; a PreemptTime says a preemption's grace time runs)."""
        if (
            end.stop is not None
            and end.stop_time is not None
            and (not end.stop_cause_asked or end.stop_cause == "signal")
        ):
            # the ranks have saved: there is time now to learn what the signal was. "signal" (sent by
            # hand) is asked again too: the time-limit warning for a shortened limit can arrive before
            # a query shows the new EndTime (seen on the dev cluster right after `scontrol update`)
            for _ in range(3):
                cause = self._signal_cause(end.stop_time)
                if cause is not None:
                    end.stop_cause, end.stop_cause_asked = cause, True
                    break
                time.sleep(2)
        info = self._job_info() if (end.returncode != 0 or end.terminated) else {}
        # the end time as last read while the generation ran (every minute: a shortened limit is in
        # it); not the one Slurm shows now, which a cancellation sets to the moment of the cancel
        end_time = self.job.end
        if info.get("JobState") == "TIMEOUT" and self._terminated_at:
            end_time = self._terminated_at
        preempting = slurm_job.preempting(info)
        sigterm_at = self._terminated_at if end.terminated else None
        requeueing = None
        at_end = sigterm_at is not None and end_time is not None and sigterm_at >= end_time - TERM_AT_END_S
        if sigterm_at is not None and end.stop is None and not at_end and self.job.job_id:
            # a node of the job died (NODE_FAIL), or a preemption's grace time ended before our own
            # requeue (PREEMPTED), and Slurm requeues the job itself: its SIGTERM reaches the batch
            # host. Not a cancellation, and not ours to requeue again.
            requeueing = slurm_job.requeued_by_slurm(self.job.job_id, self.job.restart)
        tag = f"{self.job.job_id or 'local'}.{self.job.restart}.{self.step}"
        _srun_tasks, failed_nodes = failures.parse_srun_errors(end.srun_errors)
        # srun's error lines pile up over the agent step's life: a node swapped out earlier is no
        # cause of this stop (it would have blamed a node already gone, and requeued for it)
        failed_nodes = [n for n in failed_nodes if n not in self.left_out]
        return policy.Stop(
            returncode=end.returncode,
            now=time.time(),
            stop_cause=end.stop_cause if end.stop else None,
            sigterm_at=sigterm_at,
            end_time=end_time,
            preempting=preempting,
            slurm_requeueing=requeueing,
            hang=end.hang,
            storage_stall=end.storage_stall,
            self_stall=self._self_stall(),
            startup=end.startup,
            failures=tuple(failures.read(self.run_dir, tag)),
            task_errors=tuple(end.task_errors),
            failed_nodes=tuple(failed_nodes),
            dead_nodes=tuple(sorted(end.dead_nodes.items())),
            agent_errors=tuple(sorted(end.agent_errors.items())),
            on_slurm=self.job.ref is not None,
            spares=self._spares(),
            draining=end.draining if end.stop_cause == policy.DRAIN else (),
        )

    def _self_stall(self) -> str | None:
        """This process went without a ping for longer than its agents wait for one (its host
        frozen, or starved): they have ended their ranks, and every node would look dead."""
        gap = self.fleet.take_stall() if self.fleet is not None else 0.0
        if gap <= wire.supervisor_silent_s(self.policy.heartbeat_s, self.policy.lease_s):
            return None
        why = f"the supervisor's own loop stalled for {gap:.1f} s (its host frozen?), longer than its agents wait"
        log.error("hpc_llm supervisor: %s", why)
        return why

    @property
    def settings(self) -> policy.Settings:
        """The policy's settings: the fields of :class:`Policy` it shares by name."""
        shared = {f.name: getattr(self.policy, f.name) for f in fields(policy.Settings) if hasattr(self.policy, f.name)}
        return policy.Settings(**shared, term_at_end_s=TERM_AT_END_S)

    def _act(self, attempts: Attempts, a: Attempt, d: policy.Decision) -> int | None:
        """Record the decision, then carry it out (records first: a requeue SIGTERMs this job)."""
        if d.action == "done":
            if a.alloc_nodes > len(a.nodes):
                # rank 0 wrote the completed record; the spares' node-seconds go in beside it
                attempts.save()
                update_results(self.run_dir, attempts, _read_status(self.run_dir) or "completed", {})
            self._end_for_good()
            return 0
        if d.action == "slurm_requeues":
            # the attempt stays "running"; the next start closes it from accounting (lost.close)
            a.state, a.ended_at = "running", None
            attempts.save()
            log.warning("hpc_llm supervisor: %s; not recording a failure", d.reason)
            return 0
        a.state = d.state
        a.ended_at = a.ended_at or time.time()
        a.decided_at = a.decided_at or time.time()
        a.cause = d.cause
        if a.state != "stopped" or d.action == "fail":
            a.error = d.reason  # a stop that saved keeps what rank 0 said (usually nothing)
        a.suspects = sorted(set(d.suspects))
        if d.action == "fail":
            self._fail(attempts, a, d.cause, d.reason)
            return 1
        if d.action == "restart":
            a.action = "restart"
            attempts.save()
            update_results(self.run_dir, attempts, "restarting", {"error": d.reason})
            log.warning("hpc_llm supervisor: %s; restarting the step in this allocation", d.reason)
            if d.delay_s:
                time.sleep(d.delay_s)  # a stop signal meanwhile is queued and handled by the next step
            return None
        if d.action == "swap":
            self._swap(attempts, a, d)
            return None
        return self._requeue(attempts, a, d)

    def _swap(self, attempts: Attempts, a: Attempt, d: policy.Decision) -> None:
        """The next generation runs without ``d.swap_out``: spares take their node ranks
        (:func:`next_layout`), in this allocation, with no requeue. A
        left-out node's agent, if it still answers, is told to end; the node stays in the job
        (draining it needs operator rights) and is recorded with the evidence (suspects, error)."""
        assert self.fleet is not None
        a.action, a.left_out = "swap", list(d.swap_out)
        attempts.save()
        self.left_out |= set(d.swap_out)
        view = self.fleet.view()
        for node in d.swap_out:
            if node in view and view[node].alive:
                self.fleet.send(node, messages.End())
        update_results(self.run_dir, attempts, "restarting", {"error": d.reason})
        log.warning("hpc_llm supervisor: %s; swapping in a spare for %s", d.reason, ",".join(d.swap_out))

    def _forward_at(self, received: float, cause: str) -> float:
        """When to pass a stop signal on: a preemption at once; the time-limit signal once the
        time left is the lead this run needs (Slurm's --signal lead may be longer than that)."""
        if self.job.end is None or cause != "time_limit":
            return received
        return max(received, self.job.end - self.lead_s)

    def _time_is_up(self) -> bool:
        """Only the stop lead is left and Slurm's time-limit signal never came (seen on the dev
        cluster with 1-minute limits: the attempt ran into its limit unsaved; likely sent by
        slurmctld's 30 s check before the batch step existed). The end time is read again
        first: ``scontrol update TimeLimit`` moves it."""
        if not self.policy.stop_signal or self.job.end is None or time.time() < self.job.end - self.lead_s:
            return False
        self.job.end = slurm_job.slurm_time(self._job_info().get("EndTime")) or self.job.end
        return time.time() >= self.job.end - self.lead_s

    def _cached_cause(self, when: float) -> str:
        """Why the signal came, from what is known without asking Slurm: near the end time we
        have, the time limit; otherwise a preemption (or a signal sent by hand: Slurm says which)."""
        end_time = self.job.end
        if end_time is not None and when >= end_time - self.policy.signal_lead_s - TIME_LIMIT_SLACK_S:
            return "time_limit"
        return "preemption"

    def _signal_cause(self, when: float) -> str | None:
        """Why Slurm sent the stop signal: while a preemption's grace time runs, ``scontrol show
        job`` has a PreemptTime (verified on 22.05, docs/design.md); otherwise a signal near the
        end time is the time-limit one, and anything else someone sent (``scancel --signal``).
        None when slurmctld did not answer."""
        info = self._job_info()
        if self.job.job_id and not info:
            return None
        if slurm_job.preempting(info):
            return "preemption"
        end_time = self.job.end = slurm_job.slurm_time(info.get("EndTime")) or self.job.end
        if end_time is not None and when >= end_time - self.policy.signal_lead_s - TIME_LIMIT_SLACK_S:
            return "time_limit"
        return "signal"

    def _job_info(self) -> dict[str, str]:
        """``scontrol show job`` of this allocation now ({} off Slurm)."""
        return slurm_job.scontrol_show_job(self.job.job_id) if self.job.job_id else {}

    # -- acting -------------------------------------------------------------------
    def _this_attempt(self, attempts: Attempts) -> Attempt:
        for a in reversed(attempts.items):
            if (a.job_id, a.restart, a.step) == (self.job.job_id, self.job.restart, self.step):
                return a
        # rank 0 never got far enough to open one: the supervisor does
        a = Attempt(
            job_id=self.job.job_id,
            restart=self.job.restart,
            started_at=time.time(),
            step=self.step,
            nodes=list(self.job.nodes),
            alloc_started_at=self.job.start,
        )
        if attempts.items:
            a.resumed_at_batch = a.last_batch = attempts.items[-1].last_batch
        attempts.items.append(a)
        return a

    def _fail(self, attempts: Attempts, a: Attempt | None, cause: str, reason: str) -> None:
        if a is not None:
            a.cause, a.action, a.error = cause, "fail", reason
            a.decided_at = a.decided_at or time.time()
            a.ended_at = a.ended_at or time.time()
            if a.state == "running":
                a.state = "failed"
        attempts.save()
        update_results(self.run_dir, attempts, "failed", {"error": reason})
        log.error("hpc_llm supervisor: the run failed: %s", reason)
        self._end_for_good()

    def _end_for_good(self) -> None:
        """The job ends now and must stay ended: after a preemption Slurm >= 24.05 would requeue
        it once more (slurm_job.ending_for_good)."""
        err = slurm_job.ending_for_good(str(self.job.ref)) if self.job.ref else None
        if err:
            log.warning("hpc_llm supervisor: could not set Requeue=0 (%s): Slurm may start the job once more", err)

    def _requeue(self, attempts: Attempts, a: Attempt, d: policy.Decision) -> int:
        exclude, warning = self._exclusions(attempts, d)
        a.action, a.requeued = "requeue", True
        a.decided_at = a.decided_at or time.time()
        if warning:
            a.error = f"{a.error or d.cause}; {warning}"
        attempts.save()
        update_results(self.run_dir, attempts, "requeued", {"error": a.error, "excluded_nodes": exclude or None})
        # records first; the requeue sends this very job SIGTERM, which we must outlive
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        change = sorted(exclude) != sorted(self.job.excluded)
        # Slurm >= 24.05 in a preemption's grace time: ending the batch script is the requeue
        # (slurm_job.requeued_by_ending); a new ExcNodeList needs the job pending, so not then
        by_ending = not change and slurm_job.requeued_by_ending(self.job.job_id, self.job.partition)
        out = None if by_ending else slurm_job.requeue_job(str(self.job.ref))
        if out is not None:
            a.requeued, a.action = False, "fail"
            self._fail(
                attempts, a, d.cause, f"scontrol requeue {self.job.ref} failed: {out}; last stop: {a.error or d.cause}"
            )
            return 1
        if a.signal_time:
            a.signal_to_requeue_s = round(time.time() - a.signal_time, 3)
        sized = None
        if not by_ending:
            full = self._full_size()
            sized = slurm_job.fit_partition(
                len(self.job.nodes) or full, full, self.policy.nodes, exclude, self.job.partition
            )
        if change or sized:
            err = slurm_job.update_pending(
                str(self.job.ref),
                exclude=exclude if change else None,
                nodes=sized[0] if sized else None,
                per_node=self.policy.tasks_per_node,
            )
            if err:
                a.error = f"{a.error or d.cause}; could not update the requeued job ({err})"
            elif sized:
                a.error = f"{a.error or d.cause}; {sized[1]}"
        if d.cause == "node_failure":
            # a dead node still holds the job COMPLETING: not again before Slurm has let it go
            # and cleaned up (slurm_job.REQUEUE_DELAY_SINCE)
            err = slurm_job.hold_if_dead_node_lingers(str(self.job.ref))
            if err:
                log.warning("hpc_llm supervisor: could not hold the requeued job: %s", err)
        attempts.save()
        update_results(self.run_dir, attempts, "requeued", {"error": a.error, "excluded_nodes": exclude or None})
        log.warning(
            "hpc_llm supervisor: %s; requeued%s",
            a.error or d.cause,
            f", excluding {','.join(exclude)}" if exclude else "",
        )
        return 0

    def _exclusions(self, attempts: Attempts, d: policy.Decision) -> tuple[list[str], str | None]:
        """The next allocation's ExcNodeList: the user's own exclusions plus the nodes whose blame
        is in force (d.exclude; forgiven nodes come back), never so many that the nodes up in the
        partition cannot hold the run. Returns it and, when it had to stop excluding, why."""
        ours = {n for x in attempts.items for n in x.suspects}
        users = {n for n in self.job.excluded if n not in ours}
        wanted = sorted(users | set(d.exclude))
        up = slurm_job.nodes_up(self.job.partition)
        if up and len([n for n in up if n not in wanted]) < self.policy.nodes:
            dropped = sorted(set(wanted) - users)
            warning = (
                f"not excluding {','.join(dropped)}: only {len([n for n in up if n not in users])} node(s) of "
                f"partition {self.job.partition} are up and the run needs {self.policy.nodes}"
            )
            log.warning("hpc_llm supervisor: %s", warning)
            return sorted(users), warning
        return wanted, None


def next_layout(layout: list[str], warm: list[str], nodes: int) -> list[str]:
    """The next generation's nodes in node-rank order: each node of ``layout`` still warm keeps
    its node rank, and a spare (the first warm node outside it, in allocation order) takes the
    rank of each one gone; the first generation takes the first ``nodes`` warm ones. A restart in
    place then stays on its nodes, whichever agent warmed first."""
    spares = [n for n in warm if n not in layout]
    if len(layout) != nodes:
        return warm[:nodes]
    return [n if n in warm else spares.pop(0) for n in layout]


def slurm_port(job_id: str | None, restart: int, gen: int) -> int:
    """A rendezvous port for generation ``gen`` of allocation ``restart`` that every rank agrees
    on without talking, when node rank 0's agent did not name a free one in time: a new one for
    every generation, so a rank of an earlier one still holding its port never meets this one."""
    digits = "".join(c for c in job_id or "" if c.isdigit())
    return PORT_BASE + (int(digits or 0) * 131 + restart * 17 + gen) % PORT_SPAN


def _read_status(run_dir: Path) -> str | None:
    from hpc_llm.rundir.record import read_results

    results = read_results(run_dir)
    return str(results.get("status")) if results else None


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s: %(message)s")
    policy, command = parse_args(sys.argv[1:] if argv is None else argv)
    if not command:
        raise SystemExit("hpc_llm.job.supervisor: nothing to run after --")
    try:
        code = Supervisor(policy, command).run()
    except Exception as exc:  # a bug here must still leave a record, not a run stuck "interrupted"
        log.exception("hpc_llm supervisor failed")
        attempts = Attempts.load(policy.run_dir)
        update_results(
            policy.run_dir, attempts, "failed", {"error": f"hpc_llm supervisor: {type(exc).__name__}: {exc}"}
        )
        code = 1
    raise SystemExit(code)
