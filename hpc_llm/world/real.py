"""The world as the operating system offers it: what :mod:`hpc_llm.world` answers in production.

Each method is the stdlib's own call, or a few lines of them (a signal's wake-up pipe, output
redirected to a file). Both sides use it: the login node through the Slurm client and the run's
record, the job through everything its control plane does. Stdlib only.
"""

from __future__ import annotations

import contextlib
import os
import queue
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time as _time
from collections.abc import Callable, Mapping, MutableMapping
from pathlib import Path
from typing import Any

from hpc_llm.world.seam import Child, Thread

#: what a process keeps for itself across modules (its epoch: hpc_llm.job.epoch)
_LOCAL: dict[str, Any] = {}


class Real:
    """The operating system, as the stdlib offers it."""

    # -- the clock
    def time(self) -> float:
        return _time.time()

    def monotonic(self) -> float:
        return _time.monotonic()

    def sleep(self, seconds: float) -> None:
        _time.sleep(seconds)

    # -- who this process is
    def environ(self) -> MutableMapping[str, str]:
        return os.environ

    def pid(self) -> int:
        return os.getpid()

    def hostname(self) -> str:
        return socket.gethostname()

    def local(self) -> dict[str, Any]:
        return _LOCAL

    # -- the network
    def listener(self, host: str, backlog: int) -> socket.socket:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((host, 0))
        s.listen(backlog)
        s.setblocking(False)
        return s

    def connect(self, host: str, port: int, timeout_s: float) -> socket.socket:
        return socket.create_connection((host, port), timeout=timeout_s)

    def connect_nowait(self, host: str, port: int) -> tuple[socket.socket, int]:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        return sock, sock.connect_ex((host, port))

    def bindable(self, port: int) -> bool:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("", port))
            except OSError:
                return False
        return True

    def selector(self) -> selectors.BaseSelector:
        return selectors.DefaultSelector()

    # -- threads and what they share
    def thread(self, target: Callable[[], None], name: str) -> Thread:
        return threading.Thread(target=target, name=name, daemon=True)

    def queue(self) -> queue.Queue[Any]:
        return queue.Queue()

    # -- processes and signals
    def popen(self, argv: list[str], env: Mapping[str, str], new_session: bool = False) -> Child:
        return subprocess.Popen(
            argv, env=dict(env), stderr=subprocess.PIPE, text=True, bufsize=1, start_new_session=new_session
        )

    def on_signal(self, signum: int, handler: Any) -> None:
        signal.signal(signum, handler)

    def signal_wakeup(self) -> tuple[int, Callable[[], None]]:
        """A file descriptor that turns readable when a signal arrives (select on it), and how to
        drain it."""
        r, w = os.pipe()
        os.set_blocking(w, False)
        os.set_blocking(r, False)
        signal.set_wakeup_fd(w, warn_on_full_buffer=False)

        def drain() -> None:
            with contextlib.suppress(BlockingIOError):
                os.read(r, 4096)

        return r, drain

    def kill(self, pid: int, sig: int) -> None:
        os.kill(pid, sig)

    def killpg(self, pgid: int, sig: int) -> None:
        os.killpg(pgid, sig)

    def execve(self, path: str, argv: list[str], env: Mapping[str, str]) -> None:
        signal.pthread_sigmask(signal.SIG_SETMASK, [])  # a mask outlives exec
        os.execve(path, argv, dict(env))

    def reap(self) -> list[tuple[int, int]]:
        """Children that ended since the last call: (pid, exit code as os.waitstatus_to_exitcode)."""
        out: list[tuple[int, int]] = []
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return out
            if pid == 0:
                return out
            out.append((pid, os.waitstatus_to_exitcode(status)))

    def ranks(self) -> Any:
        return None  # the agent forks real ranks (hpc_llm.job.agent.ranks.Forked)

    # -- commands (Slurm's client) and files
    def which(self, name: str) -> str | None:
        return shutil.which(name)

    def run(self, args: list[str], timeout: float, env: Mapping[str, str] | None) -> subprocess.CompletedProcess[str]:
        full = dict(env) if env is not None else None
        return subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=full, check=False)

    def replace(self, src: Path, dst: Path) -> None:
        os.replace(src, dst)

    def redirect_output(self, path: Path) -> None:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            null = os.open(os.devnull, os.O_RDONLY)
        except OSError:
            return  # the file it wrote to so far it is
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.dup2(null, 0)
        os.close(fd)
        os.close(null)

    def shm_dir(self) -> Path | None:
        shm = Path("/dev/shm")
        return shm if shm.is_dir() and os.access(shm, os.W_OK) else None
