"""``hpc-llm doctor``'s checks of what a compute node sees, from the probe job's report
(:mod:`hpc_llm.doctor.probe`): the run dir, ``--run``, the Python environment, the
container image, Apptainer, pyxis and enroot (pyxis from the login node's ``srun --help``),
GPUs. Pure: facts and needs in, a row out.
"""

from __future__ import annotations

import os
import re

from hpc_llm.doctor.facts import Facts, Needs, registry_image
from hpc_llm.doctor.probe import Probe
from hpc_llm.doctor.row import FAIL, OK, WARN, Row


def _probed(facts: Facts) -> tuple[Probe | None, str]:
    """The probe's report if it ran, else why the node-side checks were not made."""
    p = facts.probe
    if p is None:
        return None, f"not checked from a node ({facts.probe_skipped or 'no probe job'})"
    if not p.ran:
        return None, "not checked from a node (the probe job did not run)"
    return p, ""


def check_probe(facts: Facts, needs: Needs, part: str | None) -> Row:
    p = facts.probe
    if p is None:
        return Row("probe job", "-", WARN, f"no probe job ({facts.probe_skipped or 'not run'})")
    if p.busy:
        return Row("probe job", "did not start", WARN, f"{p.error}: the node-side checks below were not made")
    if p.error:
        return Row(
            "probe job",
            "failed",
            FAIL,
            f"{p.error}: a job like this one cannot run on partition {part}; the node-side checks were not made",
        )
    return Row("probe job", f"job {p.job_id} on {p.node} (host {p.host})", OK, f"ran in {p.seconds:.1f} s")


def _private_tmp(facts: Facts, path: str) -> bool:
    private = facts.config.get("JobContainerType", "").endswith("job_container/tmpfs")
    return private and any(path == d or path.startswith(d + "/") for d in ("/tmp", "/dev/shm"))


def check_run_dir(facts: Facts, needs: Needs, part: str | None) -> Row:
    p, why = _probed(facts)
    where = needs.run_dir
    private = _private_tmp(facts, os.path.abspath(where))
    hidden = (
        "the job could not read its config or write its results there; use a run dir on a filesystem every "
        "node mounts (HPC_LLM_RUNS=DIR or hydra.sweep.dir=DIR)"
    )
    if private and (p is None or p.marker != "seen" or not p.write_seen):
        return Row(
            "run dir",
            f"{where}: not visible from {p.node if p else 'the nodes'}",
            FAIL,
            f"each job gets a private /tmp and /dev/shm here (JobContainerType=job_container/tmpfs): {hidden}",
        )
    if p is None:
        return Row("run dir", where, WARN, why)
    if p.marker != "seen":
        return Row("run dir", f"{where}: not visible from {p.node}", FAIL, f"{p.node} does not see it: {hidden}")
    if not p.write_seen:
        return Row(
            "run dir",
            f"{where}: read-only from {p.node}",
            FAIL,
            f"{p.node} sees it, but what it writes there does not reach this machine: {hidden}",
        )
    return Row("run dir", f"{where}: seen and written from {p.node}", OK, "on a filesystem this node shares")


def _path_on_node(facts: Facts, check: str, path: str, ok_why: str, fail_why: str) -> Row:
    """Whether the probe's node could read ``path`` (a file the job needs from a shared filesystem)."""
    p, why = _probed(facts)
    if p is None:
        return Row(check, path, WARN, why)
    state = p.paths.get(path, "missing")
    if state == "readable":
        return Row(check, f"{path}: readable on {p.node}", OK, ok_why)
    return Row(check, f"{path}: {state} on {p.node}", FAIL, fail_why)


def check_run_arg(facts: Facts, needs: Needs, part: str | None) -> Row | None:
    if needs.run is None:
        return None
    return _path_on_node(
        facts,
        "--run dir",
        needs.run,
        "a requeued attempt reads it again",
        "the run's next attempt could not read it there; keep run dirs on a filesystem every node mounts",
    )


def check_python(facts: Facts, needs: Needs, part: str | None) -> Row:
    cmd = " ".join(needs.python) or "python"
    p, why = _probed(facts)
    if p is None:
        return Row("Python env", cmd, WARN, why)
    status, _, said = p.python.partition(" ")
    if status == "ok":
        prefix, version, ours = ([*said.rsplit(" ", 2)] + ["?", "?"])[:3]
        return Row(
            "Python env",
            f"{prefix} (Python {version}, hpc_llm {ours}) on {p.node}",
            OK,
            "the batch script's supervisor runs it" + (", and every rank" if needs.container == "none" else ""),
        )
    return Row(
        "Python env",
        f"{cmd}: fails on {p.node}",
        FAIL,
        f"`{cmd} -c 'import hpc_llm'` fails there ({said or 'no output'}): the batch script's supervisor "
        "cannot start; install the environment on a filesystem every node mounts, or set "
        "hydra.launcher.python to one the nodes have",
    )


def check_image(facts: Facts, needs: Needs, part: str | None) -> Row:
    if needs.image is None:
        return Row("container image", "-", OK, f"no container (container={needs.container})")
    if registry_image(needs.container, needs.image):
        return Row(
            "container image",
            needs.image,
            OK,
            "a registry reference: enroot on each node imports it at every step (not checked from here)",
        )
    return _path_on_node(
        facts,
        "container image",
        needs.image,
        "every rank runs in it",
        "every rank runs in this image and cannot start without it; put it on a filesystem every node mounts",
    )


def check_apptainer(facts: Facts, needs: Needs, part: str | None) -> Row:
    # --image without a container is checked as Apptainer's; container=pyxis runs its image with enroot
    must = needs.container == "apptainer" or (needs.image is not None and needs.container == "none")
    p, why = _probed(facts)
    if p is None:
        return Row("Apptainer", needs.apptainer, WARN if must else OK, why if must else "not needed (no container)")
    if p.apptainer:
        return Row(
            "Apptainer",
            f"{p.apptainer} on {p.node}",
            OK,
            "runs the container image" if must else f"not needed (container={needs.container})",
        )
    if must:
        return Row(
            "Apptainer",
            f"{needs.apptainer}: not on {p.node}",
            FAIL,
            "container=apptainer runs every rank through it; ask your admin to install Apptainer on the "
            "compute nodes (or set container.executable to where it is)",
        )
    return Row("Apptainer", f"not on {p.node}", OK, "needed only with container=apptainer")


#: the row's name
PYXIS_ROW = "pyxis / enroot"


def enroot_found(p: Probe | None) -> str:
    """``enroot VERSION on NODE``, or what the probe saw instead."""
    if p is None or not p.ran:
        return "enroot not checked"
    if not p.enroot:
        return f"no enroot on {p.node}'s PATH"
    if p.enroot.startswith("failed"):
        return f"enroot fails on {p.node}"
    return f"enroot {p.enroot} on {p.node}"


def check_pyxis(facts: Facts, needs: Needs, part: str | None) -> Row:
    """NVIDIA's pyxis (srun on this login node loads it: ``srun --help`` has ``--container-image``)
    and enroot on the probe's node (``enroot version``): must-haves of container=pyxis."""
    must = needs.container == "pyxis"
    p, why = _probed(facts)
    if facts.pyxis is None:
        pyxis = f"pyxis unknown ({facts.pyxis_unknown or 'srun --help not asked'})"
    else:
        pyxis = "pyxis loaded by srun" if facts.pyxis else "no pyxis in srun"
    value = f"{pyxis}; {enroot_found(p)}"
    admin = "ask your admin for NVIDIA's pyxis (plugstack.conf) and enroot on the compute nodes"
    if not must:
        if facts.pyxis and p is not None and p.enroot and not p.enroot.startswith("failed"):
            return Row(PYXIS_ROW, value, OK, f"container=pyxis would use them (this job: container={needs.container})")
        return Row(PYXIS_ROW, value, OK, "not needed: used only with container=pyxis")
    if facts.pyxis is False:
        return Row(
            PYXIS_ROW,
            value,
            FAIL,
            "container=pyxis starts every rank with srun --container-image, which this srun does not have "
            f"(the ranks would run outside the image): {admin}, or use container=apptainer",
        )
    if facts.pyxis is None:
        return Row(
            PYXIS_ROW,
            value,
            WARN,
            f"container=pyxis needs srun to load pyxis, which could not be checked: if `srun --help` has no "
            f"--container-image, {admin}",
        )
    if p is None:
        return Row(PYXIS_ROW, value, WARN, f"enroot {why}")
    if p.enroot.startswith("failed"):
        return Row(
            PYXIS_ROW,
            value,
            FAIL,
            f"`{needs.enroot} version` fails on {p.node} ({p.enroot.removeprefix('failed').strip() or 'no output'}), "
            "and pyxis starts every container with it: ask your admin to repair enroot on the compute nodes",
        )
    if not p.enroot:
        return Row(
            PYXIS_ROW,
            value,
            WARN,
            f"pyxis runs enroot from slurmd's PATH, which a task does not see: if {p.node} has no enroot, every "
            "step of the job fails; ask your admin whether enroot is installed on the compute nodes",
        )
    return Row(PYXIS_ROW, value, OK, "every rank runs in an enroot container that pyxis starts")


def check_node_gpus(facts: Facts, needs: Needs, part: str | None) -> Row:
    p, why = _probed(facts)
    if needs.gpus_per_node <= 0:
        seen = "-" if p is None or not p.gpus else p.gpus[0]
        return Row("GPUs on the node", seen, OK, "none asked")
    if p is None:
        return Row("GPUs on the node", "-", WARN, why)
    if p.gpus is None:
        return Row(
            "GPUs on the node",
            f"no nvidia-smi on {p.node}",
            WARN,
            "the GPUs' type and driver were not checked (nvidia-smi is not on the node's PATH)",
        )
    gpus = [g for g in p.gpus if g.startswith("GPU ")]
    if not gpus:
        return Row(
            "GPUs on the node",
            f"none on {p.node}",
            FAIL,
            f"the probe was given a GPU (--gpus-per-node=1) but nvidia-smi sees none there ({'; '.join(p.gpus)}): "
            "the ranks would find no CUDA device; ask your admin to check the node's gres.conf and driver",
        )
    return Row("GPUs on the node", f"{gpu_model(p)} on {p.node}", OK, "nvidia-smi -L, for the probe's one GPU")


def gpu_model(probe: Probe | None) -> str | None:
    """The first GPU ``nvidia-smi -L`` named on the probe's node (``NVIDIA H100 80GB HBM3``)."""
    gpus = [g for g in (probe.gpus or []) if g.startswith("GPU ")] if probe is not None and probe.ran else []
    return re.sub(r"^GPU \d+:\s*|\s*\(UUID:[^)]*\)", "", gpus[0]) if gpus else None


def check_store(facts: Facts, needs: Needs, part: str | None) -> Row | None:
    """The job's object stores, checked from a compute node by the job's own Python: the node
    reaches the store, and the store takes the credentials the job will have."""
    if not needs.stores:
        return None
    import json

    where = ", ".join(t["uri"] for t in json.loads(needs.stores)["targets"])
    p, why = _probed(facts)
    if p is None:
        return Row("object store", where, WARN, why)
    verdicts = [line.split("\t", 1) for line in p.stores if line.split("\t", 1)[0] in ("ok", "fail", "skip")]
    if not verdicts:
        said = p.stores[-1] if p.stores else "no output"
        return Row("object store", where, WARN, f"the store check did not run on {p.node} ({said})")
    failed = [what for verdict, what in verdicts if verdict == "fail"]
    if failed:
        return Row(
            "object store",
            f"{where}: refused from {p.node}",
            FAIL,
            f"the ranks could not use it: {failed[0]}",
        )
    return Row(
        "object store",
        f"{where}: checked from {p.node}",
        OK,
        "reached, credentials taken and the bucket there, as the job's ranks will see them",
    )
