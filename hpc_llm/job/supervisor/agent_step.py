"""The allocation's agent step (``srun ... python -m hpc_llm.job.agent``): start, kill, end.

In-job side, on the batch host. :class:`Step` starts the one srun step that
runs an agent on every node (:mod:`hpc_llm.job.agent`), with the
supervisor's address and token in its environment, and copies srun's stderr
into the batch log, keeping the lines that name failed tasks or nodes.
:func:`kill_step` is srun's own abort. The ranks themselves are not srun
tasks: the agents fork them, generation after generation, inside this one
step. Stdlib only.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys

from hpc_llm import world


def for_nodes(
    command: list[str], nodes: list[str], left_out: set[str] | frozenset[str] = frozenset(), overlap: bool = False
) -> list[str]:
    """The agent step's srun command for the nodes it may use now: one agent on each of ``nodes``
    (the allocation, as ``scontrol show job`` lists it) but those ``left_out``. The script
    renders ``--nodes=``/``--ntasks=`` with the count asked for at submit; a requeued job that
    was shrunk to fit its partition (hpc_llm.slurm.requeue.fit_partition) may have fewer nodes, and srun refuses
    a step larger than its allocation. A left-out node (dead, frozen, drained) gets no agent in
    a new step: ``--exclude``. ``overlap``: the step may share CPUs with the steps running
    (``--overlap``: a supervisor that took over runs inside the old agent step). Unchanged when
    ``command`` is no srun or ``nodes`` is unknown."""
    at = next((i for i, a in enumerate(command) if a.rsplit("/", 1)[-1] == "srun"), None)
    use = [n for n in nodes if n not in left_out]
    if at is None or not use:
        return list(command)
    out = list(command[: at + 1])
    options = True  # srun's own options come first (the script renders each as --name=value)
    for arg in command[at + 1 :]:
        options = options and arg.startswith("-")
        if options and arg.startswith(("--nodes=", "--ntasks=")):
            arg = f"{arg.split('=', 1)[0]}={len(use)}"
        out.append(arg)
    gone = sorted(set(nodes) & set(left_out))
    if gone:
        out.insert(at + 1, f"--exclude={','.join(gone)}")
    if overlap:
        out.insert(at + 1, "--overlap")
    return out


def rendered_nodes(command: list[str]) -> int | None:
    """The ``--nodes=`` of the agent step's srun as the script renders it: the allocation the run
    was submitted with (its nodes and spares). None when ``command`` has none."""
    at = next((i for i, a in enumerate(command) if a.rsplit("/", 1)[-1] == "srun"), None)
    for arg in command[at + 1 :] if at is not None else []:
        if not arg.startswith("-"):
            break
        if arg.startswith("--nodes=") and arg.removeprefix("--nodes=").isdigit():
            return int(arg.removeprefix("--nodes="))
    return None


class Step:
    """A running srun step and the srun error lines seen on its stderr so far."""

    def __init__(self, command: list[str], env: dict[str, str]) -> None:
        # srun in a session of its own, with the shepherd it forks: abandon() kills both at once
        self.proc = world.popen(command, env, new_session=True)
        self.errors: list[str] = []
        self._pump = world.thread(lambda: pump_stderr(self.proc, self.errors), "hpc_llm-srun-stderr")
        self._pump.start()

    @property
    def running(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        kill_step(self.proc)

    def abandon(self) -> None:
        """Let go of the step without ending it: SIGKILL srun and its shepherd together (its process
        group). srun killed alone leaves its shepherd, which asks slurmctld to kill the step
        (src/srun/srun_job.c, _shepherd_spawn), and srun's own abort (two SIGINTs) or its SIGTERM
        handler kill the step on every node: a step the supervisor that took this one's place was
        exec'd in, on a host cut off and healed (issue #50's first defect)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            world.killpg(self.proc.pid, signal.SIGKILL)

    def wait(self, timeout: float | None = None) -> int | None:
        """srun's exit status, once its stderr has reached the batch log (None: still running)."""
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None
        self._pump.join(timeout=10)
        return self.proc.returncode


def pump_stderr(proc: world.Child, keep: list[str]) -> None:
    """srun's stderr to ours (the batch log), keeping the lines that name failed tasks."""
    if proc.stderr is None:
        return
    for line in proc.stderr:
        sys.stderr.write(line)
        sys.stderr.flush()
        if "srun: error" in line or "NODE_FAIL" in line or "Node failure" in line:
            keep.append(line.rstrip("\n"))


def send_signal(proc: world.Child, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(sig)


def kill_step(proc: world.Child) -> None:
    """srun's own abort: two interrupts within a second SIGKILL every task, frozen ones too."""
    send_signal(proc, signal.SIGINT)
    world.sleep(0.3)
    send_signal(proc, signal.SIGINT)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
