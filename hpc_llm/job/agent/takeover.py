"""An orphaned agent takes the lost supervisor's place in the same allocation: no requeue.

A job with spares runs with ``sbatch --no-kill``; when its batch host is lost (dead, or cut off
from the fabric), Slurm calls it DOWN after SlurmdTimeout, takes it out of the job and keeps the
job RUNNING on the nodes left, without a batch script (``kill_running_job_by_node_name`` takes
the ``--no-kill`` branch; the agent step, ``srun --no-kill``, lives on there too). A requeue then
costs what Slurm makes it cost: the job waits until the host is DOWN and cred_expire has passed,
and its new allocation starts cold (47 s from the cut to training again on the 24.11 dev
cluster). Instead, the first orphaned agent alive, once slurmctld confirms the supervisor's host
is gone, becomes the supervisor (:func:`take_over`): it execs the supervisor's own command
line (the supervisor puts it in the agent step's environment, :data:`wire.TAKEOVER`) on its own
node, in its own task of the agent step, with:

- ``MASTER_ADDR`` its node's address (the new agents' supervisor);
- :data:`wire.TAKEN_OVER_FROM` the lost node: the new supervisor books the lost attempt (cause
  ``node_failure``, that node the only suspect, a swap) and starts a new agent step without it
  (``srun --overlap --exclude=...``: the old step still holds the nodes' CPUs, its own task among
  them), where a spare takes the lost node's rank;
- its output in its own log, ``logs/slurm-<job>.<restart>.<node>.out``.

Verified on the 24.11 dev cluster with nodes as hosts (docs/design/verified/slurm.md): a step
started so from a task of a ``--no-kill`` step ran on the two other nodes while the batch host was
cut off, and both steps lived on after Slurm took the host out of the job.

One agent takes over: the claim is a file created with ``O_EXCL`` in the run's private directory
(:meth:`RunDir.takeover_claim`); the others find it and end. The supervisor lost, if it comes back
(a frozen host thawed), finds it too and stands aside (``SupervisorState.superseded``). A job
whose batch script is gone ends only by ``scancel``: the new supervisor cancels its own job when
the run is done or failed (its record says which). Not possible where ``srun`` or the
supervisor's Python is missing (an agent inside a container): the agent requeues the job as before.
Stdlib only.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from pathlib import Path

from hpc_llm import world
from hpc_llm.job import wire
from hpc_llm.rundir.layout import RunDir
from hpc_llm.slurm import allocation

log = logging.getLogger("hpc_llm.agent")


def command() -> list[str] | None:
    """The supervisor's command line, as it told the agent step (None: no takeover offered)."""
    try:
        argv = json.loads(world.environ().get(wire.TAKEOVER) or "null")
    except ValueError:
        return None
    ok = isinstance(argv, list) and argv and all(isinstance(a, str) for a in argv)
    return argv if ok else None


def supervisor_node() -> str | None:
    """The node the supervisor runs on, as it told the agent step (the batch host at first)."""
    return world.environ().get(wire.SUPERVISOR_NODE) or None


def why_not(argv: list[str] | None, nodes: list[str], lost: str, needed: int) -> str | None:
    """Why this agent cannot take the supervisor's place (None: it can): ``nodes`` is the job's
    node list as slurmctld has it, ``lost`` the supervisor's node, ``needed`` the nodes the run
    trains on."""
    if argv is None:
        return "the supervisor offered no takeover"
    if world.which("srun") is None or world.which("scontrol") is None:
        return "no srun or scontrol here (inside a container?)"
    if not (os.path.isfile(argv[0]) or world.which(argv[0])):
        return f"the supervisor's Python {argv[0]} is not here"
    left = [n for n in nodes if n != lost]
    if len(left) < needed:
        return f"{len(left)} node(s) left and the run needs {needed}"
    return None


def claim(run_dir: Path, job_id: str, restart: int, lost: str, by: str) -> str | None:
    """Claim the takeover of ``lost``'s supervisor for this agent: None when it is ours, else the
    node that claimed it first."""
    path = RunDir(run_dir).takeover_claim(job_id, restart, lost)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        with contextlib.suppress(OSError):
            return path.read_text().strip() or "?"
        return "?"
    with os.fdopen(fd, "w") as f:
        f.write(by)
    return None


def claimed_by(run_dir: Path, job_id: str, restart: int, lost: str) -> str | None:
    """The node that took over from ``lost``'s supervisor in this allocation, if one did."""
    with contextlib.suppress(OSError):
        return RunDir(run_dir).takeover_claim(job_id, restart, lost).read_text().strip() or "?"
    return None


def take_over(
    argv: list[str], run_dir: Path, job_ref: str, restart: int, node: str, lost: str, seen: dict[str, object]
) -> None:
    """Become the supervisor (see the module's docstring); returns only if ``exec`` failed. ``seen``
    is what the agent found (how the supervisor was lost, when): the new supervisor books it."""
    rd = RunDir(run_dir)
    with contextlib.suppress(OSError):
        rd.supervisor_lost.write_text(json.dumps({**seen, "taken_over_at": world.time()}))
    env = dict(world.environ())
    env[wire.TAKEN_OVER_FROM] = lost
    here = allocation.slurmd_addresses([node]).get(node)
    env["MASTER_ADDR"] = here[0] if here else node
    for name in (wire.SUPERVISOR, wire.TOKEN, wire.SUPERVISOR_NODE, wire.TAKEOVER, wire.SILENT_S):
        env.pop(name, None)
    log.warning(
        "hpc_llm agent on %s: the supervisor on %s is lost: taking its place in this allocation (log: %s)",
        node,
        lost,
        rd.takeover_log(job_ref, restart, node),
    )
    world.redirect_output(rd.takeover_log(job_ref, restart, node))
    try:
        exe = argv[0] if os.path.isfile(argv[0]) else (world.which(argv[0]) or argv[0])
        world.execve(exe, argv, env)
    except OSError as exc:
        log.error("hpc_llm agent on %s: could not start the supervisor: %s", node, exc)
