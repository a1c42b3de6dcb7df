"""One generation, from its start to its end, as the supervisor watches it.

:class:`GenerationRun` is the supervisor's loop for one generation of ranks: each turn it
handles what the fleet heard (a typed event each: :mod:`~hpc_llm.job.supervisor.fleet`), then
looks at the time. Before the generation starts it waits for enough warm agents (a spare lost
meanwhile is no stop); once it runs, a rank that ends badly, a node found dead, an agent gone
of its own error, a hang the heartbeats show (:mod:`~hpc_llm.job.supervisor.hang_watch`) or a
start-up that never reaches training ends the generation (the agents kill the rest). A stop
signal is passed on when :class:`~hpc_llm.job.supervisor.timing.StopTiming` says; a node an
operator drains, with a spare to take its place, is stopped for too. The loop ends when every
rank is gone, and returns a :class:`~hpc_llm.job.supervisor.generation.GenerationEnd`: what
the supervisor saw, for its decision. Stdlib only.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from hpc_llm import world
from hpc_llm.job import messages
from hpc_llm.job.supervisor import spares
from hpc_llm.job.supervisor.events import Cleared, Dead, FleetEvent, Heard, Suspect
from hpc_llm.job.supervisor.generation import Generation, GenerationEnd
from hpc_llm.job.supervisor.hang_watch import HangWatch
from hpc_llm.job.supervisor.stragglers import StragglerWatch, Verdict
from hpc_llm.rundir import epoch
from hpc_llm.rundir.outcome import Cause

if TYPE_CHECKING:
    from hpc_llm.job.supervisor.state import SupervisorState

log = logging.getLogger("hpc_llm.supervisor")

#: seconds between turns: checks of the generation, the heartbeats and pending signals
POLL_S = 0.2
#: how often a generation with a warm spare asks Slurm whether a node of it is being drained (one
#: sinfo for the generation's nodes)
DRAIN_POLL_S = 10.0
#: how often a generation looks for spares whose agent never started
SPARES_POLL_S = 5.0
#: seconds the agents get to report a killed generation's ranks gone before they count as lost
KILL_WAIT_S = 60.0


class GenerationRun:
    def __init__(self, sup: SupervisorState) -> None:
        self.sup = sup
        self.policy = p = sup.policy
        self.agents = sup.agents
        self.timing = sup.timing
        self.gen: Generation | None = None
        self.over = False
        self.started_at = 0.0
        self.killed_at: float | None = None
        self.drain_polled = world.monotonic()
        self.spares_checked = world.monotonic()
        self.ctld_polled = world.monotonic()
        self.watch = HangWatch(
            floor_s=p.hang_floor_s,
            factor=p.hang_factor,
            timeout_s=p.hang_timeout_s,
            silence_s=max(3 * p.heartbeat_s, p.hang_floor_s),
        )
        self.slow = StragglerWatch(p.straggler_factor, p.straggler_patience) if p.straggler_action else None

    def run(self) -> GenerationEnd:
        self.agents.ensure()
        assert self.agents.step is not None
        self.end = GenerationEnd(returncode=0, srun_errors=self.agents.step.errors)
        self.timing.pending = None
        while not self.over:
            for ev in self.agents.events(POLL_S):
                self.on_event(ev)
            self.turn(world.monotonic())
        return self.finish()

    # -- what the fleet heard --------------------------------------------------------------
    def on_event(self, ev: FleetEvent) -> None:
        # a node left out on purpose (a spare that failed its check, given back to Slurm, which
        # ends its agent): its agent's end is no news. Seen on the dev cluster: before the first
        # generation it was taken for an agent gone on a live node, and every warm agent was
        # started again
        ended = isinstance(ev, Dead) or (isinstance(ev, Heard) and isinstance(ev.msg, messages.Bye))
        if ended and ev.node in self.agents.left_out:
            return
        if self.gen is None:
            self.lost(ev)
        else:
            self.during(ev, self.gen)

    def lost(self, ev: FleetEvent) -> None:
        """A node found dead, an agent gone on a live node, or one that ended of its own error."""
        end = self.end
        match ev:
            case Dead(node=node, why=why, host_answers=True) if self.agents.host_answers(node) is not False:
                end.agents_died[node] = why
                end.detected_at = end.detected_at or world.time()
                log.error("hpc_llm supervisor: the agent on %s is gone, its node answers: %s", node, why)
            case Dead(node=node, why=why, host_answers=True):
                end.dead_nodes[node] = f"{why}; its slurmd does not answer either: the node is dead"
                end.detected_at = end.detected_at or world.time()
                log.error("hpc_llm supervisor: node %s is dead: %s", node, end.dead_nodes[node])
            case Dead(node=node, why=why, reached=True):
                end.dead_nodes[node] = f"{why}: the node is frozen"
                end.frozen.add(node)
                end.detected_at = end.detected_at or world.time()
                log.error("hpc_llm supervisor: node %s is frozen: %s", node, why)
            case Dead(node=node, why=why):
                end.dead_nodes[node] = why
                end.detected_at = end.detected_at or world.time()
                log.error("hpc_llm supervisor: node %s is dead or cut off: %s", node, why)
            case Heard(node=node, msg=messages.Bye(why=why) as bye) if not bye.on_purpose:
                end.agent_errors[node] = why
                end.detected_at = end.detected_at or world.time()
                log.error("hpc_llm supervisor: the agent on %s ended: %s", node, why)

    def during(self, ev: FleetEvent, gen: Generation) -> None:
        end = self.end
        match ev:
            case Dead(node=node) | Heard(node=node, msg=messages.Bye()) if node in gen.layout:
                self.lost(ev)
                if node in end.lost:
                    gen.lose(node, end.lost[node])
            case Dead(node=node, why=why) if node not in gen.layout:
                self.agents.lose_spare(node, f"its agent is gone: {why}")
            case Heard(node=node, msg=messages.Bye(why=why) as bye) if node not in gen.layout and not bye.on_purpose:
                self.agents.lose_spare(node, f"its agent ended: {why}")
            case Heard(node=node, msg=messages.Started(gen=number, pids=pids)) if number == gen.gen:
                gen.on_started(node, pids)
            case Heard(msg=messages.Exit() as msg) if msg.gen == gen.gen:
                e = gen.on_exit(msg)
                if e is not None and not e.killed and e.status not in (0, None):
                    end.detected_at = end.detected_at or e.at
                    log.error("hpc_llm supervisor: rank %d on %s: %s", e.rank, e.node, e.what)
            case Heard(node=node, msg=messages.Stopped(gen=number)) if number == gen.gen:
                gen.stopped.add(node)
            case Heard(node=node, msg=messages.Stalled(gap_s=gap_s)) if node in gen.layout:
                # its loop stalled past the lease (a frozen or starved node) and it ended its ranks
                end.hang = (f"the agent on {node} stalled for {gap_s}s (frozen?)", (node,))
                end.detected_at = end.detected_at or world.time()
            case Suspect(node=node, why=why):
                log.warning("hpc_llm supervisor: node %s %s", node, why)
            case Cleared(node=node):
                log.warning("hpc_llm supervisor: node %s answered: alive", node)

    # -- each turn -----------------------------------------------------------------------------
    def turn(self, now: float) -> None:
        if self.gen is None and self.sup.terminated_at:
            # Slurm ends the allocation before a generation started (a requeue after a node
            # failure, a cancel): its agents go with it; that is the stop, not their errors
            self.end.terminated = True
            self.end.detected_at = self.end.detected_at or world.time()
            self.over = True
            return
        if self.gen is None:
            if self.start_when_ready(now):
                return
        elif (self.end.lost or self.gen.failed() is not None) and not self.gen.killing:
            self.kill(now)
        self.take_signals()
        self.timing.tick(forwarded=self.end.stop is not None)
        self.poll_drain()
        self.stop_at_lead()
        self.forward()
        if self.over:
            return
        if self.sup.terminated_at and not self.end.terminated:
            self.end.terminated = True
            self.end.detected_at = self.end.detected_at or world.time()
        if self.gen is not None:
            self.watch_slurmctld(self.gen, now)
            self.watch_heartbeats(self.gen, now)
            self.watch_stragglers(self.gen)
            self.check_spares(now)
            self.check_gone(self.gen, now)

    def start_when_ready(self, now: float) -> bool:
        """Before the generation starts: start it once enough agents are warm; end the wait on a
        node lost with no spare left, an agent step gone, or a start-up past its limit. True when
        this turn is done."""
        end, p = self.end, self.policy
        detected = end.detected_at
        if end.lost and len(self.agents.warm_nodes()) >= self.agents.size:
            # a spare lost (or a node lost between generations) while enough warm agents are
            # left: no stop, the generation starts on the others
            log.warning("hpc_llm supervisor: lost %s; training on the warm agents left", end.lost)
            for node, why in end.lost.items():
                self.agents.lose_spare(node, why)
            self.agents.left_out |= set(end.lost)
            end.forget_lost()
            end.detected_at = detected
        self.leave_out_failed_checks()
        self.leave_out_never_started(now)
        self.never_warmed(now)
        step = self.agents.step
        assert step is not None
        usable = self.agents.usable()
        if self.agents.job.nodes and usable < p.least_nodes:
            # Slurm took nodes out of the job (a node failure, --no-kill) and no spare is left: no
            # generation can start here, however long it waits
            end.too_few = f"the allocation holds {usable} usable node(s) and the run needs {p.least_nodes}"
            self.over = True
        elif end.lost:
            self.over = True
        elif len(self.agents.warm_nodes()) >= self.agents.size and not self.waiting_for_here(now):
            self.gen = self.agents.start(self.sup.gen)
            self.started_at = world.monotonic()
        elif not step.running:
            end.returncode = step.wait() or 1
            end.agent_errors["*"] = f"the agent step ended before every agent was up (srun exited {end.returncode})"
            self.over = True
        elif p.startup_timeout_s is not None and now - (self.agents.since or now) > p.startup_timeout_s:
            ready = len(self.agents.warm_nodes())
            end.startup = f"the agents' start (container, srun or imports: {ready} of {self.agents.size} ready)"
            self.over = True
        return self.over or self.gen is not None

    def waiting_for_here(self, now: float) -> bool:
        """With spares, the first generation of an allocation waits for the agent of the
        supervisor's own node (the batch host) to be warm too, so that it trains (node rank 0)
        rather than waits as a spare. A batch host that is a spare cannot be given back (a job
        cannot let go of it); cut off, its supervisor lost every training node at once while they
        trained on (seen on the dev cluster under load: the batch host's agent warmed last, the
        generation started on the two others, and the cut supervisor blamed them both). Not past
        the patience a spare's start gets (:func:`spares.never_started`)."""
        agents, here = self.agents, self.agents.here
        if agents.layout or not here or here not in agents.job.nodes or here in agents.left_out:
            return False
        if agents.full_size() <= self.policy.nodes or agents.since is None:
            return False  # no spares: every node trains
        view = agents.fleet.view()
        if here in view and view[here].state == "warm":
            return False
        starts = [a.import_s for a in view.values() if a.import_s is not None]
        return now - agents.since <= spares.start_patience_s(starts)

    def leave_out_never_started(self, now: float) -> None:
        """A run that may go on with fewer nodes (``resources.min_nodes``) does not wait forever for
        a node whose agent never started (its srun task failed: seen on 24.11, a requeued job's
        step on a node killed under its first allocation found no job container there): once
        overdue as a spare would be (:func:`spares.never_started`), it is left out and given back,
        and the generation starts on the others, if they are at least ``min_nodes``."""
        agents, least = self.agents, self.policy.least_nodes
        if least >= self.policy.nodes or agents.since is None:
            return
        view = agents.fleet.view()
        starts = [a.import_s for a in view.values() if a.import_s is not None]
        held = [n for n in agents.job.nodes if n not in agents.left_out and n not in agents.layout]
        gone = spares.never_started(held, set(view), now - agents.since, starts)
        if gone and len(agents.job.nodes) - len(agents.left_out) - len(gone) >= least:
            for node in gone:
                agents.lose_spare(node, "its agent never started")

    def never_warmed(self, now: float) -> None:
        """An agent that said hello and then never warmed up, overdue as a spare's start would be
        (:func:`spares.start_patience_s`, once another agent has warmed): nothing judges an agent's
        silence while it imports, so a node lost then (dead, or cut off from this host) would hold
        the generation until the start-up limit (the simulator's seed 1140: an hour). It is lost
        as a node that stopped answering is, and the stop is decided on it."""
        agents, end = self.agents, self.end
        if agents.since is None:
            return
        view = agents.fleet.view()
        starts = [a.import_s for a in view.values() if a.import_s is not None]
        patience = spares.start_patience_s(starts)
        if not starts or now - agents.since <= patience:
            return
        for node, a in view.items():
            if a.state == "importing" and agents.serves(node) and node not in end.lost:
                end.dead_nodes[node] = f"its agent said hello and did not warm up in {patience:.0f} s"
                end.detected_at = end.detected_at or world.time()
                log.error("hpc_llm supervisor: node %s: %s", node, end.dead_nodes[node])

    def leave_out_failed_checks(self) -> None:
        """Nodes whose own checks failed, or whose compute figure is far under the others', are
        left out (and given back) before a generation starts: they never take a place. Not a node
        the run cannot do without (no spare for it): it trains, with a warning."""
        agents = self.agents
        view = agents.fleet.view()
        checks = {n: (a.gflops, a.failed) for n, a in view.items() if a.state == "warm" and n not in agents.left_out}
        for node, why in spares.failed_checks(checks, self.policy.straggler_factor).items():
            if node in agents.layout:
                continue  # it trains already: the straggler watch judges it from here on
            others = [n for n in agents.job.nodes if n not in agents.left_out and n != node]
            if len(others) >= self.policy.nodes:
                agents.lose_spare(node, why)
            elif node not in self.sup.check_warned:
                self.sup.check_warned.add(node)
                log.warning(
                    "hpc_llm supervisor: node %s failed its own check (%s); no spare for it: training on it", node, why
                )

    def take_signals(self) -> None:
        """Slurm's stop signals the handler queued: act first, ask after (:mod:`timing`)."""
        while self.sup.signals:
            self.timing.received(*self.sup.signals.popleft())

    def poll_drain(self) -> None:
        """Every :data:`DRAIN_POLL_S`, while nothing is pending: a node of the generation being
        drained, with spares for it, is stopped for (a save, then a swap)."""
        gen = self.gen
        if self.timing.pending is not None or gen is None or not gen.all_started or gen.killing:
            return
        if world.monotonic() - self.drain_polled < DRAIN_POLL_S:
            return
        self.end.draining = self.agents.draining_to_swap(gen)
        self.drain_polled = world.monotonic()  # after the call: a slow sinfo is not asked back to back
        if self.end.draining:
            self.timing.requested(f"SIG{self.policy.stop_signal}", Cause.DRAIN)

    def stop_at_lead(self) -> None:
        """Only the lead is left and Slurm's time-limit signal never came: stop all the same."""
        if self.timing.pending is None and self.policy.stop_signal and self.timing.time_is_up():
            log.warning(
                "hpc_llm supervisor: no time-limit signal from Slurm, %.0f s left: stopping", self.timing.lead_s
            )
            self.timing.requested(f"SIG{self.policy.stop_signal}", Cause.TIME_LIMIT)

    def forward(self) -> None:
        """The pending signal, when due, to every rank (before the generation started: the stop is
        this generation's end)."""
        pending, end, gen = self.timing.pending, self.end, self.gen
        if pending is None or end.stop is not None or not self.timing.due():
            return
        if gen is not None and (not gen.all_started or gen.killing):
            return
        end.stop, end.stop_time = pending.signal, pending.at
        end.detected_at = end.detected_at or world.time()
        if gen is None:
            self.over = True
            return
        left = f"; {self.timing.end - world.time():.0f} s before the end time" if self.timing.end else ""
        log.warning("hpc_llm supervisor: forwarding %s to the ranks (%s%s)", pending.signal, pending.cause, left)
        self.agents.signal(gen, pending.signal)

    def watch_slurmctld(self, gen: Generation, now: float) -> None:
        """Every :attr:`SupervisorState.ctld_poll_s`, ask slurmctld about the job: a generation
        trains only while this supervisor knows it still holds the allocation. Slurm requeued the
        job meanwhile (its restart count higher: this host was called DOWN behind a partition):
        another allocation will train, this one writes nothing more (:class:`epoch.Stale`). No
        answer for :attr:`SupervisorState.ctld_patience_s`: this host may be cut off from
        slurmctld, which would call it DOWN at SlurmdTimeout and requeue the job elsewhere, where
        a second copy of the run would write beside this one: the generation ends first."""
        sup = self.sup
        if not sup.job.job_id or gen.killing or now - self.ctld_polled < sup.ctld_poll_s:
            return
        self.ctld_polled = now
        info = sup.job_info(timeout=min(10.0, sup.ctld_patience_s / 3))
        if info:
            why = sup.requeued_elsewhere(info)
            if why is not None:
                raise epoch.Stale("training on", why)
            return
        silent = now - sup.ctld_seen
        if silent > sup.ctld_patience_s and self.end.ctld_lost is None:
            self.end.ctld_lost = f"slurmctld has not answered for {silent:.0f} s"
            log.error("hpc_llm supervisor: %s: ending generation %d", self.end.ctld_lost, gen.gen)
            self.kill(now)

    def watch_heartbeats(self, gen: Generation, now: float) -> None:
        """A hang (a silent rank, a stuck collective, a storage stall) or a start-up stuck in a
        phase ends the generation."""
        if not self.policy.recover or gen.killing:
            return
        end = self.end
        # a rank that has ended beats no more, and is not silent for it
        beats = {r: b for r, b in self.agents.fleet.beats().items() if b.gen == gen.gen and r not in gen.exits}
        hang = self.watch.check(beats, now)
        stuck = self.watch.startup_stuck(beats, now - self.started_at, gen.ntasks, self.policy.startup_timeout_s)
        if hang is not None and end.stop is None and not end.dead_nodes:
            if hang.cause == "storage":
                end.storage_stall = hang.reason
            else:
                end.hang = (hang.reason, hang.nodes)
            log.error("hpc_llm supervisor: %s; ending generation %d", hang.reason, gen.gen)
            self.kill(now)
        elif stuck is not None and end.stop is None:
            end.startup = stuck
            log.error("hpc_llm supervisor: start-up stuck in %s; ending generation %d", stuck, gen.gen)
            self.kill(now)

    def watch_stragglers(self, gen: Generation) -> None:
        """A node slower than the others (:mod:`~hpc_llm.job.supervisor.stragglers`): recorded;
        with ``straggler.action=swap`` and a warm spare, the ranks save and the spare takes its
        place (as for a drain); with ``exclude``, or no spare, the next requeue leaves it out."""
        if self.slow is None or not gen.all_started or gen.killing:
            return
        beats = {r: b for r, b in self.agents.fleet.beats().items() if b.gen == gen.gen and r not in gen.exits}
        verdict = self.slow.observe(beats, gen.expected)
        if verdict is not None:
            self.on_straggler(verdict, max((b.batch for b in beats.values()), default=-1))

    def on_straggler(self, verdict: Verdict, batch: int) -> None:
        asked = self.policy.straggler_action
        can_swap = (
            asked == "swap"
            and self.policy.stop_signal is not None
            and self.timing.pending is None
            and len(self.agents.spares()) > len(self.end.slow)
        )
        action = "swap" if can_swap else "warn" if asked == "warn" else "exclude"
        self.end.stragglers.append({**verdict.as_record(), "action": action, "batch": batch, "at": world.time()})
        figures = ", ".join(f"{n} {s:.3f}" for n, s in sorted(verdict.busy_s.items()))
        then = {
            "swap": "saving, then swapping in a spare",
            "exclude": "leaving it out at the next requeue" + (" (no spare left)" if asked == "swap" else ""),
            "warn": "straggler.action=warn",
        }[action]
        log.warning(
            "hpc_llm supervisor: node %s is slow: busy %.1fx the other nodes' median per batch (s: %s); %s",
            verdict.node,
            verdict.ratio,
            figures,
            then,
        )
        if action == "swap":
            self.end.slow = (*self.end.slow, verdict.node)
            self.timing.requested(f"SIG{self.policy.stop_signal}", Cause.STRAGGLER)

    def check_spares(self, now: float) -> None:
        """Every :data:`SPARES_POLL_S`: a spare whose agent never started is given up (and back)."""
        if now - self.spares_checked < SPARES_POLL_S or self.agents.since is None:
            return
        self.spares_checked = now
        view = self.agents.fleet.view()
        starts = [a.import_s for a in view.values() if a.import_s is not None]
        held = self.agents.spares_held()
        for node in spares.never_started(held, set(view), now - self.agents.since, starts):
            self.agents.lose_spare(node, "its agent never started")
        self.leave_out_failed_checks()

    def check_gone(self, gen: Generation, now: float) -> None:
        """Every rank is gone, the agent step with them, or the agents never said so after a kill."""
        step = self.agents.step
        assert step is not None
        if gen.done:
            self.over = True
        elif not step.running:
            # the whole agent step is gone (Slurm killed it: a node failure, a cancel, the limit)
            for node in gen.layout:
                if node not in gen.stopped:
                    gen.lose(node, "the agent step ended")
            self.over = True
        elif self.killed_at is not None and now - self.killed_at > KILL_WAIT_S:
            for node in gen.layout:
                if node not in gen.stopped:
                    gen.lose(node, f"its ranks were not gone {KILL_WAIT_S:g}s after the kill")
            self.over = True

    def kill(self, now: float) -> None:
        """End the generation now: every agent kills its ranks' process groups."""
        assert self.gen is not None
        self.end.detected_at = self.end.detected_at or world.time()
        self.agents.kill(self.gen, set(self.end.lost))
        self.killed_at = now

    def finish(self) -> GenerationEnd:
        end, gen, pending = self.end, self.gen, self.timing.pending
        if pending is not None:
            end.stop_cause, end.stop_cause_asked = pending.cause, pending.asked
        if gen is not None:
            end.returncode = gen.returncode() or end.returncode
            end.rank_exits = gen.ended_badly()
            end.stopped_at = world.time()
        end.top_batch, end.heartbeat_train_s = self.watch.top_batch, self.watch.train_s
        return end
