"""An orphaned agent takes the lost supervisor's place in the same allocation: no requeue.

A job with spares runs with ``sbatch --no-kill``; when its batch host is lost (dead, or cut off
from the fabric), Slurm calls it DOWN after SlurmdTimeout, takes it out of the job and keeps the
job RUNNING on the nodes left, without a batch script (``kill_running_job_by_node_name`` takes
the ``--no-kill`` branch; the agent step, ``srun --no-kill``, lives on there too). A requeue then
costs what Slurm makes it cost: the job waits until the host is DOWN and cred_expire has passed,
and its new allocation starts cold (47 s from the cut to training again on the 24.11 dev
cluster). Instead, the first orphaned agent alive, once slurmctld confirms the supervisor's host
is gone, becomes the supervisor (:func:`take_over`): it claims the next command of the
allocation (the run's epoch, :mod:`hpc_llm.rundir.epoch`: one file created with ``O_EXCL``, so
one agent wins and every other process of the job, the lost supervisor come back included, is
refused from then on), and starts the supervisor's own command line (the supervisor puts it in
the agent step's environment, :data:`wire.TAKEOVER`) on its own node, in a step of its own (this
process execs ``srun --overlap`` for it: the new supervisor outlives the old agent step), with:

- ``MASTER_ADDR`` its node's address (the new agents' supervisor);
- :data:`wire.TAKEN_OVER_FROM` the lost node, and the command it claimed
  (:data:`hpc_llm.rundir.epoch.CLAIMED_ENV`, which the new supervisor adopts): the new supervisor
  books the lost attempt (cause ``node_failure``, that node the only suspect, a swap) and starts a
  new agent step without it (``srun --overlap --exclude=...``: the old step still holds the
  nodes' CPUs), where a spare takes the lost node's rank;
- its output in its own log, ``logs/slurm-<job>.<restart>.<node>.out``.

Verified on the 24.11 dev cluster with nodes as hosts (docs/design/verified/slurm.md): a step
started so from a task of a ``--no-kill`` step ran on the two other nodes while the batch host was
cut off, and both steps lived on after Slurm took the host out of the job.

A job whose batch script is gone ends only by ``scancel``: the new supervisor cancels its own job
when the run is done or failed (its record says which). Not possible where ``srun`` or the
supervisor's Python is missing (an agent inside a container): the agent requeues the job
instead, and the record says why no agent took over (``supervisor_lost.json``'s
``takeover_refused``). Stdlib only.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from pathlib import Path

from hpc_llm import world
from hpc_llm.job import wire
from hpc_llm.job.env import SRUN_TASK_VARS
from hpc_llm.rundir import epoch
from hpc_llm.rundir.layout import RunDir
from hpc_llm.rundir.record import write_json
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


def take_over(
    argv: list[str], run_dir: Path, job_ref: str, restart: int, node: str, lost: str, seen: dict[str, object]
) -> None:
    """Become the supervisor (see the module's docstring); returns only if ``exec`` failed. ``seen``
    is what the agent found (how the supervisor was lost, when): the new supervisor books it.

    The supervisor runs in a step of its own, not in this agent's task of the old agent step:
    this process execs ``srun`` for it, on this node (``--overlap``: the old step holds the
    node's CPUs). Whatever ends the old step later (the lost supervisor's srun on a host that
    heals, or Slurm killing the step there) kills this srun, and with it its shepherd, in the
    same process tree: the new step, and the supervisor in it, live on (issue #50: a supervisor
    exec'd in the old step died with it, and the job stayed RUNNING with nothing alive)."""
    rd = RunDir(run_dir)
    holder = epoch.held()
    with contextlib.suppress(OSError, epoch.Refused):
        write_json(rd.supervisor_lost, {**seen, "taken_over_at": world.time()})
    env = {k: v for k, v in world.environ().items() if k not in SRUN_TASK_VARS}
    env[wire.TAKEN_OVER_FROM] = lost
    if holder is not None:
        env[epoch.CLAIMED_ENV] = f"{holder.epoch.restart}.{holder.epoch.takeover}"
    here = allocation.slurmd_addresses([node]).get(node)
    env["MASTER_ADDR"] = here[0] if here else node
    for name in (wire.SUPERVISOR, wire.TOKEN, wire.SUPERVISOR_NODE, wire.TAKEOVER, wire.SILENT_S):
        env.pop(name, None)
    out = rd.takeover_log(job_ref, restart, node)
    log.warning(
        "hpc_llm agent on %s: the supervisor on %s is lost: taking its place in this allocation (log: %s)",
        node,
        lost,
        out,
    )
    srun = world.which("srun")
    if srun is None:
        log.error("hpc_llm agent on %s: could not start the supervisor: no srun here", node)
        return
    step = [
        srun,
        "--overlap",
        "--nodes=1",
        "--ntasks=1",
        f"--nodelist={node}",
        "--no-kill",
        "--kill-on-bad-exit=0",
        "--export=ALL",
        f"--output={out}",
        "--open-mode=append",
    ]
    world.redirect_output(out)
    exe = argv[0] if os.path.isfile(argv[0]) else (world.which(argv[0]) or argv[0])
    try:
        world.execve(srun, [*step, exe, *argv[1:]], env)
    except OSError as exc:
        log.error("hpc_llm agent on %s: could not start the supervisor: %s", node, exc)
