"""The batch script's own logic, run by bash here: the supervisor is its child, gets the stop signal
and SIGTERM passed on, and is started again when it dies of a signal (never when it exits with its
own status, nor after Slurm's SIGTERM). The script is the one hpc_llm renders
(sbatch_templates/default.sh.j2), with a stand-in supervisor: a few lines of Python that do what
the test needs (die, exit, note the signals they get). Slurm is not needed for this: the script
runs under bash as slurmstepd would run it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from hpc_llm.launch.sbatch.render import SUPERVISOR_RESTARTS, SbatchSpec, render

#: the stand-in: each start notes itself; what it does then is the test's (STANDIN_PLAN: one word
#: per start, "kill" = SIGKILL itself, "exit<N>" = exit N, "wait" = until a signal, then exit 0)
STANDIN = textwrap.dedent(
    """
    import os, signal, sys, time
    out = os.environ["STANDIN_OUT"]
    starts = open(out).read().split() if os.path.exists(out) else []
    n = len(starts)
    with open(out, "a") as f:
        restarts = os.environ.get('HPC_LLM_SUPERVISOR_RESTARTS')
        f.write(f"start{restarts}:{os.environ.get('HPC_LLM_SUPERVISOR_DIED', '-')}\\n")
    plan = os.environ["STANDIN_PLAN"].split(",")
    what = plan[min(n, len(plan) - 1)]
    got = []
    def note(sig, frame):
        got.append(sig)
        with open(out, "a") as f:
            f.write(f"signal{sig}\\n")
    signal.signal(signal.SIGUSR2, note)
    signal.signal(signal.SIGTERM, note)
    with open(out + ".ready", "w"):
        pass
    if what == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if what.startswith("exit"):
        sys.exit(int(what[4:]))
    while not got:
        time.sleep(0.05)
    sys.exit(0)
    """
)


def script(tmp_path: Path) -> Path:
    standin = tmp_path / "standin.py"
    standin.write_text(STANDIN)
    run_dir = tmp_path / "run"
    (run_dir / "logs").mkdir(parents=True)
    spec = SbatchSpec(
        run_dir=str(run_dir),
        cluster="test",
        template="default.sh.j2",
        flags={"job_name": "t"},
        srun_args=["--nodes=1"],
        command=["true"],
        supervisor=[sys.executable, str(standin)],
        stop_signal="USR2",
    )
    path = tmp_path / "sbatch.sh"
    path.write_text(render(spec))
    return path


def run(tmp_path: Path, plan: str, then=None) -> tuple[int, list[str]]:
    """Run the script with the stand-in's ``plan``; ``then(proc)`` once the first start is up."""
    out = tmp_path / "standin.out"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "HPC_LLM_"))}
    env.update(STANDIN_OUT=str(out), STANDIN_PLAN=plan, SLURM_JOB_ID="7", SLURM_RESTART_COUNT="0", PATH="/usr/bin:/bin")
    proc = subprocess.Popen(["bash", str(script(tmp_path))], env=env)
    if then is not None:
        deadline = time.monotonic() + 30
        while not Path(str(out) + ".ready").exists():
            assert time.monotonic() < deadline, "the supervisor never started"
            time.sleep(0.05)
        then(proc)
    code = proc.wait(timeout=60)
    return code, out.read_text().split()


def test_a_supervisor_that_dies_of_a_signal_is_started_again_and_its_exit_is_the_jobs(tmp_path):
    code, notes = run(tmp_path, "kill,exit0")
    assert code == 0
    assert notes == ["start0:-", "start1:137"]


def test_a_supervisor_that_exits_with_its_own_status_is_not_started_again(tmp_path):
    code, notes = run(tmp_path, "exit1")
    assert code == 1 and notes == ["start0:-"]


def test_restarts_are_bounded(tmp_path):
    code, notes = run(tmp_path, "kill")
    assert code == 137 and len(notes) == SUPERVISOR_RESTARTS + 1


def test_the_stop_signal_sent_to_the_batch_shell_reaches_the_supervisor(tmp_path):
    code, notes = run(tmp_path, "wait", then=lambda p: p.send_signal(signal.SIGUSR2))
    assert code == 0 and notes == ["start0:-", f"signal{int(signal.SIGUSR2)}"]


def test_after_slurms_sigterm_the_supervisor_is_not_started_again(tmp_path):
    def term(proc: subprocess.Popen[bytes]) -> None:
        proc.send_signal(signal.SIGTERM)

    code, notes = run(tmp_path, "wait,exit0", then=term)
    assert code == 0 and notes == ["start0:-", f"signal{int(signal.SIGTERM)}"]


@pytest.mark.parametrize("plan", ["kill,wait"])
def test_a_restarted_supervisor_still_gets_the_stop_signal(tmp_path, plan):
    out = tmp_path / "standin.out"

    def usr2_after_restart(proc: subprocess.Popen[bytes]) -> None:
        deadline = time.monotonic() + 30
        while "start1" not in (out.read_text() if out.exists() else ""):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        time.sleep(0.5)  # its handler installed
        proc.send_signal(signal.SIGUSR2)

    code, notes = run(tmp_path, plan, then=usr2_after_restart)
    assert code == 0 and notes == ["start0:-", "start1:137", f"signal{int(signal.SIGUSR2)}"]
