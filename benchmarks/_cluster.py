"""The dev cluster a benchmark runs on: the one $SLURM_CONF names, else one it starts
under ~/.hpc_llm and stops when done (hpc_llm.devcluster.cluster). ``hosts=True``: nodes that
are hosts of their own (``hpc-llm dev-cluster up --hosts``), which the fabric faults of
hpc_llm.devcluster.fabric need."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


@contextmanager
def dev_cluster(
    name: str, nodes: int, ctld_port: int, slurmd_timeout_s: int = 10, slurm: str | None = None, hosts: bool = False
) -> Iterator[tuple[Any, dict[str, str]]]:
    """(cluster, environment for its commands); $SLURM_CONF's cluster only when its
    SlurmdTimeout, its Slurm and its kind (nodes that are hosts, or not) are the ones asked for.
    A multi-host cluster's names and subnet follow ``ctld_port`` (hpc_llm.devcluster.hosts)."""
    from hpc_llm.devcluster import cluster as devcluster

    env = dict(os.environ)
    if env.get("SLURM_CONF"):
        cluster = devcluster.load(Path(env["SLURM_CONF"]).parent.parent)
        assert cluster is not None, f"no dev cluster at $SLURM_CONF={env['SLURM_CONF']}"
        if cluster.slurmd_timeout_s == slurmd_timeout_s and slurm in (None, cluster.slurm) and cluster.hosts == hosts:
            yield cluster, env
            return
    started = devcluster.up(
        root=Path.home() / ".hpc_llm" / name,
        nodes=nodes,
        ctld_port=ctld_port,
        slurmd_timeout_s=slurmd_timeout_s,
        hosts=hosts,
        **({"slurm": slurm} if slurm else {}),
    )
    env.update(started.env())
    try:
        yield started, env
    finally:
        devcluster.down(started.root)
