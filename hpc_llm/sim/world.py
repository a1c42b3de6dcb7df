"""The simulated world the control plane runs in: processes on hosts, their signals, and the seam.

:class:`SimWorld` is what :func:`hpc_llm.world.install` is given: every call the supervisor,
an agent or an srun makes of the world lands here, and is answered for the simulated process
whose thread is running (:class:`Proc`: its pid, host, environment, signal handlers, children,
sockets, the Slurm step it runs in). Processes are started by a program name, as a command
line names them (:meth:`SimWorld.spawn`): ``python -m hpc_llm.job.supervisor`` runs the real
supervisor's ``main``, ``python -m hpc_llm.job.agent`` the real agent's, ``srun`` the
simulated srun (:mod:`hpc_llm.sim.slurm`).

What a signal does is what the kernel does: SIGKILL ends the process where it stands (no
``finally`` runs), SIGSTOP freezes every thread of it (their timers fire late, on SIGCONT),
another signal runs the handler the process installed (the supervisor's and agent's only
note the signal), or its default action.
"""

from __future__ import annotations

import logging
import os
import queue
import signal
import subprocess
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from hpc_llm.sim.hub import TIMEOUT, Hub, Killed, Task, Wait
from hpc_llm.sim.net import Net, SignalPipe

#: the simulation a world belongs to (hpc_llm.sim.run.Sim, which imports this module)
Sim = Any

log = logging.getLogger("hpc_llm.sim")

#: signals whose default action is to be ignored
_IGNORED_BY_DEFAULT = {signal.SIGCHLD, signal.SIGCONT, signal.SIGURG, signal.SIGWINCH}
#: Slurm's client commands, where a host has them
SLURM_COMMANDS = ("srun", "scontrol", "sinfo", "sacct", "scancel", "squeue", "sbatch")


def exit_code(code: Any) -> int:
    if code is None:
        return 0
    return code if isinstance(code, int) else 1


class Proc:
    def __init__(
        self,
        world: SimWorld,
        pid: int,
        host: Any,
        argv: list[str],
        env: dict[str, str],
        parent: Proc | None,
        label: str,
        pgid: int | None = None,
    ) -> None:
        self.world = world
        self.pid = pid
        self.host = host
        self.argv = argv
        self.env = env
        self.parent = parent
        self.pgid: int = pgid if pgid is not None else (parent.pgid if parent else pid)
        self.label = label
        self.frozen = False
        self.dead = False
        #: it died with its host (no kernel left to report its end)
        self.vanished = False
        self.code: int | None = None
        self.deferred: list[tuple[Task, Any]] = []
        self.pending_signals: list[int] = []
        self.handlers: dict[int, Any] = {}
        self.wakeups: list[SignalPipe] = []
        self.local: dict[str, Any] = {}
        self.children: list[Proc] = []
        self.ended: list[tuple[int, int]] = []
        self.socks: set[Any] = set()
        self.tasks: list[Task] = []
        #: the Slurm step (job, step id) this process runs in, as its container (tracked like
        #: proctrack/linuxproc: the step's task and its descendants)
        self.step: Any = None
        #: called with the exit code when it ends
        self.on_exit: list[Callable[[int], None]] = []
        #: what it writes on stderr, when its parent reads it (srun's)
        self.stderr: LinePipe | None = None
        #: the epoch it holds, as the checker reads it (hpc_llm.job.epoch keeps it in ``local``)

    def __repr__(self) -> str:
        return f"{self.label}[{self.pid}]"

    @property
    def alive(self) -> bool:
        return not self.dead

    # -- signals
    def signal(self, sig: int) -> None:
        if self.dead:
            return
        if sig == signal.SIGKILL:
            self.exit(-signal.SIGKILL)
            return
        if sig == signal.SIGSTOP:
            self.frozen = True
            return
        if sig == signal.SIGCONT:
            self.thaw()
            return
        if self.frozen:
            self.pending_signals.append(sig)
            return
        self._deliver(sig)

    def _deliver(self, sig: int) -> None:
        handler = self.handlers.get(sig, signal.SIG_DFL)
        if handler == signal.SIG_IGN:
            return
        if handler == signal.SIG_DFL or handler is None:
            if sig not in _IGNORED_BY_DEFAULT:
                self.exit(-sig)
            return
        self.world.trace(self, f"signal {signal.Signals(sig).name}")
        self.world.as_proc(self, lambda: handler(sig, None))
        for pipe in self.wakeups:
            pipe.poke()

    def thaw(self) -> None:
        if self.dead or not self.frozen:
            return
        self.frozen = False
        deferred, self.deferred = self.deferred, []
        for task, value in deferred:
            self.world.hub.resume_deferred(task, value)
        pending, self.pending_signals = self.pending_signals, []
        for sig in pending:
            self._deliver(sig)

    # -- the end
    def exit(self, code: int, vanish: bool = False) -> None:
        """The process ends with ``code`` (negative: killed by that signal). ``vanish``: its host
        died with it (no FIN leaves for its connections)."""
        if self.dead:
            return
        self.dead, self.code, self.frozen = True, code, False
        self.vanished = vanish
        for task in self.tasks:
            task.dropped = True
        for s in list(self.socks):
            if vanish and hasattr(s, "vanish"):
                s.vanish()
            else:
                s.close()
        self.socks.clear()
        self.world.trace(self, f"exit {code}")
        for child in self.children:
            child.parent = None
        if self.parent is not None and not self.parent.dead:
            self.parent.ended.append((self.pid, code))
            self.parent.signal(signal.SIGCHLD)
        if self.stderr is not None:
            self.stderr.close()
        for fn in self.on_exit:
            fn(code)
        self.world.procs.pop(self.pid, None)


class LinePipe:
    """A pipe of text lines a process writes and its parent reads (srun's stderr)."""

    def __init__(self, world: SimWorld) -> None:
        self.world = world
        self.lines: list[str] = []
        self.closed = False
        self.waiters: list[Wait] = []

    def write(self, line: str) -> None:
        if not self.closed:
            self.lines.append(line if line.endswith("\n") else line + "\n")
            self._notify()

    def close(self) -> None:
        self.closed = True
        self._notify()

    def _notify(self) -> None:
        waiters, self.waiters = self.waiters, []
        for w in waiters:
            self.world.hub.fire(w, True)

    def __iter__(self) -> LinePipe:
        return self

    def __next__(self) -> str:
        while not self.lines:
            if self.closed:
                raise StopIteration
            w = self.world.hub.waiter()
            self.waiters.append(w)
            self.world.hub.suspend(w, None)
        return self.lines.pop(0)


class Child:
    """What :func:`hpc_llm.world.popen` returns: a child process, as subprocess.Popen offers it."""

    def __init__(self, proc: Proc) -> None:
        self.proc = proc
        self.pid = proc.pid
        self.stderr = proc.stderr
        self.returncode: int | None = None
        self._waiters: list[Wait] = []
        proc.on_exit.append(self._ended)

    def _ended(self, code: int) -> None:
        self.returncode = code
        waiters, self._waiters = self._waiters, []
        for w in waiters:
            self.proc.world.hub.fire(w, True)

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            hub = self.proc.world.hub
            w = hub.waiter()
            self._waiters.append(w)
            if hub.suspend(w, timeout) is TIMEOUT and self.returncode is None:
                raise subprocess.TimeoutExpired(self.proc.argv, timeout or 0)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            self.proc.signal(sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class Thread:
    def __init__(self, world: SimWorld, proc: Proc, target: Callable[[], None], name: str) -> None:
        self.world, self.proc, self.target, self.name = world, proc, target, name
        self.task: Task | None = None
        self._waiters: list[Wait] = []

    def start(self) -> None:
        def body() -> None:
            try:
                self.target()
            except Killed:
                return
            except Exception:
                self.world.crashed(self.proc, f"thread {self.name}", traceback.format_exc())
            finally:
                waiters, self._waiters = self._waiters, []
                for w in waiters:
                    self.world.hub.fire(w, True)

        self.task = self.world.hub.spawn(self.proc, self.name, body)
        self.proc.tasks.append(self.task)

    def join(self, timeout: float | None = None) -> None:
        if self.task is None or self.task.done or self.task.dropped:
            return
        w = self.world.hub.waiter()
        self._waiters.append(w)
        self.world.hub.suspend(w, timeout)

    def is_alive(self) -> bool:
        return self.task is not None and not self.task.done and not self.task.dropped


class Queue:
    def __init__(self, world: SimWorld) -> None:
        self.world = world
        self.items: list[Any] = []
        self.waiters: list[Wait] = []

    def put(self, item: Any) -> None:
        self.items.append(item)
        waiters, self.waiters = self.waiters, []
        for w in waiters:
            self.world.hub.fire(w, True)

    def get_nowait(self) -> Any:
        if not self.items:
            raise queue.Empty
        return self.items.pop(0)

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        if not self.items and block:
            w = self.world.hub.waiter()
            self.waiters.append(w)
            self.world.hub.suspend(w, timeout)
        return self.get_nowait()


class Exec(Killed):
    """Unwinds nothing: raised only to leave a task that exec'd (see :meth:`SimWorld.execve`)."""


class SimWorld:
    """The world of one simulated run (see the module docstring)."""

    def __init__(self, sim: Sim) -> None:
        self.sim = sim
        self.hub: Hub = sim.hub
        self.net: Net = sim.net
        self.procs: dict[int, Proc] = {}
        self._pids = iter(range(100, 1 << 30))
        #: the process a hub callback acts for (a signal handler), when no task of it runs
        self._acting: Proc | None = None
        self.t0 = sim.t0
        self._programs: dict[str, Callable[[Proc, list[str]], None]] = {}

    # -- processes
    def program(self, name: str, fn: Callable[[Proc, list[str]], None]) -> None:
        """``fn(proc, args)`` runs for a command line naming ``name`` (a module after ``-m``, or
        a command's base name)."""
        self._programs[name] = fn

    def resolve(self, argv: list[str]) -> tuple[Callable[[Proc, list[str]], None], list[str]]:
        name = os.path.basename(argv[0])
        if name in self._programs:
            return self._programs[name], argv[1:]
        i = argv.index("-m")  # python [flags] -m module args
        return self._programs[argv[i + 1]], argv[i + 2 :]

    def spawn(
        self,
        argv: list[str],
        env: Mapping[str, str],
        host: Any,
        parent: Proc | None,
        label: str,
        new_session: bool = False,
        step: Any = None,
        stderr: bool = False,
    ) -> Proc:
        pid = next(self._pids)
        proc = Proc(self, pid, host, list(argv), dict(env), parent, label, pgid=pid if new_session else None)
        if parent is not None:
            parent.children.append(proc)
            proc.step = step if step is not None else parent.step
        else:
            proc.step = step
        if stderr:
            proc.stderr = LinePipe(self)
        self.procs[pid] = proc
        fn, args = self.resolve(argv)
        self._run(proc, fn, args)
        self.trace(proc, f"start {' '.join(argv[:6])}{' ...' if len(argv) > 6 else ''}")
        return proc

    def _run(self, proc: Proc, fn: Callable[[Proc, list[str]], None], args: list[str]) -> None:
        def main() -> None:
            try:
                fn(proc, args)
                code = 0
            except SystemExit as exc:
                code = exit_code(exc.code)
            except Killed:
                return
            except Exception:
                self.crashed(proc, "main", traceback.format_exc())
                code = 1
            proc.exit(code)

        task = self.hub.spawn(proc, "main", main)
        proc.tasks.append(task)

    def crashed(self, proc: Proc, where: str, tb: str) -> None:
        self.sim.history.crash(proc, where, tb)
        self.trace(proc, f"CRASH in {where}: {tb.strip().splitlines()[-1]}")

    def trace(self, proc: Proc | None, what: str) -> None:
        self.sim.trace.note(self.hub.now, proc.label if proc else "-", what)

    def as_proc(self, proc: Proc, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` (a signal handler) in the hub, acting for ``proc``."""
        prev, self._acting = self._acting, proc
        saved, self.hub.current = self.hub.current, None
        try:
            return fn()
        finally:
            self._acting = prev
            self.hub.current = saved

    def me(self) -> Proc:
        task = self.hub.current
        if task is not None:
            if task.dropped:
                raise Killed()
            return task.proc
        if self._acting is not None:
            return self._acting
        raise RuntimeError("the world was asked outside any simulated process")

    def pause(self, seconds: float) -> None:
        self.hub.sleep(seconds)

    def wakeups_of(self, proc: Proc) -> list[SignalPipe]:
        return proc.wakeups

    def fd_object(self, fd: int) -> Any:
        raise KeyError(f"no simulated file descriptor {fd}")

    # -- hpc_llm.world's calls
    def time(self) -> float:
        return self.t0 + self.hub.now

    def monotonic(self) -> float:
        # each host's own clock: a comparison across hosts would be a bug, and shows
        return self.hub.now + 1000.0 * self.me().host.index

    def sleep(self, seconds: float) -> None:
        self.me()
        self.hub.sleep(seconds)

    def environ(self) -> dict[str, str]:
        return self.me().env

    def pid(self) -> int:
        return self.me().pid

    def hostname(self) -> str:
        return str(self.me().host.name)

    def local(self) -> dict[str, Any]:
        return self.me().local

    def listener(self, host: str, backlog: int) -> Any:
        return self.net.listener(self.me(), backlog)

    def connect(self, host: str, port: int, timeout_s: float) -> Any:
        return self.net.connect(self.me(), host, port, timeout_s)

    def connect_nowait(self, host: str, port: int) -> tuple[Any, int]:
        return self.net.connect_nowait(self.me(), host, port)

    def bindable(self, port: int) -> bool:
        return port not in self.me().host.listeners

    def selector(self) -> Any:
        from hpc_llm.sim.net import Selector

        return Selector(self.me())

    def thread(self, target: Callable[[], None], name: str) -> Thread:
        return Thread(self, self.me(), target, name)

    def queue(self) -> Queue:
        return Queue(self)

    def popen(self, argv: list[str], env: Mapping[str, str], new_session: bool = False) -> Child:
        me = self.me()
        label = f"{os.path.basename(argv[0])}@{me.host.name}"
        proc = self.spawn(argv, env, me.host, me, label, new_session=new_session, stderr=True)
        return Child(proc)

    def on_signal(self, signum: int, handler: Any) -> None:
        self.me().handlers[signum] = handler

    def signal_wakeup(self) -> tuple[Any, Callable[[], None]]:
        pipe = SignalPipe()
        self.me().wakeups.append(pipe)
        return pipe, pipe.drain

    def _find(self, pid: int) -> Proc:
        proc = self.procs.get(pid)
        if proc is None or proc.dead:
            raise ProcessLookupError(pid)
        return proc

    def kill(self, pid: int, sig: int) -> None:
        self._find(pid).signal(sig)
        self.me()  # a process that killed itself stops here

    def killpg(self, pgid: int, sig: int) -> None:
        group = [p for p in self.procs.values() if p.pgid == pgid and not p.dead]
        if not group:
            raise ProcessLookupError(pgid)
        for p in group:
            p.signal(sig)
        self.me()

    def execve(self, path: str, argv: list[str], env: Mapping[str, str]) -> None:
        """The calling process runs ``argv`` from now on, as itself (same pid, host, step,
        parent); the thread that called never runs again, and no ``finally`` of it runs."""
        me = self.me()
        fn, args = self.resolve(argv)
        for task in me.tasks:
            task.dropped = True
        me.tasks = []
        me.argv, me.env = list(argv), dict(env)
        me.label = f"{os.path.basename(argv[0])}@{me.host.name}"
        me.handlers.clear()
        me.wakeups.clear()
        me.local = {}
        self.trace(me, f"exec {' '.join(argv[:6])} ...")
        self._run(me, fn, args)
        raise Exec()

    def reap(self) -> list[tuple[int, int]]:
        me = self.me()
        out, me.ended = me.ended, []
        return out

    def ranks(self) -> Any:
        return self.sim.ranks

    def which(self, name: str) -> str | None:
        me = self.me()
        if name in SLURM_COMMANDS and self.sim.slurm_client_on(me):
            return f"/usr/bin/{name}"
        return None

    def run(self, args: list[str], timeout: float, env: Mapping[str, str] | None) -> subprocess.CompletedProcess[str]:
        return self.sim.slurm.command(self.me(), list(args), timeout)

    def replace(self, src: Path, dst: Path) -> None:
        me = self.me()
        os.replace(src, dst)
        self.sim.history.wrote(me, Path(dst))

    def redirect_output(self, path: Path) -> None:
        self.me().local["log"] = str(path)

    def shm_dir(self) -> Path | None:
        path = self.sim.root / "shm" / self.me().host.name
        path.mkdir(parents=True, exist_ok=True)
        return path
