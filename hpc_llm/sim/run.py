"""One seed, run: the simulated cluster built, the real control plane started in it, faults injected.

:func:`run_seed` builds the world of a :class:`~hpc_llm.sim.scenario.Scenario` (hosts, a
Slurm, the job with its batch script: the real supervisor), submits the job, runs the hub
until the job has ended and every process of it is gone (or the scenario's horizon), and hands
what happened to the checker (:mod:`hpc_llm.sim.check`). The trace (every process started,
signalled and ended, Slurm's changes, the control plane's own log lines) is kept for a seed
that fails: ``python -m hpc_llm.sim --seed N`` prints it.
"""

from __future__ import annotations

import logging
import random
import shutil
import signal
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpc_llm import world as world_module
from hpc_llm.rundir.layout import RunDir
from hpc_llm.sim.hub import Hub, Killed
from hpc_llm.sim.net import FDS, Net
from hpc_llm.sim.ranks import SimRanks, Training, rank_main
from hpc_llm.sim.scenario import Fault, Scenario, draw
from hpc_llm.sim.slurm import Config, Job, Slurm, shepherd_main, srun_main
from hpc_llm.sim.world import Proc, SimWorld

#: the simulated epoch: 2027-01-15T08:00:00Z
T0 = 1_800_000_000.0
#: seconds a seed goes on after its job ended (and its faults are over) while processes of it
#: are left (a host cut off and healed): what they do then is judged too
SETTLE_S = 120.0


class Trace:
    """What happened, in order: (virtual time, who, what)."""

    def __init__(self) -> None:
        self.lines: list[tuple[float, str, Any]] = []

    def note(self, t: float, who: str, what: Any) -> None:
        self.lines.append((t, who, what))

    def render(self) -> str:
        out = []
        for t, who, what in self.lines:
            text = what.getMessage() if isinstance(what, logging.LogRecord) else str(what)
            out.append(f"{t:9.3f}  {who:<22} {text}")
        return "\n".join(out)


class _ToTrace(logging.Handler):
    """The control plane's own log lines, into the trace of the seed that runs."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.sim: Sim | None = None

    def emit(self, record: logging.LogRecord) -> None:
        sim = self.sim
        if sim is None:
            return
        task = sim.hub.current
        who = task.proc.label if task is not None else (sim.world._acting.label if sim.world._acting else "-")
        sim.trace.note(sim.hub.now, who, record)


_HANDLER = _ToTrace()


class _Stderr:
    """sys.stderr while a seed runs: what a simulated process writes there (srun's error lines,
    which the supervisor copies into its batch log) goes into the trace."""

    def __init__(self, sim: Sim) -> None:
        self.sim = sim

    def write(self, text: str) -> int:
        task = self.sim.hub.current
        who = task.proc.label if task is not None else "-"
        for line in text.splitlines():
            if line.strip():
                self.sim.trace.note(self.sim.hub.now, who, line)
        return len(text)

    def flush(self) -> None:
        pass


@dataclass
class Mutation:
    t: float
    proc: str
    pid: int
    what: str
    #: the process's allocation (job restart) and whether the sim's ground truth found it stale
    restart: int | None
    stale: str | None


@dataclass
class History:
    """What the checker reads: every Slurm mutation and record write, by whom, and crashes."""

    sim: Any
    mutations: list[Mutation] = field(default_factory=list)
    crashes: list[tuple[float, str, str]] = field(default_factory=list)
    #: (time, results.json status) each time it was written
    statuses: list[tuple[float, str, str]] = field(default_factory=list)
    #: times at which the job was RUNNING with no live process of the run
    orphaned_since: float | None = None
    orphaned_for: float = 0.0

    def crash(self, proc: Proc, where: str, tb: str) -> None:
        self.crashes.append((self.sim.hub.now, f"{proc} {where}", tb))

    def mutated(self, proc: Proc, job: Job, what: str) -> None:
        self.mutations.append(
            Mutation(self.sim.hub.now, proc.label, proc.pid, what, _restart(proc), self.sim.stale(proc, job))
        )

    def wrote(self, proc: Proc, path: Path) -> None:
        job = self.sim.job
        what = f"write {path.name}"
        self.mutations.append(
            Mutation(self.sim.hub.now, proc.label, proc.pid, what, _restart(proc), self.sim.stale(proc, job))
        )
        if path == RunDir(self.sim.run_dir).results:
            import json

            try:
                status = json.loads(path.read_text()).get("status")
            except (OSError, ValueError):
                status = None
            self.statuses.append((self.sim.hub.now, str(status), proc.label))


def _restart(proc: Proc) -> int | None:
    st = proc.step
    return st.restart if st is not None else None


class Sim:
    def __init__(self, scenario: Scenario, root: Path) -> None:
        self.scenario = scenario
        self.root = root
        self.t0 = T0
        self.hub = Hub()
        self.net = Net(self.hub)
        self.trace = Trace()
        self.history = History(self)
        self.world = SimWorld(self)
        cfg = Config(version=scenario.version, slurmd_timeout_s=scenario.slurmd_timeout_s)
        self.slurm = Slurm(self, cfg)
        for i in range(scenario.cluster):
            self.slurm.add_node(f"n{i + 1}")
        self.ctl_index = 0
        self.slurm.ctl.index = 0
        self.run_dir = root / "run"
        rd = RunDir(self.run_dir)
        rd.private.mkdir(parents=True)
        rd.logs.mkdir()
        self.payload = rd.payload
        self.payload.write_bytes(b"simulated")
        self.slurm_conf = root / "slurm.conf"
        self.slurm_conf.write_text("# the simulated cluster's\n")
        self.training = Training(self.run_dir, max_batches=scenario.max_batches, import_s=scenario.import_s)
        self.ranks = SimRanks(self, self.training)
        w = self.world
        w.program("hpc_llm.job.supervisor", _supervisor)
        w.program("batch-script", _batch_script)
        w.program("hpc_llm.job.agent", _agent)
        w.program("srun", srun_main)
        w.program("srun-shepherd", shepherd_main)
        w.program("sim-rank", rank_main)
        self.job: Job | None = None
        #: supervisors that ran, in the order they started: (proc, allocation restart)
        self.supervisors: list[Proc] = []
        #: nodes a fault touched (the others stayed healthy), and those it took for good
        self.touched: set[str] = set()
        self.lost_for_good: set[str] = set()
        #: no Slurm client inside a container (the scenario may say so)
        self.container_without_slurm = False
        #: when the job ended, and when the last fault was undone (or happened, if for good)
        self.ended_at: float | None = None
        self.faults_over = max((f.at + (f.lasts or 0.0) for f in scenario.faults), default=0.0)

    # -- the job
    def slurm_client_on(self, proc: Proc) -> bool:
        return not self.container_without_slurm

    def submit(self) -> Job:
        s = self.scenario
        alloc = s.nodes + s.spares
        job = Job(
            id=self.slurm.new_job_id(),
            num_nodes=alloc,
            script=self._script,
            no_kill=s.no_kill,
            requeue=True,
            time_limit_s=s.horizon_s * 2,
        )
        self.job = self.slurm.submit(job)
        return job

    def _script(self, job: Job) -> tuple[list[str], dict[str, str]]:
        s = self.scenario
        alloc = s.nodes + s.spares
        py = sys.executable
        sup = [py, "-u", "-m", "hpc_llm.job.supervisor", "--run-dir", str(self.run_dir)]
        sup += ["--nodes", str(s.nodes), "--tasks-per-node", "1", "--signal", "USR2", "--signal-lead-s", "60"]
        sup += ["--max-failures", "5", "--max-attempts-without-progress", "10", "--max-failures-per-day", "24"]
        sup += ["--heartbeat-s", "1", "--node-timeout-s", "3", "--probe-timeout-s", "1.5"]
        sup += ["--hang-floor-s", "20", "--hang-timeout-s", "120"]
        if s.min_nodes is not None:
            sup += ["--min-nodes", str(s.min_nodes)]
        if not s.take_over:
            sup.append("--no-take-over")
        srun = ["srun", "--unbuffered", "--export=ALL", f"--nodes={alloc}", f"--ntasks={alloc}", "--ntasks-per-node=1"]
        if s.no_kill:
            srun.append("--no-kill")
        srun += ["--cpus-per-task=1", "--kill-on-bad-exit=0", "--open-mode=append"]
        agent = [py, "-u", "-m", "hpc_llm.job.agent", str(self.payload)]
        env = {
            "PATH": "/usr/bin:/bin",
            "SLURM_CONF": str(self.slurm_conf),
            "HPC_LLM_STOP_SIGNAL": "USR2",
            "HOME": str(self.root),
        }
        return ["batch-script", *sup, "--", *srun, *agent], env

    # -- the ground truth the checker judges by
    def stale(self, proc: Proc, job: Job | None) -> str | None:
        """Why ``proc`` had no right to change Slurm or the run's record now (None: it had):
        its allocation is not the job's current one, or a supervisor took over after it."""
        if job is None:
            return None
        st = proc.step
        if st is None or st.job is not job:
            return None
        if st.restart < job.restarts and getattr(job, "requeued_by", None) != _root(proc).pid:
            return f"its allocation (restart {st.restart}) is over: the job is at restart {job.restarts}"
        mine = _supervisor_of(self, proc)
        later = [
            p
            for p in self.supervisors
            if p.step is not None
            and p.step.restart == st.restart
            and mine is not None
            and p.pid != mine.pid
            and self.supervisors.index(p) > self.supervisors.index(mine)
            # a later supervisor that never acted (it found another holder and stood aside, as a
            # supervisor the batch script restarts does after an agent took its place) took nothing
            and any(m.pid == p.pid for m in self.history.mutations)
        ]
        if mine is not None and later:
            return f"the supervisor {later[-1]} took over after {mine}"
        return None

    def alive_of_run(self) -> list[Proc]:
        job = self.job
        if job is None:
            return []
        return [
            p
            for p in self.world.procs.values()
            if not p.dead
            and p.step is not None
            and p.step.job is job
            and p.step.restart == job.restarts
            and p.label.split("@")[0] in ("supervisor", "agent")
        ]

    # -- faults
    def inject(self, fault: Fault) -> None:
        self.hub.at(fault.at, self._fire, fault)

    def resolve(self, role: str, r: random.Random) -> str | None:
        job = self.job
        nodes = list(job.nodes) if job is not None and job.nodes else []
        if not nodes:
            return None
        ranked = {p.host.name for p in self.world.procs.values() if p.label.startswith("rank") and not p.dead}
        owner = next((p for p in reversed(self.supervisors) if not p.dead), None)
        batch = owner.host.name if owner is not None else (job.batch_host if job else None)
        if role == "batch" and batch:
            return batch
        if role == "worker":
            workers = [n for n in nodes if n != batch and n in ranked]
            return r.choice(workers) if workers else None
        if role == "spare":
            spares = [n for n in nodes if n not in ranked and n != batch]
            return r.choice(spares) if spares else None
        return r.choice(nodes)

    def _fire(self, fault: Fault) -> None:
        r = random.Random(f"{self.scenario.seed}/{fault.at}/{fault.kind}")
        if fault.kind == "ctld_silent":
            self.slurm.silent_until = self.hub.now + (fault.lasts or 0)
            self.trace.note(self.hub.now, "FAULT", f"slurmctld silent for {fault.lasts}s")
            return
        node = self.resolve(fault.role, r)
        if node is None:
            self.trace.note(self.hub.now, "FAULT", f"{fault.kind} {fault.role}: no such node now")
            return
        self.touched.add(node)
        if fault.lasts is None and fault.kind in ("kill_node", "freeze_node", "cut_node", "partition", "oneway"):
            self.lost_for_good.add(node)
        host = self.net.hosts[node]
        self.trace.note(
            self.hub.now,
            "FAULT",
            f"{fault.kind} {node} ({fault.role}) {'for good' if fault.lasts is None else f'for {fault.lasts}s'}",
        )
        procs = [p for p in list(self.world.procs.values()) if p.host is host and not p.dead]
        if fault.kind == "kill_node":
            host.up = False
            for p in procs:
                p.exit(-signal.SIGKILL, vanish=True)
            self._changed()
            if fault.lasts is not None:
                self.hub.at(self.hub.now + fault.lasts, self._reboot, node)
        elif fault.kind == "freeze_node":
            for p in procs:
                p.signal(signal.SIGSTOP)
            self.slurm.frozen_slurmd.add(node)
            if fault.lasts is not None:
                self.hub.at(self.hub.now + fault.lasts, self._thaw, node, procs)
        elif fault.kind == "cut_node":
            self.net.cut.add(node)
            self._changed()
            if fault.lasts is not None:
                self.hub.at(self.hub.now + fault.lasts, self._heal_cut, node)
        elif fault.kind in ("partition", "oneway"):
            others = [h for h in self.net.hosts if h != node and (h != "ctl" or fault.with_ctl)]
            # a link that fails has two ends: from the nodes on the other side, nothing tells which
            # end is at fault (with two nodes), so blaming either is no blame of a healthy node
            self.touched.update(h for h in others if h != "ctl")
            pairs = {(node, o) for o in others}
            if fault.kind == "partition":
                pairs |= {(o, node) for o in others}
            self.net.blocked |= pairs
            self._changed()
            if fault.lasts is not None:
                self.hub.at(self.hub.now + fault.lasts, self._heal_pairs, pairs)
        elif fault.kind in ("kill_agent", "kill_rank", "kill_supervisor"):
            prefix = {"kill_agent": "agent", "kill_rank": "rank", "kill_supervisor": "supervisor"}[fault.kind]
            victims = [p for p in procs if p.label.startswith(prefix)]
            if victims:
                victims[0].signal(signal.SIGKILL)

    def _changed(self) -> None:
        self.net.changed()
        for g in self.ranks.groups.values():
            g.recheck()

    def _reboot(self, node: str) -> None:
        self.net.hosts[node].up = True
        self.trace.note(self.hub.now, "FAULT", f"{node} back up (rebooted)")
        self._changed()
        self.hub.at(self.hub.now + 1.0, self.slurm.booted, node)

    def _thaw(self, node: str, procs: list[Proc]) -> None:
        self.slurm.frozen_slurmd.discard(node)
        self.trace.note(self.hub.now, "FAULT", f"{node} thawed")
        for p in procs:
            p.signal(signal.SIGCONT)

    def _heal_cut(self, node: str) -> None:
        self.net.cut.discard(node)
        self.trace.note(self.hub.now, "FAULT", f"{node} healed")
        self._changed()

    def _heal_pairs(self, pairs: set[tuple[str, str]]) -> None:
        self.net.blocked -= pairs
        self.trace.note(self.hub.now, "FAULT", "partition healed")
        self._changed()

    # -- watching for a job RUNNING with nobody of it alive
    def _watch(self) -> None:
        job = self.job
        h = self.history
        if job is not None and job.state == "RUNNING" and not self.alive_of_run():
            if h.orphaned_since is None:
                h.orphaned_since = self.hub.now
            h.orphaned_for = max(h.orphaned_for, self.hub.now - h.orphaned_since)
        else:
            h.orphaned_since = None
        self.hub.at(self.hub.now + 1.0, self._watch)

    def finished(self) -> bool:
        """The job has ended, and either nothing of it is left or whatever is left has had
        :data:`SETTLE_S` since the job's end and the last fault's end to show what it does."""
        job = self.job
        if job is None or job.state in ("PENDING", "RUNNING", "COMPLETING"):
            return False
        if not any(not p.dead for p in self.world.procs.values()):
            return True
        if self.ended_at is None:
            self.ended_at = self.hub.now
        return self.hub.now >= max(self.ended_at, self.faults_over) + SETTLE_S


def _root(proc: Proc) -> Proc:
    p = proc
    while p.parent is not None:
        p = p.parent
    return p


def _supervisor_of(sim: Sim, proc: Proc) -> Proc | None:
    """The supervisor ``proc`` acts for: itself, or the one whose srun it is."""
    p: Proc | None = proc
    while p is not None:
        if p.label.startswith("supervisor") or p in sim.supervisors:
            return p
        p = p.parent
    return None


def _batch_script(proc: Proc, args: list[str]) -> None:
    """The batch script's last part (sbatch_templates/default.sh.j2, tests/test_batch_script.py):
    the supervisor as its child, the stop signal and SIGTERM passed on, a supervisor that dies
    of a signal started again (up to SUPERVISOR_RESTARTS times) unless Slurm's SIGTERM came."""
    from hpc_llm.launch.sbatch.render import SUPERVISOR_RESTARTS

    world = proc.world
    hub = world.hub
    state: dict[str, Any] = {"terminated": False, "child": None}

    def forward(sig: int, frame: Any) -> None:
        if sig == signal.SIGTERM:
            state["terminated"] = True
        child = state["child"]
        if child is not None and not child.dead:
            child.signal(sig)

    proc.handlers[signal.SIGUSR2] = signal.SIG_IGN  # until the supervisor runs (trap '')
    proc.handlers[signal.SIGTERM] = forward
    restarts, died = 0, None
    while True:
        env = {**proc.env, "HPC_LLM_SUPERVISOR_RESTARTS": str(restarts)}
        if died is not None:
            env["HPC_LLM_SUPERVISOR_DIED"] = str(died)
        child = world.spawn(args, env, proc.host, proc, f"supervisor@{proc.host.name}")
        state["child"] = child
        proc.handlers[signal.SIGUSR2] = forward
        w = hub.waiter()

        def ended(_code: int, w: Any = w) -> None:
            hub.fire(w, True)

        child.on_exit.append(ended)
        hub.suspend(w, None)
        proc.handlers[signal.SIGUSR2] = signal.SIG_IGN
        code = child.code if child.code is not None else 1
        status = code if code >= 0 else 128 - code
        if state["terminated"] or status <= 128 or restarts >= SUPERVISOR_RESTARTS:
            raise SystemExit(status)
        restarts, died = restarts + 1, status
        world.trace(proc, f"the supervisor died (exit status {status}): starting it again")


def _supervisor(proc: Proc, args: list[str]) -> None:
    from hpc_llm.job.supervisor.main import main

    proc.label = f"supervisor@{proc.host.name}"
    proc.world.sim.supervisors.append(proc)
    main(args)


def _agent(proc: Proc, args: list[str]) -> None:
    from hpc_llm.job.agent.loop import main

    main(args)


@dataclass
class Outcome:
    scenario: Scenario
    violations: list[str]
    trace: Trace
    events: int
    sim_s: float
    results: dict[str, Any] | None


def run_seed(seed: int, scenario: Scenario | None = None, keep: Path | None = None) -> Outcome:
    """Run one seed in a world of its own; every world call of the control plane goes to it."""
    from hpc_llm.sim import check

    scenario = scenario or draw(seed)
    root = Path(tempfile.mkdtemp(prefix=f"hpc_llm-sim-{seed}-", dir=_tmp_base())) if keep is None else keep
    random.seed(seed)
    sim = Sim(scenario, root)
    old = world_module.install(sim.world)
    _HANDLER.sim = sim
    root_logger = logging.getLogger()
    if _HANDLER not in root_logger.handlers:
        root_logger.addHandler(_HANDLER)
    old_level = root_logger.level
    root_logger.setLevel(logging.INFO)
    real_stderr, sys.stderr = sys.stderr, _Stderr(sim)
    try:
        sim.slurm.start()
        sim.submit()
        for f in scenario.faults:
            sim.inject(f)
        sim.hub.at(1.0, sim._watch)
        sim.hub.run(scenario.horizon_s, stop=sim.finished)
        violations = check.violations(sim)
    finally:
        _drop_tasks(sim)
        sys.stderr = real_stderr
        world_module.install(old)
        _HANDLER.sim = None
        root_logger.setLevel(old_level)
    FDS.clear()
    results = check.read_json(RunDir(sim.run_dir).results)
    out = Outcome(scenario, violations, sim.trace, sim.hub.events, sim.hub.now, results)
    if keep is None:
        shutil.rmtree(root, ignore_errors=True)
    return out


def _drop_tasks(sim: Sim) -> None:
    """End every greenlet still suspended, while the simulated world is installed: each is marked
    dropped first, so that the first world call of a ``finally`` it unwinds through stops it.
    (Left to the garbage collector, they would unwind later, in the real world.)"""
    hub = sim.hub
    for task in hub.tasks:
        task.dropped = True
    for task in hub.tasks:
        if task.glet.dead or not task.glet:
            continue
        hub.current = task
        try:
            task.glet.throw(Killed)
        except BaseException:  # noqa: BLE001 - whatever it unwound into, it is over
            pass
        finally:
            hub.current = None
    hub.tasks.clear()


def _tmp_base() -> str | None:
    shm = Path("/dev/shm")
    return str(shm) if shm.is_dir() else None
