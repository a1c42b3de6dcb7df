"""What a submit checks with Slurm before anything exists, in one place: the
launcher's submit path and its dry run call these (and ``hpc-llm doctor`` will).

- :func:`placement`: the partition exists (or there is a default) and can hold
  the job's nodes and CPUs per node;
- :class:`SchedulerVerdicts`: ``sbatch --test-only`` once per distinct job shape,
  the real scheduler's verdict on GPUs, memory, QOS, account and limits.
Each problem is one ConfigError line naming the key and what is allowed.
"""

from __future__ import annotations

from typing import Any

from hpc_llm.errors import ConfigError, warn_once
from hpc_llm.launch.sbatch import submit
from hpc_llm.launch.sbatch.render import SbatchSpec
from hpc_llm.slurm import parse, query

#: sbatch --test-only's refusal of a job larger than the nodes up now (and of an impossible one)
NOT_AVAILABLE = "Requested node configuration is not available"
#: the #SBATCH flags a refusal names, in the order a person reads them
_ASKED = ("partition", "nodes", "ntasks_per_node", "gpus_per_node", "cpus_per_task", "mem", "qos", "account", "time")


def placement(parts: dict[str, parse.Partition], partition: str | None, res: Any, key: str) -> parse.Partition:
    """The partition a job goes to, after checking it can hold the job (``key``: the config
    node of its resources, for the message)."""
    if partition is None:
        part = query.default_partition(parts)
        if part is None:
            raise ConfigError(
                "this cluster has no default partition; set hydra.launcher.partition; "
                f"allowed: {', '.join(sorted(parts))}"
            )
    elif partition not in parts:
        raise ConfigError(
            f"partition '{partition}' does not exist on this cluster; allowed: {', '.join(sorted(parts))}"
        )
    else:
        part = parts[partition]
    spares = int(getattr(res, "spare_nodes", 0) or 0)
    if res.nodes + spares > part.nodes:
        asked = f"{key}.nodes={res.nodes}" + (f" + {key}.spare_nodes={spares}" if spares else "")
        raise ConfigError(f"{asked} is more than partition '{part.name}' has ({part.nodes} nodes)")
    cpus = res.tasks_per_node * res.cpus_per_task
    if part.cpus_per_node and cpus > part.cpus_per_node:
        raise ConfigError(
            f"{key}.tasks_per_node={res.tasks_per_node} x {key}.cpus_per_task={res.cpus_per_task} "
            f"= {cpus} CPUs per node, but nodes of partition '{part.name}' have {part.cpus_per_node}"
        )
    return part


#: the Slurm release spares need: 23.02.3 fixed later steps unable to use the resources left after a
#: --no-kill node loss, 23.02.6 the extern step killed on every node (which breaks
#: job_container/tmpfs, used by the dev cluster); Slurm's NEWS
SPARES_SINCE = (23, 2, 6)


def parse_release(text: str | None) -> tuple[int, int, int] | None:
    """``24.11.5`` / ``22.05.8`` (scontrol show config's SLURM_VERSION) -> (24, 11, 5)."""
    parts = (text or "").strip().split(".")
    if len(parts) < 2 or not all(p.isdigit() for p in parts[:3]):
        return None
    return int(parts[0]), int(parts[1]), int(parts[2]) if len(parts) > 2 else 0


def spares_refused(res: Any, key: str, version: str | None) -> str | None:
    """Why ``<key>.spare_nodes`` (or a ``<key>.min_nodes`` below ``nodes``: both run the job with
    ``--no-kill``) cannot be used on a Slurm of ``version`` (None: it can, or neither asked)."""
    spares = int(getattr(res, "spare_nodes", 0) or 0)
    least = getattr(res, "min_nodes", None)
    shrinks = least is not None and least < res.nodes
    release = parse_release(version)
    if not (spares or shrinks) or (release is not None and release >= SPARES_SINCE):
        return None
    since = "{}.{:02d}.{}".format(*SPARES_SINCE)
    asked, allowed = (
        (f"{key}.spare_nodes={spares}", f"{key}.spare_nodes=0")
        if spares
        else (f"{key}.min_nodes={least}", f"{key}.min_nodes=null")
    )
    return (
        f"{asked} needs Slurm >= {since} (fixes to --no-kill), but this cluster runs "
        f"Slurm {version or '(unknown)'}; allowed here: {allowed}"
    )


def spare_nodes(res: Any, key: str) -> None:
    """Refuse spares, or a run that goes on with fewer nodes, on a Slurm too old for ``--no-kill``
    (asks slurmctld only when one of them is asked for)."""
    if getattr(res, "no_kill", False) or int(getattr(res, "spare_nodes", 0) or 0):
        why = spares_refused(res, key, query.show_config().get(parse.VERSION_KEY))
        if why:
            raise ConfigError(why)


class SchedulerVerdicts:
    """``sbatch --test-only`` answers, asked once per job shape (each call uses up a job id)."""

    def __init__(self) -> None:
        self._verdicts: dict[tuple[tuple[str, str], ...], str | None] = {}

    def check(self, spec: SbatchSpec, job_num: object) -> None:
        key = submit.shape(spec)
        if key not in self._verdicts:
            self._verdicts[key] = self._ask(dict(spec.flags))
        reason = self._verdicts[key]
        if reason:
            asked = " ".join(
                f"--{k.replace('_', '-')}={v}" for k, v in sorted(spec.flags.items()) if k in _ASKED and v is not None
            )
            raise ConfigError(f"Slurm would refuse job {job_num} ({asked}): {reason}; nothing was submitted")

    @staticmethod
    def _ask(flags: dict[str, object]) -> str | None:
        """Slurm's verdict on a job of these flags. ``--test-only`` counts only the nodes up now:
        with nodes DOWN or DRAINED it refuses a job of more nodes than are left ("Requested node
        configuration is not available") that a real sbatch queues ("Nodes required for job are
        DOWN, DRAINED or reserved"; both seen on the dev cluster, 22.05). A job refused so is
        asked again on one node: if one node of its shape is fine, the count is what was refused,
        and :func:`placement` has checked it against the partition's configured nodes."""
        reason = query.test_only(flags)
        nodes = int(str(flags.get("nodes") or 1))
        if reason and NOT_AVAILABLE in reason and nodes > 1 and query.test_only({**flags, "nodes": 1}) is None:
            warn_once(
                f"--nodes={nodes}: fewer nodes than that are up now (DOWN or DRAINED) in the job's "
                "partition; it will wait in the queue for them"
            )
            return None
        return reason
