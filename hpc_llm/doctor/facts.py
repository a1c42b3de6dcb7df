"""What ``hpc-llm doctor`` checks against: :class:`Needs`, what the composed job asks of the
cluster, and :class:`Facts`, what Slurm and the probe job said (parsed). Plain data; the checks
read it and :mod:`hpc_llm.doctor.gather` fills it in.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from hpc_llm.doctor.probe import Probe
from hpc_llm.slurm import parse, query


@dataclass(frozen=True)
class Needs:
    """What the composed job asks of the cluster."""

    #: hydra.launcher.partition or cluster.partition; None: the default partition
    partition: str | None
    nodes: int = 1
    tasks_per_node: int = 1
    cpus_per_task: int = 1
    gpus_per_node: int = 0
    #: resources.gpu_type: a GRES type the nodes must have (None: any GPU)
    gpu_type: str | None = None
    time_s: int = 3600
    #: resources.spare_nodes: warm nodes beside the training nodes (--no-kill)
    spare_nodes: int = 0
    #: the config node of the resources (for messages)
    resources_key: str = "resources"
    #: the batch script asks --requeue
    requeue: bool = True
    #: the batch script's --signal (B:USR2@120), None without one (fault.enabled=false)
    signal: str | None = "B:USR2@120"
    run_dir: str = ""
    #: an existing run dir given with --run, checked from the node too
    run: str | None = None
    #: the Python the batch script runs (the supervisor; every rank without a container)
    python: tuple[str, ...] = ()
    container: str = "none"
    #: the container image the tasks run in (or --image), checked from the node
    image: str | None = None
    apptainer: str = "apptainer"
    #: the enroot the probe asks for its version (container.executable with container=pyxis)
    enroot: str = "enroot"
    #: the longest checkpoint save, and where that figure comes from
    save_s: float | None = None
    save_from: str = ""
    hang_timeout_s: float | None = 1800.0
    #: the #SBATCH flags ``sbatch --test-only`` was asked about (for the row)
    asked: str = ""
    #: what the store check asks of the job's object stores, as JSON (empty: it uses none)
    stores: str = ""


@dataclass(frozen=True)
class Facts:
    """What Slurm said (parsed), and the probe job's report."""

    config: Mapping[str, str]
    partitions: Mapping[str, parse.Partition]
    partition_info: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    nodes: Sequence[parse.Node] = ()
    #: None: sacct answered; else why it did not
    accounting: str | None = None
    #: None: ``sbatch --test-only`` accepted the job; else its refusal (one line)
    test_only: str | None = None
    #: whether this srun loads NVIDIA's pyxis (``srun --help`` lists its ``--container-image``);
    #: None: srun could not be asked (``pyxis_unknown`` says why)
    pyxis: bool | None = None
    pyxis_unknown: str = ""
    #: None: not run (``probe_skipped`` says why)
    probe: Probe | None = None
    probe_skipped: str = ""


def registry_image(container: str, image: str | None) -> bool:
    """Whether ``image`` is a registry reference pyxis has each node import (pyxis's rule: an
    image not starting with / or . is no file), not a file the nodes must read."""
    return container == "pyxis" and image is not None and not image.startswith(("/", ".", "~"))


def partition_name(facts: Facts, needs: Needs) -> str | None:
    """The partition the job goes to (named, else the default), if it exists."""
    if needs.partition is not None:
        return needs.partition if needs.partition in facts.partitions else None
    part = query.default_partition(dict(facts.partitions))
    return part.name if part else None
