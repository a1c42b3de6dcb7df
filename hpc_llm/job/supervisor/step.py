"""One training step (``srun ...``) as the supervisor drives it: start, signal, kill, end.

In-job side, on the batch host. :class:`Step` starts the step's srun with the
step's environment and copies srun's stderr into the batch log, keeping the
lines that name failed tasks or nodes (the supervisor classifies the end with
them). :func:`send_signal` passes a stop signal to srun, which forwards it to
every task; :func:`kill_step` is srun's own abort. :class:`StepEnd` is what
the supervisor saw of one step, the input of its decision. :func:`ready_count`
counts the ranks that have their stop-signal handler, so a stop is only
forwarded once none would die of it. Stdlib only.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from hpc_llm.rundir.layout import RunDir


def ready_count(run_dir: Path, tag: str) -> int:
    rd = RunDir(run_dir)
    return len(list(rd.ready.glob(rd.ready_marker(tag, "*").name))) if rd.ready.is_dir() else 0


@dataclass
class StepEnd:
    """How one srun step ended, as seen from the batch host."""

    returncode: int
    srun_errors: list[str]
    #: stop signal forwarded to the ranks, when the supervisor got it, and why Slurm sent it
    stop: str | None = None
    stop_time: float | None = None
    stop_cause: str | None = None
    #: stop_cause is Slurm's answer, not the guess made from the cached end time
    stop_cause_asked: bool = False
    #: named hang: (reason, nodes)
    hang: tuple[str, tuple[str, ...]] | None = None
    terminated: bool = False
    #: the start-up phase that outlived fault.startup_timeout_s
    startup: str | None = None
    #: the highest batch any rank's heartbeat reported, and seconds from its first to its last batch
    top_batch: int = -1
    heartbeat_train_s: float = 0.0


class Step:
    """A running srun step and the srun error lines seen on its stderr so far."""

    def __init__(self, command: list[str], env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True, bufsize=1)
        self.errors: list[str] = []
        self._pump = threading.Thread(target=pump_stderr, args=(self.proc, self.errors), daemon=True)
        self._pump.start()

    @property
    def running(self) -> bool:
        return self.proc.poll() is None

    def send(self, sig: int) -> None:
        send_signal(self.proc, sig)

    def kill(self) -> None:
        kill_step(self.proc)

    def wait(self) -> int:
        """srun's exit status, once its stderr has reached the batch log (or 10 s have passed)."""
        self._pump.join(timeout=10)
        return self.proc.returncode


def pump_stderr(proc: subprocess.Popen[str], keep: list[str]) -> None:
    """srun's stderr to ours (the batch log), keeping the lines that name failed tasks."""
    if proc.stderr is None:
        return
    for line in proc.stderr:
        sys.stderr.write(line)
        sys.stderr.flush()
        if "srun: error" in line or "NODE_FAIL" in line or "Node failure" in line:
            keep.append(line.rstrip("\n"))


def send_signal(proc: subprocess.Popen[str], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(sig)


def kill_step(proc: subprocess.Popen[str]) -> None:
    """srun's own abort: two interrupts within a second SIGKILL every task, frozen ones too."""
    send_signal(proc, signal.SIGINT)
    time.sleep(0.3)
    send_signal(proc, signal.SIGINT)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
