"""The allocation's agents as the supervisor drives them: the agent step, the fleet, the layout.

:class:`Agents` owns the one srun step that runs an agent per node
(:mod:`~hpc_llm.job.supervisor.agent_step`), the fleet that hears them
(:mod:`~hpc_llm.job.supervisor.fleet`), the nodes the ranks run on in node-rank order and the
nodes left out of this allocation. It starts a generation on the warm agents (node rank 0's
agent names a free rendezvous port; a spare takes a lost node's place:
:func:`next_layout`), passes a stop signal or a kill to a generation, swaps nodes out, and ends
the agents with the allocation. Stdlib only.
"""

from __future__ import annotations

import json
import logging
import secrets

from hpc_llm import world
from hpc_llm.config.ports import PORT_BASE, PORT_SPAN
from hpc_llm.job import messages, wire
from hpc_llm.job.env import JobEnv
from hpc_llm.job.supervisor.agent_step import Step, for_nodes, rendered_nodes
from hpc_llm.job.supervisor.events import FleetEvent, Heard
from hpc_llm.job.supervisor.fleet import Fleet
from hpc_llm.job.supervisor.generation import Generation
from hpc_llm.job.supervisor.options import Policy
from hpc_llm.rundir import epoch, spare_record
from hpc_llm.slurm import allocation, requeue
from hpc_llm.slurm.allocation import SlurmJob

log = logging.getLogger("hpc_llm.supervisor")

#: seconds the agents get to clean up and exit at the end of the allocation
END_WAIT_S = 15.0
#: seconds to wait for node rank 0's agent to name a free rendezvous port
PORT_WAIT_S = 10.0


class Agents:
    def __init__(
        self,
        policy: Policy,
        command: list[str],
        job: SlurmJob,
        silent_s: float | None = None,
        relaunch: list[str] | None = None,
        here: str | None = None,
    ) -> None:
        self.policy = policy
        #: the supervisor's own command line and node, for an agent to take its place (with spares)
        self.relaunch, self.here = relaunch, here
        #: start agent steps with ``srun --overlap`` (a supervisor that took over runs in a step)
        self.overlap = False
        #: how long the agents wait for the supervisor (told in their environment)
        self.silent_s = silent_s
        self.command = command
        self.job = job
        #: the nodes the job asked for, as allocated: a requeue asks for as many again, however
        #: many it gave back since (verified on 24.11: NumNodes back to 3 after a shrink to 2)
        self.asked = len(job.nodes)
        self.token = secrets.token_hex(16)
        self.fleet = self.new_fleet()
        self.step: Step | None = None
        #: when the agent step started (monotonic): the agents' start-up is timed from it
        self.since: float | None = None
        #: the nodes the ranks run on, in node-rank order
        self.layout: list[str] = []
        #: spares that took a place in the current generation (new in its layout)
        self.joined: tuple[str, ...] = ()
        #: nodes of this allocation left out (a swap, a spare or node lost): never used again here
        self.left_out: set[str] = set()
        self._drain_noted: set[str] = set()
        #: spares lost (their agent died or never started: hpc_llm.job.supervisor.spares), and why
        self.lost_spares: dict[str, str] = {}
        #: nodes this allocation gave back to Slurm
        self.given_back: list[str] = []
        #: fleet events read while waiting for something else, for the generation's loop
        self._held: list[FleetEvent] = []
        #: where each node's slurmd listens: a host whose agent is gone but whose slurmd answers
        #: is alive (asked once; {} off Slurm)
        self.slurmd = allocation.slurmd_addresses(job.nodes) if job.job_id else {}

    # -- the fleet and the agent step --------------------------------------------------------
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

    def events(self, timeout: float) -> list[FleetEvent]:
        """What the fleet heard: the events held back first, then up to ``timeout`` of new ones."""
        held, self._held = self._held, []
        return held + self.fleet.events(timeout=timeout)

    def ensure(self) -> None:
        """The agent step runs, and every agent in it is alive; else a new agent step (a cold
        start: an agent gone of its own error, or the first generation)."""
        if self.step is not None and self.step.running:
            # only agents of nodes still in the job count: one whose node Slurm took out of it
            # (killed while it imported: nothing judges an agent's silence before it is warm)
            # would hold the generation waiting for it to warm up until the start-up limit (the
            # simulator's seed 635: an hour)
            self.refresh_nodes()
            alive = [a for n, a in self.fleet.view().items() if a.alive and self.serves(n)]
            if len(alive) >= self.size:
                return
        if self.step is not None:
            self.end()
        if self.fleet.view():
            # the agents of an ended (or abandoned) step: a new fleet hears only the new ones
            self.fleet.close()
            self.fleet = self.new_fleet()
        self.refresh_nodes()
        self.step = Step(for_nodes(self.command, self.job.nodes, self.left_out, overlap=self.overlap), self.env())
        self.since = world.monotonic()

    def env(self) -> dict[str, str]:
        """The agent step's environment: the supervisor's address and the allocation's token."""
        env = dict(world.environ())
        # the batch script exports the batch host's address; without it, the batch host's slurmd
        # address (a node's own loopback would send every agent on another host to itself)
        here = self.slurmd.get(world.environ().get("SLURMD_NODENAME", ""))
        host = env.get("MASTER_ADDR") or (here[0] if here else "127.0.0.1")
        env[wire.SUPERVISOR] = f"{host}:{self.fleet.port}"
        env[wire.TOKEN] = self.token
        env[wire.LEASE_S] = f"{self.policy.lease_s:g}"
        holder = epoch.held()
        if holder is not None:
            # the command the agents serve: an orphaned one claims the next, never one it has not seen
            env[epoch.EPOCH_ENV] = str(holder.epoch)
        if self.silent_s is not None:
            env[wire.SILENT_S] = f"{self.silent_s:g}"
        full = self.full_size()
        if self.job.ref and self.policy.recover and self.no_kill:
            # submitted with spares (even if fewer are left), or to go on with fewer nodes: a
            # --no-kill job outlives its batch host; the agents requeue it then
            env[wire.REQUEUE_ON_LOSS] = f"{self.policy.least_nodes},{full},{self.policy.tasks_per_node}"
            # where this supervisor runs: once Slurm has taken a lost batch host out of the job,
            # scontrol's BatchHost says (null)
            env[wire.SUPERVISOR_NODE] = str(self.here)
            if self.takeover_offered():
                # ... or the first of them takes this supervisor's place (hpc_llm.job.agent.takeover)
                env[wire.TAKEOVER] = json.dumps(self.relaunch)
        env["HPC_LLM_HEARTBEAT_S"] = f"{self.policy.heartbeat_s:g}"
        return env

    def takeover_offered(self) -> bool:
        """Whether the agents may take this supervisor's place (:meth:`env`: spares, recovery on,
        ``fault.take_over``)."""
        full = self.full_size()
        offered = self.policy.recover and self.policy.take_over and full > self.policy.nodes
        return bool(self.job.ref and offered and self.relaunch and self.here)

    @property
    def no_kill(self) -> bool:
        """The agent step (and the job: the script renders both) outlives a node's loss
        (``--no-kill``: spares, or ``resources.min_nodes``)."""
        return "--no-kill" in self.command

    @property
    def size(self) -> int:
        """The nodes the next generation trains on: ``nodes``, or fewer where the allocation holds
        fewer (a shrink left nodes out, or a requeue asked for what was up), never fewer than
        ``resources.min_nodes`` (the generation waits for them)."""
        held = len([n for n in self.job.nodes if n not in self.left_out])
        return max(min(self.policy.nodes, held), self.policy.least_nodes)

    def serves(self, node: str) -> bool:
        """``node`` is still the job's (off Slurm there is no list: every node is) and not left out."""
        return (not self.job.nodes or node in self.job.nodes) and node not in self.left_out

    def usable(self) -> int:
        """The nodes of this allocation the run may still use (held, not left out)."""
        return len([n for n in self.job.nodes if n not in self.left_out])

    def refresh_nodes(self) -> None:
        """The allocation's nodes as slurmctld has them now (a --no-kill job loses a node Slurm
        calls DOWN; nobody tells the supervisor but srun, and only for the steps it ran): asked
        before every new agent step, whose size they decide. Unchanged when slurmctld does not
        answer."""
        if not self.job.job_id:
            return
        info = allocation.show_job(self.job.job_id)
        nodes = allocation.hostnames(info.get("NodeList")) if info else []
        if nodes and nodes != self.job.nodes:
            gone = [n for n in self.job.nodes if n not in nodes]
            if gone:
                log.warning("hpc_llm supervisor: Slurm took %s out of the job", ",".join(gone))
            self.job.nodes = [n for n in self.job.nodes if n in nodes] + [n for n in nodes if n not in self.job.nodes]

    def full_size(self) -> int:
        """The nodes the run was submitted with, spares included (its allocation may be fewer)."""
        return rendered_nodes(self.command) or len(self.job.nodes)

    def end(self) -> None:
        """The allocation is done: tell the agents (they clean their scratch and exit), then end
        the agent step, by srun's own abort if it has not ended by then. The abort changes Slurm
        (slurmctld kills the step on every node): only the job's holder may, and a supervisor that
        no longer holds it abandons the step instead (:meth:`abandon`)."""
        for node, a in self.fleet.view().items():
            if a.alive:
                self.fleet.send(node, messages.End())
        step, self.step = self.step, None
        if step is not None and step.running and step.wait(timeout=END_WAIT_S) is None:
            try:
                with epoch.acting("aborting the agent step"):
                    step.kill()
            except epoch.Refused as exc:
                log.warning("hpc_llm supervisor: not aborting the agent step (%s): abandoning it", exc.why)
                step.abandon()

    def abandon(self, others: bool = True) -> None:
        """This supervisor no longer acts for the job (cut off, or another holds it): end the agents
        that still hear it and let go of the step without a word to Slurm (:meth:`Step.abandon`):
        the step, and whatever runs in it on other nodes (the supervisor that took this one's
        place, exec'd in it), lives on. ``others`` False: end only this node's agent; the others
        stay, to take this supervisor's place should its host be lost (a supervisor that stands
        down while slurmctld is silent to all, then loses its host, left the job RUNNING with
        nobody in it when it had ended every agent: the simulator's seed 762)."""
        for node, a in self.fleet.view().items():
            if a.alive and (others or node == self.here):
                self.fleet.send(node, messages.End())
        step, self.step = self.step, None
        if step is not None and step.running:
            step.wait(timeout=END_WAIT_S / 3)
            step.abandon()
        # its tasks may live on, holding their nodes' CPUs: a new agent step shares them
        self.overlap = True

    def close(self) -> None:
        self.end()
        self.fleet.close()

    # -- which nodes ----------------------------------------------------------------------
    def warm_nodes(self) -> list[str]:
        """The warm agents' nodes this allocation may train on, in the allocation's node order."""
        view = self.fleet.view()
        warm = (n for n, a in view.items() if a.state == "warm" and self.serves(n))
        return sorted(warm, key=lambda n: view[n].node_id)

    def spares(self) -> tuple[str, ...]:
        """Warm agents outside the generation's layout (resources.spare_nodes): a swap's candidates."""
        return tuple(n for n in self.warm_nodes() if n not in self.layout)

    def swap_out(self, nodes: tuple[str, ...]) -> None:
        """The next generation runs without ``nodes``: their agents, if they still answer, end."""
        self.left_out |= set(nodes)
        view = self.fleet.view()
        for node in nodes:
            if node in view and view[node].alive:
                self.fleet.send(node, messages.End())

    def give_back(self) -> list[str]:
        """The nodes left out of this allocation that are still in it go back to Slurm (the job
        shrinks: :func:`hpc_llm.slurm.requeue.give_back`), but this node and the batch host,
        which a job cannot let go of (Slurm takes a lost batch host out itself). Returns the
        nodes given back; none when Slurm would not (a warning says why)."""
        if not self.job.job_id or not self.job.ref or not self.left_out:
            return []
        info = allocation.show_job(self.job.job_id)
        if not info:
            # not now: each try below would wait on slurmctld again, holding up the generation's
            # loop (seed 583: 46 s); the nodes stay left out and go back at the next give-back
            log.warning("hpc_llm supervisor: slurmctld did not answer: giving %s back later", ",".join(self.left_out))
            return []
        nodes = allocation.hostnames(info.get("NodeList")) or self.job.nodes
        out = [n for n in nodes if n in self.left_out and n not in (self.here, info.get("BatchHost"))]
        if not out:
            return []
        keep = [n for n in nodes if n not in out]
        try:
            with epoch.acting(f"giving {','.join(out)} back to Slurm"):
                err = requeue.give_back(self.job.ref, keep)
        except epoch.Unanswered as exc:
            err = exc.why
        if err:
            log.warning("hpc_llm supervisor: could not give %s back to Slurm: %s", ",".join(out), err)
            return []
        self.job.nodes = keep
        self.given_back += out
        log.warning("hpc_llm supervisor: gave %s back to Slurm: the job now holds %s", ",".join(out), ",".join(keep))
        return out

    def lose_spare(self, node: str, why: str) -> None:
        """A spare that cannot serve (its agent died or never started): left out, given back to
        Slurm, and the run goes on with the spares left."""
        if node in self.left_out or node in self.layout:
            return
        self.left_out.add(node)
        self.lost_spares[node] = why
        self.give_back()
        # before the first generation every node is outside the (empty) layout: not all are spares
        left = len(self.spares_held()) - (0 if self.layout else self.policy.nodes)
        log.warning("hpc_llm supervisor: spare %s lost (%s); %d spare(s) left", node, why, max(0, left))
        self.note_spares()

    def spares_held(self) -> list[str]:
        """The allocation's nodes outside the layout and not left out: the spares left."""
        return [n for n in self.job.nodes if n not in self.left_out and n not in self.layout]

    def note_spares(self) -> None:
        """The spares' account in the run dir, for ``hpc-llm status`` (runs without spares: none)."""
        submitted = self.full_size() - self.policy.nodes
        if submitted > 0:
            try:
                held = self.spares_held()
                spare_record.write(self.policy.run_dir, submitted, held, self.lost_spares, self.given_back)
            except epoch.Unanswered as exc:
                # slurmctld no longer vouches for this allocation: the account waits for the next
                # write (the generation's own check of slurmctld ends it if the silence lasts)
                log.warning("hpc_llm supervisor: the spares' account not written: %s", exc.why)

    def draining_to_swap(self, gen: Generation) -> tuple[str, ...]:
        """Nodes of ``gen`` an operator drains, when warm spares can take all their places (the
        generation then stops with a save and the next one runs without them); else nothing: the
        drain waits for the job to end, as Slurm's does."""
        spares = self.spares()
        if not self.job.job_id or not self.policy.stop_signal or not spares:
            return ()
        found = set(allocation.draining([*gen.layout, *spares]) or ())
        if drained_spares := found & set(spares):
            # a spare being drained takes no node's place: it would only be drained from again
            log.warning("hpc_llm supervisor: spare(s) %s draining: not swapped in", ",".join(sorted(drained_spares)))
            self.left_out |= drained_spares
            spares = self.spares()
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

    # -- a generation ------------------------------------------------------------------------
    def start(self, number: int) -> Generation:
        """Generation ``number`` on the warm agents: node ranks kept from the last generation, a
        spare in the place of a node gone (:func:`next_layout`)."""
        view = self.fleet.view()
        last = self.layout
        self.layout = next_layout(self.layout, self.warm_nodes(), self.size)
        # spares that take a place now: this generation's first collectives are their check
        self.joined = tuple(n for n in self.layout if n not in last) if last else ()
        master = self.layout[0]
        port = self._find_port(master, number)
        gen = Generation(number, {n: i for i, n in enumerate(self.layout)}, self.policy.tasks_per_node)
        # the generation is this holder's from now on: a rank of an earlier one writes nothing more
        holder = epoch.held()
        if holder is not None:
            holder.advance(number)
        env = JobEnv.current().for_generation(
            number,
            self.layout,
            self.job.start,
            self.policy.heartbeat_s if self.policy.recover else None,
            epoch=str(holder.epoch) if holder is not None else None,
            run_dir=str(self.policy.run_dir),
        )
        ours = {k: v for k, v in env.items() if k.startswith("HPC_LLM_")}
        for node_rank, node in enumerate(self.layout):
            start = messages.Start(
                gen=number,
                node_rank=node_rank,
                nnodes=len(self.layout),
                tasks_per_node=self.policy.tasks_per_node,
                master_addr=view[master].addr,
                master_port=port or slurm_port(self.job.job_id, self.job.restart, number),
                env=ours,
            )
            self.fleet.send(node, start)
        self.note_spares()
        log.info(
            "hpc_llm supervisor: generation %d on %s (rendezvous %s:%s)",
            number,
            ",".join(self.layout),
            view[master].addr,
            port,
        )
        return gen

    def _find_port(self, master: str, number: int) -> int | None:
        """The free port node rank 0's agent names for generation ``number`` (None: no answer in
        :data:`PORT_WAIT_S`); what else the fleet heard meanwhile is held for the loop."""
        self.fleet.send(master, messages.FindPort(number))
        deadline = world.monotonic() + PORT_WAIT_S
        while world.monotonic() < deadline:
            for ev in self.fleet.events(timeout=0.05):
                match ev:
                    case Heard(msg=messages.PortFound(gen=gen, port=port)) if gen == number:
                        return port
                    case _:
                        self._held.append(ev)
        return None

    def host_answers(self, node: str) -> bool | None:
        """Whether ``node``'s host is up: its slurmd accepts a connection (None: not known where
        it listens, off Slurm). An agent's probe port refused on a single-host dev cluster, where
        every node is one host, says nothing of the node: its slurmd does."""
        address = self.slurmd.get(node)
        return allocation.slurmd_answers(address) if address else None

    def signal(self, gen: Generation, name: str) -> None:
        for node in gen.layout:
            self.fleet.send(node, messages.Signal(gen.gen, name))

    def kill(self, gen: Generation, gone: set[str]) -> None:
        """End generation ``gen`` now: every agent but those ``gone`` kills its ranks' groups."""
        gen.killing = True
        for node in gen.layout:
            if node not in gone:
                self.fleet.send(node, messages.Kill(gen.gen))


def next_layout(layout: list[str], warm: list[str], nodes: int) -> list[str]:
    """The next generation's nodes in node-rank order: each node of ``layout`` still warm keeps
    its node rank, and a spare (the first warm node outside it, in allocation order) takes the
    rank of each one gone; the first generation takes the first ``nodes`` warm ones. A restart in
    place then stays on its nodes, whichever agent warmed first."""
    spares = [n for n in warm if n not in layout]
    kept = [n for n in layout if n in warm]
    if len(layout) == nodes:
        return [n if n in warm else spares.pop(0) for n in layout]
    if kept and len(kept) == nodes < len(layout):
        return kept  # fewer nodes (resources.min_nodes): those left keep their order
    return warm[:nodes]


def slurm_port(job_id: str | None, restart: int, gen: int) -> int:
    """A rendezvous port for generation ``gen`` of allocation ``restart`` that every rank agrees
    on without talking, when node rank 0's agent did not name a free one in time: a new one for
    every generation, so a rank of an earlier one still holding its port never meets this one."""
    digits = "".join(c for c in job_id or "" if c.isdigit())
    return PORT_BASE + (int(digits or 0) * 131 + restart * 17 + gen) % PORT_SPAN
