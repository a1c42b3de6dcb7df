"""A simulated Slurm: slurmctld, the nodes' slurmd, jobs, steps, srun, and the client commands' text.

The semantics are those verified on the dev cluster and read in Slurm's source, written in
docs/design/verified/slurm.md; the simulation keeps the ones the control plane's decisions turn
on, and the tests of :mod:`tests.test_sim_slurm` pin each against that record:

* **Nodes answer pings.** slurmctld pings every node each SlurmdTimeout/3; a ping that gets no
  answer (the node cut off, powered off or frozen) sets NOT_RESPONDING once MessageTimeout has
  passed, and a node not heard from for SlurmdTimeout is DOWN (a node failure). A node that
  answers again comes back (ReturnToService=2), and its slurmd kills what it still runs of jobs
  that are not its own any more.
* **A node failure** ends a job NODE_FAIL, requeued if it has ``--requeue`` (its restart count
  one higher at once, pending again once every node of it has let go, cred_expire later). A
  ``--no-kill`` job instead loses the node and runs on: its steps without ``--no-kill`` that had
  a task there are killed everywhere, the others lose that task (srun prints "Node failure");
  a lost batch host takes the batch step with it, and the job runs on without a batch script.
* **The batch script's end is the job's end** (COMPLETED on 0, else FAILED), with everything
  of the job killed on every node (SIGTERM, then SIGKILL after KillWait).
* **Steps.** ``srun`` asks slurmctld for a step and launches a task on each node through that
  node's slurmd. A task that execs stays in its step, and everything it starts is in the step
  too (proctrack/linuxproc). srun passes SIGUSR1/2 on, kills the step (SIGKILL to every task,
  through slurmctld) on SIGTERM, SIGHUP, SIGQUIT and a second SIGINT within a second, and exits
  when the step's tasks have ended. srun killed alone leaves a shepherd that kills the step;
  killed together with its shepherd (its process group), nothing kills the step.
* **Commands.** Every client command reaches slurmctld over the network: from a host cut off
  from it, a command waits and fails ("Unable to contact slurm controller"); a request that
  arrived but whose answer could not come back took effect all the same ("Socket timed out").
  ``scontrol requeue`` of a running job: the restart count one higher at once, the job
  COMPLETING, then PENDING; ``scontrol update`` of ExcNodeList, NumNodes, NumTasks, StartTime
  only for a pending job, NodeList (a shrink) only for a running one that keeps its batch host.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import signal
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

#: the simulation and a process of it (hpc_llm.sim.run.Sim, hpc_llm.sim.world.Proc: both import
#: this module)
Sim = Any
Proc = Any

#: slurmctld's own time to answer a request
CTLD_S = 0.002
#: slurmctld asks a DOWN node to register only every this many pings (Slurm's ping_nodes.c)
MAX_REG_FREQUENCY = 20


@dataclass
class Config:
    version: tuple[int, int, int] = (24, 11, 5)
    slurmd_timeout_s: int = 10
    message_timeout_s: int = 5
    kill_wait_s: int = 5
    cred_expire_s: int = 10
    sched_interval_s: float = 1.0

    @property
    def ping_s(self) -> float:
        return self.slurmd_timeout_s / 3

    @property
    def version_text(self) -> str:
        return ".".join(map(str, self.version))


class Node:
    def __init__(self, name: str, host: Any, index: int) -> None:
        self.name, self.host, self.index = name, host, index
        self.down = False
        self.not_responding = False
        self.last_response = 0.0
        #: the job holding it (one job a node here)
        self.job: Job | None = None
        self.drain = False

    def state(self) -> str:
        base = "DOWN" if self.down else ("ALLOCATED" if self.job else "IDLE")
        flags = (["DRAIN"] if self.drain else []) + (["NOT_RESPONDING"] if self.not_responding else [])
        return "+".join([base, *flags])

    def short(self) -> str:
        base = (
            "down"
            if self.down
            else ("drng" if self.drain and self.job else "drain" if self.drain else "alloc" if self.job else "idle")
        )
        return base + ("*" if self.not_responding else "")


@dataclass
class Step:
    job: Job
    restart: int
    id: str
    nodes: list[str]
    no_kill: bool = False
    srun: Any = None
    tasks: dict[str, Any] = field(default_factory=dict)
    done: set[str] = field(default_factory=set)
    ended: bool = False

    def __repr__(self) -> str:
        return f"{self.job.id}.{self.id}@{self.restart}"


@dataclass
class Job:
    id: str
    num_nodes: int
    script: Callable[[Job], tuple[list[str], dict[str, str]]]
    no_kill: bool = False
    requeue: bool = True
    partition: str = "batch"
    time_limit_s: float = 3600.0
    state: str = "PENDING"
    restarts: int = 0
    nodes: list[str] = field(default_factory=list)
    batch_host: str | None = None
    exc: list[str] = field(default_factory=list)
    submit: float = 0.0
    start: float | None = None
    end_time: float | None = None
    begin: float = 0.0
    batch: Any = None
    steps: list[Step] = field(default_factory=list)
    next_step: int = 0
    #: the allocation is ending: (final state, requeue after) while processes are killed
    ending: tuple[str, bool] | None = None
    waiting_nodes: set[str] = field(default_factory=set)
    rows: list[dict[str, Any]] = field(default_factory=list)
    reason: str = "None"
    ntasks_per_node: int = 1
    #: the process (its tree's root pid) whose ``scontrol requeue`` moved the restart count last
    requeued_by: int | None = None
    #: how many nodes were not lost for good when hpc_llm last requeued the job (None: Slurm
    #: requeued it last, or nobody did): what the run could have asked for
    alive_at_requeue: int | None = None


class Slurm:
    def __init__(self, sim: Sim, config: Config) -> None:
        self.sim = sim
        self.hub = sim.hub
        self.net = sim.net
        self.cfg = config
        self.ctl = self.net.add_host("ctl")
        self.nodes: dict[str, Node] = {}
        self.jobs: dict[str, Job] = {}
        #: slurmctld answers nothing (a silent controller) until this time
        self.silent_until = 0.0
        #: slurmctld takes this long to answer each request (a slow one)
        self.slow_s = 0.0
        #: slurmd processes frozen with their node
        self.frozen_slurmd: set[str] = set()
        self._job_ids = iter(range(1000, 10**9))
        self._pings = 0
        #: every change of a job's state and every mutation asked, for the checker
        self.log: list[tuple[float, str, str, str]] = []

    # -- the cluster
    def add_node(self, name: str) -> Node:
        host = self.net.add_host(name)
        host.index = len(self.nodes) + 1
        node = Node(name, host, len(self.nodes))
        node.last_response = self.hub.now
        self.nodes[name] = node
        return node

    def start(self) -> None:
        self.hub.at(self.hub.now + self.cfg.ping_s, self._ping)
        self.hub.at(self.hub.now + self.cfg.sched_interval_s, self._schedule)

    def submit(self, job: Job) -> Job:
        job.submit = self.hub.now
        self.jobs[job.id] = job
        self._note(job, "submitted")
        return job

    def new_job_id(self) -> str:
        return str(next(self._job_ids))

    def _note(self, job: Job, what: str) -> None:
        self.log.append((self.hub.now, job.id, job.state, what))
        self.sim.trace.note(self.hub.now, "slurmctld", f"job {job.id} {job.state} r{job.restarts}: {what}")

    def responds(self, node: Node) -> bool:
        h = node.host
        return (
            h.up
            and node.name not in self.frozen_slurmd
            and self.net.reaches(self.ctl, h)
            and self.net.reaches(h, self.ctl)
        )

    # -- pings and node failures
    def _ping(self) -> None:
        now = self.hub.now
        self._pings += 1
        for node in self.nodes.values():
            if node.down and (self._pings + node.index) % MAX_REG_FREQUENCY:
                # a DOWN node is not pinged; it is asked to register every MAX_REG_FREQUENCY
                # pings (ping_nodes.c): a host that heals may go unnoticed for that long
                continue
            if self.responds(node):
                node.last_response = now
                if node.not_responding or node.down:
                    self.sim.trace.note(now, "slurmctld", f"node {node.name} responding")
                node.not_responding = False
                if node.down:
                    node.down = False
                self._kill_strays(node)
            else:
                self.hub.at(now + self.cfg.message_timeout_s, self._missed, node)
        self.hub.at(now + self.cfg.ping_s, self._ping)

    def _missed(self, node: Node) -> None:
        if self.responds(node):
            return
        if not node.not_responding:
            node.not_responding = True
            self.sim.trace.note(self.hub.now, "slurmctld", f"node {node.name} not responding")
        if not node.down and self.hub.now - node.last_response >= self.cfg.slurmd_timeout_s:
            self._node_down(node)

    def _node_down(self, node: Node) -> None:
        node.down = True
        self.sim.trace.note(self.hub.now, "slurmctld", f"node {node.name} DOWN")
        job = node.job
        if job is None:
            return
        if job.ending is not None:
            self._released(job, node.name)
            return
        if job.state != "RUNNING":
            return
        if job.no_kill:
            self._remove_node(job, node, "node failure")
            return
        job.rows[-1].update(state="NODE_FAIL", end=self.hub.now)
        self._end(job, "NODE_FAIL", requeue=job.requeue, why=f"node failure on {node.name}")

    def _remove_node(self, job: Job, node: Node, why: str) -> None:
        """A --no-kill job loses ``node`` and runs on (Slurm's kill_running_job_by_node_ptr)."""
        job.nodes = [n for n in job.nodes if n != node.name]
        node.job = None
        job.rows[-1].update(state="RESIZING")
        job.rows.append(self._row(job))
        self._note(job, f"{node.name} removed ({why})")
        if node.name == job.batch_host:
            job.batch_host = None
            self._note(job, "batch host lost: running without a batch script")
        for step in list(job.steps):
            if step.ended or node.name not in step.nodes:
                continue
            if step.id == "batch":
                step.ended = True
                continue
            if step.no_kill:
                step.done.add(node.name)
                if step.srun is not None and not step.srun.dead:
                    self._to_srun(step, f"srun: error: Node failure on {node.name}")
                self._step_progress(step)
            else:
                self._kill_step(step, signal.SIGKILL)
        self._kill_on(node, job, job.restarts, signal.SIGKILL, pending=True)
        if not job.nodes:
            self._end(job, "NODE_FAIL", requeue=job.requeue, why="no node left")

    def booted(self, name: str) -> None:
        """A node's slurmd started again after its host rebooted, and registered: a batch script
        that should run there and does not is purged, its job requeued if it may be
        (job_mgr.c, _purge_missing_jobs: "Batch JobId=N missing from batch node")."""
        node = self.nodes[name]
        if not node.host.up:
            return
        if not self.responds(node):
            # slurmd tries to register until slurmctld hears it
            self.hub.at(self.hub.now + 1.0, self.booted, name)
            return
        node.last_response = self.hub.now
        node.not_responding = False
        node.down = False
        self.sim.trace.note(self.hub.now, "slurmctld", f"node {name} registered (rebooted)")
        self._kill_strays(node)
        for job in self.jobs.values():
            if job.state == "RUNNING" and job.batch_host == name and (job.batch is None or job.batch.dead):
                job.rows[-1].update(state="NODE_FAIL", end=self.hub.now)
                self._end(
                    job, "FAILED", requeue=job.requeue, why=f"batch script missing from rebooted batch host {name}"
                )

    # -- the scheduler
    def _schedule(self) -> None:
        now = self.hub.now
        for job in self.jobs.values():
            if job.state != "PENDING" or job.begin > now:
                continue
            free = [
                n
                for n in self.nodes.values()
                if not n.down and not n.not_responding and n.job is None and not n.drain and n.name not in job.exc
            ]
            if len(free) >= job.num_nodes:
                self._start(job, free[: job.num_nodes])
        self.hub.at(now + self.cfg.sched_interval_s, self._schedule)

    def _row(self, job: Job) -> dict[str, Any]:
        return {"state": "RUNNING", "start": job.start, "end": None, "nodes": list(job.nodes), "submit": job.submit}

    def _start(self, job: Job, nodes: list[Node]) -> None:
        now = self.hub.now
        job.state, job.start, job.end_time = "RUNNING", now, now + job.time_limit_s
        job.nodes = [n.name for n in nodes]
        job.batch_host = job.nodes[0]
        job.steps, job.next_step = [], 0
        for n in nodes:
            n.job = job
        job.rows.append(self._row(job))
        self._note(job, f"started on {','.join(job.nodes)}")
        argv, env = job.script(job)
        host = self.nodes[job.batch_host].host
        env = {
            **env,
            "SLURM_JOB_ID": job.id,
            "SLURM_JOBID": job.id,
            "SLURM_RESTART_COUNT": str(job.restarts),
            "SLURM_JOB_NODELIST": ",".join(job.nodes),
            "SLURM_JOB_NUM_NODES": str(len(job.nodes)),
            "SLURMD_NODENAME": job.batch_host,
            "MASTER_ADDR": host.addr,
        }
        step = Step(job, job.restarts, "batch", [job.batch_host])
        job.steps.append(step)
        job.batch = self.sim.world.spawn(argv, env, host, None, f"batch@{job.batch_host}", step=step)
        step.tasks[job.batch_host] = job.batch
        proc, restart = job.batch, job.restarts
        proc.on_exit.append(lambda code: self._batch_ended(job, restart, proc, code))

    def _batch_ended(self, job: Job, restart: int, proc: Proc, code: int) -> None:
        if job.restarts != restart or job.state != "RUNNING" or job.batch is not proc or job.batch_host is None:
            return  # not this allocation's batch script any more
        if proc.vanished:
            return  # its host died with it: nobody reports it (the host's reboot does: booted())
        if not self.responds(self.nodes[job.batch_host]):
            # slurmd tells slurmctld when it can (the batch host cut off: when it answers again)
            self.hub.at(self.hub.now + self.cfg.ping_s, self._batch_ended, job, restart, proc, code)
            return
        final = "COMPLETED" if code == 0 else "FAILED"
        job.rows[-1].update(state=final, end=self.hub.now, code=code)
        self._end(job, final, requeue=False, why=f"batch script exited {code}")

    # -- an allocation's end
    def _end(self, job: Job, final: str, requeue: bool, why: str) -> None:
        """End this allocation: every process of it killed on every node (SIGTERM, KillWait,
        SIGKILL), then the job ``final``, or pending again (``requeue``)."""
        if job.ending is not None:
            return
        if requeue:
            job.restarts += 1
            job.alive_at_requeue = None
        job.ending = (final, requeue)
        job.state = "COMPLETING"
        self._note(job, f"ending ({why}){', requeued' if requeue else ''}")
        job.waiting_nodes = set(job.nodes)
        restart = job.restarts - 1 if requeue else job.restarts
        for name in list(job.nodes):
            node = self.nodes[name]
            self._kill_on(node, job, restart, signal.SIGTERM, pending=True)
        if not job.waiting_nodes:
            self._released(job, None)
            return
        self.hub.at(self.hub.now + self.cfg.kill_wait_s, self._end_kill, job, restart)

    def _end_kill(self, job: Job, restart: int) -> None:
        for name in list(job.waiting_nodes):
            node = self.nodes[name]
            if self.responds(node):
                self._kill_on(node, job, restart, signal.SIGKILL, pending=True)
                self._released(job, name)
            elif node.down:
                self._released(job, name)

    def _released(self, job: Job, name: str | None) -> None:
        if name is not None:
            node = self.nodes[name]
            if node.job is job:
                node.job = None
            job.waiting_nodes.discard(name)
        if job.waiting_nodes or job.ending is None:
            return
        final, requeue = job.ending
        job.ending = None
        for step in job.steps:
            step.ended = True
        job.nodes, job.batch, job.batch_host = [], None, None
        if requeue:
            job.state = "PENDING"
            job.begin = self.hub.now + self.cfg.cred_expire_s
            job.reason = "BeginTime"
            self._note(job, "pending again")
        else:
            job.state = final
            self._note(job, "ended")

    def _kill_on(self, node: Node, job: Job, restart: int, sig: int, pending: bool) -> None:
        """Signal every process of allocation (job, restart) on ``node``, now if slurmctld reaches
        its slurmd, else when it answers again (:meth:`_kill_strays`)."""
        if not self.responds(node):
            return
        for proc in self._procs_of(node, job, restart):
            proc.signal(signal.SIGCONT)
            proc.signal(sig)
        if sig == signal.SIGTERM:
            self.hub.at(self.hub.now + self.cfg.kill_wait_s, self._kill_on, node, job, restart, signal.SIGKILL, False)

    def _procs_of(self, node: Node, job: Job, restart: int) -> list[Proc]:
        return [
            p
            for p in list(self.sim.world.procs.values())
            if p.host is node.host and p.step is not None and p.step.job is job and p.step.restart == restart
        ]

    def _kill_strays(self, node: Node) -> None:
        """The node answers: its slurmd kills what it runs of allocations that are not on it now."""
        for p in list(self.sim.world.procs.values()):
            st = p.step
            if p.host is not node.host or st is None:
                continue
            job = st.job
            current = job.state == "RUNNING" and st.restart == job.restarts and node.name in job.nodes
            if not current and not (
                job.ending is not None and st.restart == job.restarts - (1 if job.ending[1] else 0)
            ):
                self.sim.trace.note(self.hub.now, f"slurmd@{node.name}", f"kills stray {p} of {st}")
                p.signal(signal.SIGKILL)
        job = node.job
        if job is not None and job.ending is not None and node.name in job.waiting_nodes:
            restart = job.restarts - 1 if job.ending[1] else job.restarts
            self._kill_on(node, job, restart, signal.SIGKILL, pending=False)
            self._released(job, node.name)

    # -- steps (srun)
    def create_step(
        self, proc: Proc, nodes_wanted: int, exclude: list[str], no_kill: bool, only: list[str] | None = None
    ) -> Step | str:
        st = proc.step
        job = st.job if st is not None else None
        if job is None or job.state != "RUNNING" or st.restart != job.restarts:
            return "Job/step already completing or completed"
        nodes = [n for n in job.nodes if n not in exclude and not self.nodes[n].down and (only is None or n in only)]
        if len(nodes) < nodes_wanted:
            return "Requested node configuration is not available"
        step = Step(job, job.restarts, str(job.next_step), nodes[:nodes_wanted], no_kill=no_kill, srun=proc)
        job.next_step += 1
        job.steps.append(step)
        self.sim.trace.note(self.hub.now, "slurmctld", f"step {step} on {','.join(step.nodes)}")
        return step

    def launch(self, step: Step, argv: list[str], env: dict[str, str]) -> list[str]:
        """Start the step's tasks, one a node; the nodes whose slurmd srun could not reach."""
        failed = []
        srun = step.srun
        for i, name in enumerate(step.nodes):
            node = self.nodes[name]
            if (
                not (self.net.reaches(srun.host, node.host) and self.net.reaches(node.host, srun.host))
                or not node.host.up
            ):
                failed.append(name)
                continue
            task_env = {
                **env,
                "SLURM_STEP_ID": step.id,
                "SLURM_PROCID": str(i),
                "SLURM_NODEID": str(i),
                "SLURM_LOCALID": "0",
                "SLURMD_NODENAME": name,
                "SLURM_STEP_NODELIST": ",".join(step.nodes),
                "SLURM_NTASKS": str(len(step.nodes)),
            }
            label = f"{_label(argv)}@{name}"
            task = self.sim.world.spawn(argv, task_env, node.host, None, label, new_session=True, step=step)
            step.tasks[name] = task
            task.on_exit.append(lambda code, n=name: self._task_ended(step, n, code))
        return failed

    def _task_ended(self, step: Step, name: str, code: int) -> None:
        if name in step.done:
            return
        step.done.add(name)
        if code != 0 and step.srun is not None and not step.srun.dead:
            what = (
                "Killed" if code == -signal.SIGKILL else (f"Exited with exit code {code}" if code > 0 else "Terminated")
            )
            self._to_srun(step, f"srun: error: {name}: task {step.nodes.index(name)}: {what}")
        self._step_progress(step)

    def _to_srun(self, step: Step, line: str) -> None:
        srun = step.srun
        if srun is not None and srun.stderr is not None:
            srun.stderr.write(line)

    def _step_progress(self, step: Step) -> None:
        if set(step.nodes) <= step.done:
            step.ended = True
            srun = step.srun
            if srun is not None and not srun.dead:
                srun.local.setdefault("step_done", []).append(True)
                for w in srun.local.pop("waiters", []):
                    self.hub.fire(w, True)

    def kill_step(self, step: Step, sig: int) -> None:
        self._kill_step(step, sig)

    def _kill_step(self, step: Step, sig: int) -> None:
        self.sim.trace.note(self.hub.now, "slurmctld", f"kills step {step}")
        for name in step.nodes:
            node = self.nodes[name]
            if not self.responds(node):
                continue
            for p in list(self.sim.world.procs.values()):
                if p.host is node.host and p.step is step:
                    p.signal(sig)

    # -- the client commands
    def command(self, proc: Proc, args: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
        """What ``args`` prints and exits with, asked from ``proc``'s host; raises
        TimeoutExpired when ``timeout`` passes first."""
        world = self.sim.world
        deadline = self.hub.now + timeout
        name = args[0].rsplit("/", 1)[-1]
        if name == "scontrol" and args[1:2] == ["--version"]:
            return _done(args, f"slurm {self.cfg.version_text}\n")
        if name == "scontrol" and args[1:3] == ["show", "hostnames"]:
            return _done(args, "\n".join(expand(args[3])) + "\n")
        src = proc.host
        # the request's way there: slurmctld's client retries its connect for a while
        give_up = self.hub.now + min(timeout, 2 * self.cfg.message_timeout_s)
        while not (self.net.reaches(src, self.ctl) and self.hub.now >= self.silent_until):
            if self.hub.now >= give_up:
                if self.hub.now >= deadline:
                    raise subprocess.TimeoutExpired(args, timeout)
                return _done(args, "", f"{name}: error: Unable to contact slurm controller (connect failure)", 1)
            world.pause(min(1.0, give_up - self.hub.now))
        world.pause(0.0005 + CTLD_S + self.slow_s)
        out = self._answer(proc, name, args)
        # ... and the answer's way back
        give_up = self.hub.now + self.cfg.message_timeout_s
        while not self.net.reaches(self.ctl, src):
            if self.hub.now >= min(give_up, deadline):
                if self.hub.now >= deadline:
                    raise subprocess.TimeoutExpired(args, timeout)
                return _done(args, "", f"{name}: error: Socket timed out on send/recv operation", 1)
            world.pause(min(1.0, give_up - self.hub.now))
        world.pause(0.0005)
        if self.hub.now > deadline:
            raise subprocess.TimeoutExpired(args, timeout)
        return out

    def _answer(self, proc: Proc, name: str, args: list[str]) -> subprocess.CompletedProcess[str]:
        words = args[1:]
        if name == "scontrol":
            if words[:2] == ["show", "job"]:
                ident = [w for w in words[2:] if not w.startswith("-")]
                job = self.jobs.get(ident[0]) if ident else None
                if job is None:
                    return _done(args, "", "slurm_load_jobs error: Invalid job id specified", 1)
                return _done(args, self._show_job(job) + "\n")
            if words[:2] == ["show", "node"]:
                names = [w for w in words[2:] if not w.startswith("-")]
                wanted = expand(names[0]) if names else list(self.nodes)
                lines = [self._show_node(self.nodes[n]) for n in wanted if n in self.nodes]
                return _done(args, "\n".join(lines) + "\n")
            if words[:2] == ["show", "config"]:
                c = self.cfg
                text = (
                    f"SlurmdTimeout           = {c.slurmd_timeout_s} sec\n"
                    f"MessageTimeout          = {c.message_timeout_s} sec\n"
                    f"KillWait                = {c.kill_wait_s} sec\n"
                    f"AuthInfo                = cred_expire={c.cred_expire_s}\n"
                    f"SLURM_VERSION           = {c.version_text}\n"
                )
                return _done(args, text)
            if words[:2] == ["show", "partition"]:
                return _done(args, "PartitionName=batch State=UP PreemptMode=OFF\n")
            if words[:1] == ["requeue"]:
                return self._requeue(proc, args, words[1])
            if words[:1] == ["update"]:
                return self._update(proc, args, words[1:])
        if name == "scancel":
            for word in words:
                job = self.jobs.get(word)
                if job is not None and job.state in ("RUNNING", "PENDING"):
                    self._mutation(proc, job, "scancel")
                    if job.state == "PENDING":
                        job.state = "CANCELLED"
                        self._note(job, "cancelled")
                    else:
                        job.rows[-1].update(state="CANCELLED", end=self.hub.now)
                        self._end(job, "CANCELLED", requeue=False, why="scancel")
            return _done(args, "")
        if name == "sinfo":
            wanted = expand(words[words.index("-n") + 1]) if "-n" in words else list(self.nodes)
            lines = [f"{n} {self.nodes[n].short()}" for n in wanted if n in self.nodes]
            return _done(args, "\n".join(lines) + "\n")
        if name == "sacct":
            return _done(args, self._sacct(words))
        return _done(args, "", f"{name}: simulated Slurm does not know {' '.join(words[:3])}", 1)

    def _mutation(self, proc: Proc, job: Job, what: str) -> None:
        self.sim.history.mutated(proc, job, what)

    def _show_job(self, job: Job) -> str:
        fields = {
            "JobId": job.id,
            "JobName": "hpc_llm-sim",
            "JobState": job.state,
            "Reason": job.reason,
            "Requeue": "1" if job.requeue else "0",
            "Restarts": str(job.restarts),
            "BatchFlag": "1",
            "StartTime": str(int(self.sim.t0 + job.start)) if job.start is not None else "Unknown",
            "EndTime": str(int(self.sim.t0 + job.end_time)) if job.end_time is not None else "Unknown",
            "PreemptTime": "None",
            "Partition": job.partition,
            "NodeList": ",".join(job.nodes) if job.nodes else "(null)",
            "BatchHost": job.batch_host or "(null)",
            "NumNodes": str(len(job.nodes) or job.num_nodes),
            "ExcNodeList": ",".join(job.exc) if job.exc else "(null)",
        }
        return " ".join(f"{k}={v}" for k, v in fields.items())

    def _show_node(self, node: Node) -> str:
        return (
            f"NodeName={node.name} Arch=x86_64 CoresPerSocket=1 NodeAddr={node.host.addr} "
            f"NodeHostName={node.name} Port=6818 State={node.state()} Partitions=batch"
        )

    def _sacct(self, words: list[str]) -> str:
        ids = words[words.index("-j") + 1].split(",") if "-j" in words else []
        lines = []
        for ident in ids:
            job = self.jobs.get(ident)
            if job is None:
                continue
            for row in job.rows:
                lines.append(
                    "|".join(
                        [
                            job.id,
                            job.id,
                            row["state"],
                            "None",
                            _iso(self.sim.t0 + row["submit"]),
                            _iso(self.sim.t0 + row["start"]) if row["start"] is not None else "Unknown",
                            _iso(self.sim.t0 + row["end"]) if row.get("end") is not None else "Unknown",
                            "0",
                            ",".join(row["nodes"]),
                            f"{row.get('code', 0)}:0",
                            f"billing={len(row['nodes'])},cpu={len(row['nodes'])},node={len(row['nodes'])}",
                        ]
                    )
                )
        return "\n".join(lines) + ("\n" if lines else "")

    def _requeue(self, proc: Proc, args: list[str], ident: str) -> subprocess.CompletedProcess[str]:
        job = self.jobs.get(ident)
        if job is None:
            return _done(args, "", "Requeue of job failed: Invalid job id specified", 1)
        self._mutation(proc, job, "requeue")
        if job.state == "PENDING" or (job.ending is not None and job.ending[1]):
            return _done(args, "", f"Requeue of JobId={ident} failed: Job is pending execution", 1)
        if job.state != "RUNNING":
            return _done(args, "", f"Requeue of JobId={ident} failed: Job has already finished", 1)
        job.rows[-1].update(state="REQUEUED", end=self.hub.now)
        root = proc
        while root.parent is not None:
            root = root.parent
        job.requeued_by = root.pid
        self._end(job, "REQUEUED", requeue=True, why="scontrol requeue")
        job.alive_at_requeue = len(self.nodes) - len(self.sim.lost_for_good)
        return _done(args, "")

    def _update(self, proc: Proc, args: list[str], words: list[str]) -> subprocess.CompletedProcess[str]:
        fields = dict(w.split("=", 1) for w in words if "=" in w)
        ident = fields.pop("JobId", None) or fields.pop("jobid", None)
        job = self.jobs.get(ident or "")
        if job is None:
            return _done(args, "", "slurm_update error: Invalid job id specified", 1)
        self._mutation(proc, job, "update " + " ".join(f"{k}={v}" for k, v in fields.items()))
        if "NodeList" in fields:
            keep = expand(fields["NodeList"])
            if job.state != "RUNNING" or job.batch_host not in keep or not set(keep) <= set(job.nodes):
                return _done(args, "", "slurm_update error: Invalid node name specified", 1)
            for name in [n for n in job.nodes if n not in keep]:
                node = self.nodes[name]
                job.nodes.remove(name)
                node.job = None
                self._kill_on(node, job, job.restarts, signal.SIGKILL, pending=True)
                for step in job.steps:
                    if name in step.nodes and not step.ended:
                        step.done.add(name)
                        self._step_progress(step)
            self._note(job, f"shrunk to {','.join(job.nodes)}")
            return _done(args, "")
        if "Requeue" in fields:
            job.requeue = fields.pop("Requeue") == "1"
            if not fields:
                return _done(args, "")
        if job.state != "PENDING" and not (job.ending is not None and job.ending[1]):
            # a job requeued is pending already while its old allocation completes (seen on the
            # dev cluster: the new ExcNodeList accepted while the job was still COMPLETING)
            return _done(args, "", "slurm_update error: Job is no longer pending execution", 1)
        if "ExcNodeList" in fields:
            job.exc = expand(fields["ExcNodeList"]) if fields["ExcNodeList"] else []
        if "NumNodes" in fields:
            job.num_nodes = int(fields["NumNodes"].split("-")[0])
        if "StartTime" in fields:
            value = fields["StartTime"]
            if value.startswith("now+"):
                job.begin = self.hub.now + int(value[4:])
        self._note(job, "updated " + " ".join(f"{k}={v}" for k, v in fields.items()))
        return _done(args, "")


def _label(argv: list[str]) -> str:
    if "-m" in argv:
        return argv[argv.index("-m") + 1].rsplit(".", 1)[-1]
    return argv[0].rsplit("/", 1)[-1]


def _iso(t: float) -> str:
    return dt.datetime.fromtimestamp(t).isoformat(timespec="seconds")


def _done(args: list[str], out: str, err: str = "", code: int = 0) -> subprocess.CompletedProcess[str]:
    return subprocess.CompletedProcess(args, code, out, err + ("\n" if err and not err.endswith("\n") else ""))


def expand(nodelist: str) -> list[str]:
    """A node list as the simulation writes it (comma-separated; ``n[1-3]`` too)."""
    out: list[str] = []
    for part in _split(nodelist):
        if "[" in part:
            prefix, _, rest = part.partition("[")
            for item in rest.rstrip("]").split(","):
                lo, _, hi = item.partition("-")
                for i in range(int(lo), int(hi or lo) + 1):
                    out.append(f"{prefix}{i}")
        elif part:
            out.append(part)
    return out


def _split(text: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return parts


# -- srun, as a program of the simulated world


def srun_main(proc: Proc, args: list[str]) -> None:
    """``srun [options] command...``: one task a node, then wait for them (see the module docstring)."""
    sim = proc.world.sim
    slurm: Slurm = sim.slurm
    hub = slurm.hub
    opts: dict[str, str] = {}
    flags: set[str] = set()
    i = 0
    while i < len(args) and args[i].startswith("-"):
        a = args[i]
        if "=" in a:
            k, _, v = a.partition("=")
            opts[k] = v
        elif a in ("-w", "-N", "-n"):
            opts[a] = args[i + 1]
            i += 1
        else:
            flags.add(a)
        i += 1
    command = args[i:]
    n = int(opts.get("--nodes", opts.get("-N", "1")).split("-")[0])
    exclude = expand(opts["--exclude"]) if opts.get("--exclude") else []
    err = proc.stderr
    # a shepherd, as srun forks one: it kills the step if srun dies without ending it
    state: dict[str, Any] = {"ints": [], "aborted": False}

    def on_signal(sig: int, frame: Any) -> None:
        if sig == signal.SIGINT:
            state["ints"].append(hub.now)
            recent = [t for t in state["ints"] if hub.now - t <= 1.0]
            if len(recent) >= 2:
                state["abort"] = True
        elif sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
            state["abort"] = True
        elif sig in (signal.SIGUSR1, signal.SIGUSR2):
            state.setdefault("forward", []).append(sig)
        for w in proc.local.pop("waiters", []):
            hub.fire(w, True)

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2):
        proc.handlers[sig] = on_signal
    # ask slurmctld for the step
    only = expand(opts.get("--nodelist") or opts.get("-w") or "") or None
    reply = _ask_ctld(proc, lambda: slurm.create_step(proc, n, exclude, "--no-kill" in flags, only))
    if reply is None:
        if err:
            job_id = proc.step.job.id if proc.step else "?"
            err.write(f"srun: error: Unable to create step for job {job_id}: Unable to contact slurm controller")
        raise SystemExit(1)
    if isinstance(reply, str):
        if err:
            err.write(f"srun: error: Unable to create step for job {proc.step.job.id if proc.step else '?'}: {reply}")
        raise SystemExit(1)
    step: Step = reply
    shepherd = proc.world.spawn(["srun-shepherd"], {}, proc.host, proc, f"shepherd@{proc.host.name}")
    shepherd.local["step"] = step
    failed = slurm.launch(step, command, dict(proc.env))
    if failed:
        if err:
            nodes = ",".join(failed)
            err.write(
                f"srun: error: Task launch for StepId={step} failed on node {nodes}: Communication connection failure"
            )
        # srun aborts the step: the tasks it did launch are killed, and it exits
        step.done.update(failed)
        state["abort"] = True
    while not step.ended:
        if state.get("abort") and not state["aborted"]:
            state["aborted"] = True
            if err:
                err.write("srun: forcing job termination" if len(state["ints"]) < 2 else "srun: aborting job")
            _ask_ctld(proc, lambda: slurm.kill_step(step, signal.SIGKILL))
            # srun waits a little for the tasks, then goes
            deadline = hub.now + 10.0
            while not step.ended and hub.now < deadline:
                _wait(proc, min(1.0, deadline - hub.now))
            break
        for sig in state.pop("forward", []):
            for name, task in step.tasks.items():
                if not task.dead and slurm.net.reaches(proc.host, slurm.nodes[name].host):
                    task.signal(sig)
        _wait(proc, None)
    shepherd.local["done"] = True
    shepherd.signal(signal.SIGKILL)
    codes = [t.code for t in step.tasks.values() if t.code is not None]
    worst = max((c if c >= 0 else 128 - c for c in codes), default=0)
    raise SystemExit(worst if not state["aborted"] else 137)


def _wait(proc: Proc, timeout: float | None) -> None:
    hub = proc.world.hub
    w = hub.waiter()
    proc.local.setdefault("waiters", []).append(w)
    hub.suspend(w, timeout)
    with contextlib.suppress(ValueError):
        proc.local.get("waiters", []).remove(w)


def _ask_ctld(proc: Proc, fn: Callable[[], Any]) -> Any:
    """A request from ``proc`` to slurmctld: its answer, or None when slurmctld could not be
    reached (for MessageTimeout)."""
    slurm: Slurm = proc.world.sim.slurm
    hub = slurm.hub
    give_up = hub.now + slurm.cfg.message_timeout_s
    while not slurm.net.reaches(proc.host, slurm.ctl) or hub.now < slurm.silent_until:
        if hub.now >= give_up:
            return None
        proc.world.pause(min(1.0, give_up - hub.now))
    proc.world.pause(0.001 + slurm.slow_s)
    return fn()


def shepherd_main(proc: Proc, args: list[str]) -> None:
    """srun's shepherd: blocks everything but SIGKILL, and when srun dies without saying it is
    done (killed), asks slurmctld to kill the step (srun_job.c, _shepherd_spawn)."""
    hub = proc.world.hub
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2):
        proc.handlers[sig] = signal.SIG_IGN
    parent = proc.parent
    while parent is not None and not parent.dead:
        w = hub.waiter()
        parent.on_exit.append(lambda code, w=w: hub.fire(w, True))
        hub.suspend(w, None)
    if proc.local.get("done"):
        return
    step = proc.local.get("step")
    if step is not None and not step.ended:
        slurm: Slurm = proc.world.sim.slurm
        if _ask_ctld(proc, lambda: slurm.kill_step(step, signal.SIGKILL)) is not None:
            proc.world.trace(proc, f"srun died: its shepherd killed step {step}")
