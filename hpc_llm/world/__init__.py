"""What the control plane touches outside its own code: one seam, the operating system's or a simulation's.

The supervisor, the agents, an orphaned agent and the supervisor that takes its place reach the
clock, their environment, the network, threads, child processes, signals, the ranks they fork,
Slurm's commands and the run's files through this module and nothing else
(``tests/test_world.py`` lists the modules and checks that none of them imports ``time``,
``socket``, ``selectors``, ``subprocess`` or ``threading`` itself). In production the world is
the operating system (:class:`Real`): each function here is one call away from the stdlib's.

The simulator (:mod:`hpc_llm.sim`) installs a world of its own, in which the very same modules
run as many processes of one Python process, on a virtual clock, over a simulated network of
hosts and a simulated Slurm, so that thousands of fault schedules a minute meet the real
decision code (docs/design/simulation.md). Only the ranks are modelled there: the agent forks
them through :func:`ranks`, which is the real forker here and a model of a training rank there.

Why a seam of our own rather than monkeypatching: the simulator must be able to tell which of
its processes is asking (each has its own environment, signal handlers and host), and a
reader of the supervisor should see where the world comes in. Both sides use it (the login node
through the Slurm client and the run's record, in the job everything); stdlib only.
"""

from __future__ import annotations

import queue
import selectors
import subprocess
from collections.abc import Callable, Mapping, MutableMapping
from pathlib import Path
from typing import Any

from hpc_llm.world.real import Real
from hpc_llm.world.seam import Child, Thread

__all__ = ["Child", "Real", "Thread", "install", "current"]


_world: Any = Real()


def install(world: Any) -> Any:
    """Make ``world`` the one every call below goes to; returns the one it replaces."""
    global _world
    old, _world = _world, world
    return old


def current() -> Any:
    return _world


def time() -> float:
    return float(_world.time())


def monotonic() -> float:
    return float(_world.monotonic())


def sleep(seconds: float) -> None:
    _world.sleep(max(0.0, seconds))


def environ() -> MutableMapping[str, str]:
    env: MutableMapping[str, str] = _world.environ()
    return env


def pid() -> int:
    return int(_world.pid())


def hostname() -> str:
    return str(_world.hostname())


def local() -> dict[str, Any]:
    found: dict[str, Any] = _world.local()
    return found


def listener(host: str = "0.0.0.0", backlog: int = 4096) -> Any:
    return _world.listener(host, backlog)


def connect(host: str, port: int, timeout_s: float) -> Any:
    return _world.connect(host, port, timeout_s)


def connect_nowait(host: str, port: int) -> tuple[Any, int]:
    """A non-blocking socket connecting to ``host:port``, and connect_ex's error (0 or
    EINPROGRESS while it goes on)."""
    found: tuple[Any, int] = _world.connect_nowait(host, port)
    return found


def bindable(port: int) -> bool:
    return bool(_world.bindable(port))


def selector() -> selectors.BaseSelector:
    sel: selectors.BaseSelector = _world.selector()
    return sel


def thread(target: Callable[[], None], name: str) -> Thread:
    t: Thread = _world.thread(target, name)
    return t


def event_queue() -> queue.Queue[Any]:
    q: queue.Queue[Any] = _world.queue()
    return q


def popen(argv: list[str], env: Mapping[str, str], new_session: bool = False) -> Child:
    child: Child = _world.popen(argv, env, new_session)
    return child


def on_signal(signum: int, handler: Any) -> None:
    _world.on_signal(signum, handler)


def signal_wakeup() -> tuple[int, Callable[[], None]]:
    found: tuple[int, Callable[[], None]] = _world.signal_wakeup()
    return found


def kill(pid: int, sig: int) -> None:
    _world.kill(pid, sig)


def killpg(pgid: int, sig: int) -> None:
    _world.killpg(pgid, sig)


def execve(path: str, argv: list[str], env: Mapping[str, str]) -> None:
    _world.execve(path, argv, env)


def reap() -> list[tuple[int, int]]:
    found: list[tuple[int, int]] = _world.reap()
    return found


def ranks() -> Any:
    """How the agent gets its ranks (a :class:`hpc_llm.job.agent.ranks.RankRuntime`); None:
    forked for real (the simulator's world models them)."""
    return _world.ranks()


def which(name: str) -> str | None:
    found: str | None = _world.which(name)
    return found


def run(args: list[str], timeout: float, env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run a command to its end (raises subprocess.TimeoutExpired or OSError as subprocess.run does)."""
    out: subprocess.CompletedProcess[str] = _world.run(args, timeout, env)
    return out


def replace(src: Path, dst: Path) -> None:
    """``os.replace``: how a record file is put in place, atomically."""
    _world.replace(src, dst)


def redirect_output(path: Path) -> None:
    """This process's stdout and stderr appended to ``path`` from now on, its stdin /dev/null
    (left as they are when ``path`` cannot be opened)."""
    _world.redirect_output(path)


def shm_dir() -> Path | None:
    """Where a node's shared memory files go (/dev/shm), None where there is none."""
    found: Path | None = _world.shm_dir()
    return found
