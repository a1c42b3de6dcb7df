"""A stand-in for ``srun`` in tests that run the supervisor and its agents off Slurm.

``python -m tests.local_srun N <command...>`` starts ``N`` copies of the command,
copy ``k`` with the variables srun gives the task of node ``k`` of a one-task-
per-node step (``SLURMD_NODENAME=n<k+1>``, ``SLURM_NODEID``, ``SLURM_PROCID``,
``SLURM_LOCALID=0``), its output in ``$LOCAL_SRUN_LOGS/agent<k>.log`` when set,
and waits for all of them. Each copy runs in its own process group, as a node's
tasks do under slurmstepd, so a test can kill or freeze "a node" (the agent and
every rank it forked) with one ``killpg``; their pids are in
``$LOCAL_SRUN_LOGS/pids``. Like srun, a second SIGINT within a second kills
every task. It is a stand-in because the real srun needs a Slurm allocation:
the tests of tests/test_faults.py run the real one on the dev cluster.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def main() -> int:
    n, command = int(sys.argv[1]), sys.argv[2:]
    logs = os.environ.get("LOCAL_SRUN_LOGS")
    procs = []
    for k in range(n):
        env = dict(os.environ, SLURMD_NODENAME=f"n{k + 1}", SLURM_NODEID=str(k), SLURM_PROCID=str(k), SLURM_LOCALID="0")
        out = open(Path(logs) / f"agent{k}.log", "ab") if logs else None  # noqa: SIM115 - the child's, for its life
        procs.append(subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True))
    if logs:
        (Path(logs) / "pids").write_text(" ".join(str(p.pid) for p in procs))
    interrupts: list[float] = []

    def on_int(signum: int, frame: object) -> None:
        interrupts.append(time.monotonic())
        if len(interrupts) >= 2 and interrupts[-1] - interrupts[-2] < 1.0:
            for p in procs:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)

    def on_term(signum: int, frame: object) -> None:
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)

    signal.signal(signal.SIGINT, on_int)
    signal.signal(signal.SIGTERM, on_term)
    codes = [p.wait() for p in procs]
    return max((abs(c) for c in codes), default=0)


if __name__ == "__main__":
    sys.exit(main())
