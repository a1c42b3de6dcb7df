"""``hpc-llm doctor``'s facts gathered: the job composed and rendered as ``hpc-llm render``
does, what it asks of the cluster (:class:`~hpc_llm.doctor.facts.Needs`, its checkpoint
save time measured or estimated), and what Slurm says (``scontrol``, ``sinfo``, ``sacct``,
``sbatch --test-only``, ``srun --help`` for NVIDIA's pyxis) and the probe job sees
(:class:`~hpc_llm.doctor.facts.Facts`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Sequence
from typing import Any

from hpc_llm.config import stores
from hpc_llm.doctor import probe as node_probe
from hpc_llm.doctor.facts import Facts, Needs, partition_name, registry_image
from hpc_llm.errors import ConfigError
from hpc_llm.launch.sbatch import preview
from hpc_llm.launch.sbatch.preview import Job
from hpc_llm.slurm import commands, query


def job_overrides(overrides: Sequence[str]) -> list[str]:
    """The user's overrides for a Slurm job: ``partition=NAME`` is hydra.launcher.partition."""
    return [f"hydra.launcher.partition={o.split('=', 1)[1]}" if o.startswith("partition=") else o for o in overrides]


def compose_job(overrides: Sequence[str]) -> Job:
    """Compose and render one job as ``hpc-llm render`` does (the same checks, the same spec)."""
    return preview.compose_job(job_overrides(overrides))


def save_time(cfg: Any, nodes: int, run: str | None) -> tuple[float | None, str]:
    """The longest checkpoint save a run measured (``--run``), else the estimator's figure."""
    if run is not None:
        measured = measured_save_s(run)
        if measured is not None:
            return measured, f"measured in {run}"
    from omegaconf import OmegaConf

    from hpc_llm.config.flops import model_size, train_seq_len
    from hpc_llm.results.estimate import CHECKPOINT_BYTES_PER_PARAM, WRITE_GBPS_PER_NODE, checkpoint_save_s
    from hpc_llm.results.format import human_bytes

    train: dict[str, Any] = OmegaConf.to_container(cfg.train, resolve=True)  # type: ignore[assignment]
    try:
        n = model_size(train["model"], train_seq_len(train)).n_params
    except (ConfigError, KeyError) as exc:
        return None, f"no measured save{' in ' + run if run else ''}, and no estimate: {exc}"
    return (
        checkpoint_save_s(n, nodes),
        f"estimate: {human_bytes(n * CHECKPOINT_BYTES_PER_PARAM)} from {nodes} node(s) at {WRITE_GBPS_PER_NODE:g} GB/s"
        + (f"; {run} measured none" if run else ""),
    )


def measured_save_s(run: str) -> float | None:
    """The longest checkpoint save a run recorded: a stop's save (``save_s``) or a periodic one
    (``checkpoint_save_s``), from its attempts, else from results.json's attempts."""
    from hpc_llm.rundir.layout import RunDir
    from hpc_llm.rundir.record import Attempts

    saves = [s for a in Attempts.load(run).items for s in (a.save_s, a.checkpoint_save_s) if s is not None]
    results = RunDir(run).results
    if not saves and results.is_file():
        try:
            data = json.loads(results.read_text())
        except ValueError:
            data = {}
        saves = [a["save_s"] for a in data.get("attempts") or [] if isinstance(a, dict) and a.get("save_s")]
    return max(saves) if saves else None


def needs_of(job: Job, run: str | None = None, image: str | None = None) -> Needs:
    from omegaconf import OmegaConf

    from hpc_llm.launch.sbatch import checks as submit_checks
    from hpc_llm.launch.sbatch.spec import job_resources, python_command

    cfg, opts, spec = job.cfg, job.opts, job.spec
    res = job_resources(cfg, opts)
    cluster = OmegaConf.select(cfg, str(opts.cluster_key), default=None) or {}
    container = OmegaConf.select(cfg, "container", default=None)
    name = str(container.name) if container is not None else "none"
    if image is not None:  # --image: a file the nodes must see
        image = os.path.abspath(image)
    elif name != "none" and container.image:
        image = str(container.image)
        # a file the nodes must read; pyxis's registry reference stays as written
        image = image if registry_image(name, image) else os.path.abspath(os.path.expanduser(image))
    save_s, save_from = save_time(cfg, res.nodes, run)
    store_targets = stores.targets(cfg, job.run_dir)
    return Needs(
        partition=opts.partition or cluster.get("partition"),
        nodes=res.nodes,
        tasks_per_node=res.tasks_per_node,
        cpus_per_task=res.cpus_per_task,
        gpus_per_node=res.gpus_per_node,
        gpu_type=getattr(res, "gpu_type", None),
        time_s=res.time_s,
        spare_nodes=res.spare_nodes,
        resources_key=str(opts.resources_key),
        requeue=bool(spec.flags.get("requeue")),
        signal=spec.flags.get("signal"),
        run_dir=job.run_dir,
        run=run,
        python=tuple(python_command(opts)),
        container=name,
        image=image,
        apptainer=str(container.executable) if container is not None and name == "apptainer" else "apptainer",
        enroot=str(container.executable) if container is not None and name == "pyxis" else "enroot",
        save_s=save_s,
        save_from=save_from,
        hang_timeout_s=OmegaConf.select(cfg, "fault.hang_timeout_s", default=None),
        asked=" ".join(
            f"--{k.replace('_', '-')}={v}"
            for k, v in sorted(spec.flags.items())
            if k in submit_checks._ASKED and v not in (None, False)
        ),
        stores=json.dumps({"targets": store_targets}) if store_targets else "",
    )


def sacct_answers() -> str | None:
    """None when ``sacct`` answers; else its last error line."""
    try:
        out = commands.run(["sacct", "-n", "-X", "-j", "1", "-o", "JobID"], timeout=30)
    except commands.SlurmUnreachable as exc:
        return commands.unreachable_why(exc)
    return None if out.returncode == 0 else commands.said(out)


#: a line of ``srun --help`` that pyxis's SPANK plugin adds ("Options provided by plugins:");
#: Slurm's own OCI option is ``--container=PATH``, not this
PYXIS_OPTION = re.compile(r"^\s*--container-image[=\s]", re.M)


def pyxis_loaded() -> tuple[bool | None, str]:
    """Whether this srun loads NVIDIA's pyxis: its plugin (plugstack.conf) adds
    ``--container-image`` to ``srun --help``. None, and why, when srun could not be asked or
    refused (a plugin in plugstack.conf that does not load makes every srun fail)."""
    try:
        out = commands.run(["srun", "--help"], timeout=30)
    except commands.SlurmUnreachable as exc:
        return None, commands.unreachable_why(exc)
    if out.returncode != 0:
        return None, f"srun --help: {commands.said(out)}"
    return bool(PYXIS_OPTION.search(out.stdout)), ""


def gather(job: Job, needs: Needs, probe: bool = True, probe_wait_s: int = 120) -> Facts:
    """Ask Slurm everything :func:`~hpc_llm.doctor.checks.evaluate` reads, and run the probe job. Raises
    SlurmUnreachable (one line) when Slurm cannot be asked at all."""
    from hpc_llm.launch.sbatch import checks as submit_checks

    config = query.show_config()
    parts = query.partitions()
    facts = Facts(
        config=config,
        partitions=parts,
        partition_info=query.show_partitions(),
        nodes=query.nodes(),
        accounting=None if config.get("AccountingStorageType", "").endswith("/none") else sacct_answers(),
    )
    pyxis, pyxis_unknown = pyxis_loaded()
    try:
        submit_checks.SchedulerVerdicts().check(job.spec, 0)
        verdict = None
    except ConfigError as exc:
        verdict = str(exc).removesuffix("; nothing was submitted")
    part = partition_name(facts, needs)
    skipped = ""
    report: node_probe.Probe | None = None
    if not probe:
        skipped = "--no-probe"
    elif part is None:
        skipped = "no partition to run it in"
    else:
        # where the job itself may run: its account, QOS, node features and reservation
        flags = {k: job.spec.flags.get(k) for k in node_probe.PLACEMENT}
        flags["partition"] = part
        if needs.gpus_per_node > 0:  # one GPU, of the job's type: what nvidia-smi -L names there
            flags["gpus_per_node"] = f"{needs.gpu_type}:1" if needs.gpu_type else 1
        paths = [p for p in (needs.run, None if registry_image(needs.container, needs.image) else needs.image) if p]
        report = node_probe.run(
            flags,
            needs.run_dir,
            paths,
            needs.python,
            apptainer=needs.apptainer,
            wait_s=probe_wait_s,
            stores=needs.stores,
            enroot=needs.enroot,
        )
    return dataclasses.replace(
        facts, test_only=verdict, probe=report, probe_skipped=skipped, pyxis=pyxis, pyxis_unknown=pyxis_unknown
    )
