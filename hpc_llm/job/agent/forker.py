"""The agent's ranks: forked from the warm agent, one process group each, reaped and killed.

:func:`fork_rank` turns a fork of the agent into rank ``r`` of generation
``G``: its own session and process group (so that killing the group ends the
rank and every process it started, Composer's upload workers and DataLoader
workers included), the signal dispositions of a fresh process, none of the
agent's sockets, its stdout and stderr in ``logs/rank<r>.log``, torch's
variables for rank ``r`` (``RANK``, ``WORLD_SIZE``, ...; srun's task variables,
which describe the agent's own task, taken out) plus the generation's, its
board slot for heartbeats and the fence, and then the job's
entry point (:func:`hpc_llm.job.rank.entry.run_payload`) on the payload the
agent read. The stop signal is blocked across the fork and unblocked once the
rank's own handler is installed: a stop signal is never lost and never kills
a rank at start-up.

A rank leaves through :func:`_leave`: ``atexit`` handlers (the rank's own and
those of the modules the agent imported, as in any process that imported
them), stdio flushed, then ``os._exit``: the agent's stack, which the child
shares, is never unwound in it.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import signal
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpc_llm.job import heartbeat
from hpc_llm.job.env import SRUN_TASK_VARS

log = logging.getLogger("hpc_llm.agent")

#: blocked across a fork: the rank installs its own handlers before it takes them
BLOCKED = {signal.SIGUSR2, signal.SIGTERM, signal.SIGINT, signal.SIGCHLD}


@dataclass
class RankProc:
    gen: int
    rank: int
    local_rank: int
    pid: int
    #: the exit status (os.waitstatus_to_exitcode: negative for a signal) once reaped
    status: int | None = None
    #: the agent killed it (the supervisor ended the generation): not a failure of its own
    killed: bool = False

    @property
    def alive(self) -> bool:
        return self.status is None


def fork_rank(
    *,
    payload: Any,
    payload_path: Path,
    board: heartbeat.Board,
    gen: int,
    rank: int,
    local_rank: int,
    env: dict[str, str],
    log_path: Path,
    close_fds: list[int],
) -> int:
    """Fork rank ``rank`` (local rank ``local_rank``) of generation ``gen``; the child's pid."""
    sys.stdout.flush()
    sys.stderr.flush()
    board.clear(local_rank)
    old = signal.pthread_sigmask(signal.SIG_BLOCK, BLOCKED)
    pid = os.fork()
    if pid:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
        return pid
    code = 1
    try:
        _become_rank(board, gen, local_rank, env, log_path, close_fds, old)
        from hpc_llm.job.rank import entry

        entry.configure_logging()
        entry.run_payload(payload_path, payload)
        code = 0
    except SystemExit as exc:
        code = _exit_code(exc.code)
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        _leave(code)
    return 0  # never reached: _leave exits


def _become_rank(
    board: heartbeat.Board,
    gen: int,
    local_rank: int,
    env: dict[str, str],
    log_path: Path,
    close_fds: list[int],
    mask: Any,
) -> None:
    os.setsid()
    with contextlib.suppress(ValueError):
        signal.set_wakeup_fd(-1)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD, signal.SIGUSR2, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
    for fd in close_fds:
        with contextlib.suppress(OSError):
            os.close(fd)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    out = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.close(out)
    for key in SRUN_TASK_VARS:  # the agent's own place in its srun step, not the rank's
        os.environ.pop(key, None)
    os.environ.update(env)
    heartbeat.attach(board, local_rank, gen)
    if board.path is not None:  # for the processes the rank spawns (their fence)
        os.environ[heartbeat.BOARD_ENV] = f"{board.path}:{local_rank}:{gen}"
    # the agent's logging handlers write to the agent's log: the rank configures its own
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    from hpc_llm.job.rank import preemption

    preemption.install()
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)


def _exit_code(code: Any) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def _leave(code: int) -> None:
    try:
        atexit._run_exitfuncs()
    except BaseException:
        traceback.print_exc()
    with contextlib.suppress(Exception):
        logging.shutdown()
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)


def kill_group(pid: int, sig: int = signal.SIGKILL) -> None:
    """Signal a rank's whole process group (it leads its own: the rank and what it started)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def describe_status(status: int) -> str:
    """A rank's end in words, for the records: ``status`` as os.waitstatus_to_exitcode gives it."""
    if status < 0:
        sig = signal.Signals(-status).name if -status in signal.Signals._value2member_map_ else f"signal {-status}"
        return f"killed by {sig}"
    return f"exited with {status}"
