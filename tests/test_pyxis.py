"""pyxis and enroot, for real: ``container=pyxis`` rendered, refused and run on dev clusters of
Slurm 22.05 and 24.11 whose srun and slurmd load pyxis (``dev-cluster up --pyxis``).

enroot and pyxis come from scripts/install-pyxis.sh (built from the vendored sources beside the
checkout); where it could not build them the Slurm tests skip with the one line it wrote. The
image is the Apptainer tests' skeleton as an enroot squashfs (tests/skeleton.py:
``make_enroot_image``) with a Python of its own at /opt/hpc_llm/venv whose site-packages adds this
checkout's venv; jobs mount /usr and the checkout (``container.binds``), as a site's image would
hold them. Its interpreter's path exists only inside the image: a run that records it
(``provenance.job.executable``) ran the image's Python.

The Slurm tests are few and combined (CI's budget): per Slurm version one paced 2-node run
inside the image, compared with the same run without a container, with a rank killed midway;
on 22.05 one preemption, on 24.11 one node death with a spare (spares need Slurm >= 23.02.6).
"""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import pytest

from tests.conftest import (
    _free_port_block,
    _slurm24_installed,
    _slurm_tests_wanted,
    explain,
    run_app,
    run_cli,
    shared_dir,
    with_site,
)
from tests.jobs import beat, finished, job_nodes, paced, preempt, submit, wait_for
from tests.skeleton import IMAGE_VENV, host_binds, make_enroot_image

BINDS = "container.binds=[" + ",".join(host_binds()) + "]"
FIXED = ["hydra.sweep.dir=/shared/runs/golden", "hydra.launcher.python=/opt/hpc_llm/venv/bin/python"]
#: 2 nodes x 1 rank, a checkpoint every 5 batches: tests/test_faults.py's SHORT, whose reference
#: run (no container) this module shares
BASE = [
    "+experiment=mpt_tiny",
    "hydra/launcher=slurm",
    "resources.nodes=2",
    "resources.tasks_per_node=1",
    "eval=none",
    "checkpoint.interval=5ba",
    "fault.hang_floor_s=20",
    "fault.hang_timeout_s=60",
]
SHORT = [*BASE, "train.max_duration=60ba"]


def pyxis_unavailable(slurm: str) -> str | None:
    from hpc_llm.devcluster import pyxis

    return pyxis.unavailable(slurm)


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Under --basetemp (the nodes see it; jobs get a private /tmp), built with mksquashfs."""
    where = tmp_path_factory.mktemp("enroot-image")
    return make_enroot_image(where / "rootfs", where / "hpc_llm.sqsh")


def pyxis_cluster(config: pytest.Config, slurm: str):
    """A 3-node cluster of this module's own whose srun and slurmd load pyxis (no accounting:
    up in about a second), stopped after the module's tests."""
    from hpc_llm.devcluster import cluster as devcluster

    if not _slurm_tests_wanted(config):
        pytest.skip("needs Debian slurm-wlm and root (scripts/setup-dev.sh installs it)")
    if slurm == "24.11" and not _slurm24_installed():
        reason = "needs Slurm 24.11 beside 22.05, and root: bash scripts/install-slurm.sh 24.11 (setup-dev.sh runs it)"
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    why = pyxis_unavailable(slurm)
    if why is not None:
        pytest.skip(why)
    root = shared_dir(config) / f"devcluster-pyxis-{slurm}-{os.getpid()}"
    return devcluster.up(
        root=root, nodes=3, ctld_port=_free_port_block(16), slurm=slurm, accounting=False, gpus_per_node=0, pyxis=True
    )


@pytest.fixture(scope="module", params=["22.05", pytest.param("24.11", marks=pytest.mark.slurm24)])
def cluster(request: pytest.FixtureRequest):
    from hpc_llm.devcluster import cluster as devcluster

    c = pyxis_cluster(request.config, request.param)
    yield c
    devcluster.down(c.root)


@pytest.fixture
def env(app_env: dict[str, str], cluster, test_site: Path) -> dict[str, str]:
    return with_site(dict(app_env, **cluster.env()), test_site)


# -- rendered and refused (no Slurm, no enroot) ------------------------------------------------


def test_the_script_starts_every_step_in_the_image_with_the_mounts_the_job_needs(app_env, image, tmp_path):
    data = tmp_path / "extra"
    data.mkdir()
    args = [
        "render",
        "+experiment=mpt_tiny",
        "cluster=h100",
        "resources.nodes=2",
        "train.global_train_batch_size=64",
        "container=pyxis",
        f"container.image={image}",
        f"container.binds=[{data}:/data:ro]",
        "container.env_passthrough=[MY_TOKEN]",
        "container.flags=[--container-writable]",
        f"checkpoint.location={tmp_path / 'ckpt'}",
        *FIXED,
    ]
    proc = run_cli(args, dict(app_env, MY_TOKEN="tok-value-123"))
    assert proc.returncode == 0, explain(proc)
    text = proc.stdout
    exports = dict(re.findall(r"^export (PYXIS_CONTAINER_\w+)=(.*)$", text, re.M))
    assert exports["PYXIS_CONTAINER_IMAGE"] == str(image)
    assert exports["PYXIS_CONTAINER_WORKDIR"] == "/shared/runs/golden/0"
    assert exports["PYXIS_CONTAINER_ENV"] == "MY_TOKEN" and exports["PYXIS_CONTAINER_WRITABLE"] == "1"
    mounts, tail = exports["PYXIS_CONTAINER_MOUNTS"].split('"', 1)
    assert tail == '${TMPDIR:+,$TMPDIR}"'  # where the ranks work, when the node sets it
    assert {"/shared/runs/golden/0", str(tmp_path / "ckpt"), f"{data}:/data:ro"} <= set(mounts.split(","))
    # the task is the image's python itself: srun starts the container
    [task] = [ln for ln in text.splitlines() if "-m hpc_llm.job.agent /" in ln]
    assert task.strip().startswith("python3 -u -m hpc_llm.job.agent /shared/runs/golden/0/.hpc_llm/job.pkl")
    # the code on PYTHONPATH is mounted; the checkpoint folder exists before pyxis mounts it
    assert 'PYXIS_CONTAINER_MOUNTS="$PYXIS_CONTAINER_MOUNTS,$d"' in text
    [mkdir] = [ln.split() for ln in text.splitlines() if ln.startswith("mkdir -p ")]
    assert str(tmp_path / "ckpt") in mkdir[2:]
    # secrets by name only; no per-node check step unless asked (it unpacks the image once more)
    assert "tok-value-123" not in text and "container check" not in text
    checked = run_cli([*args, "container.check=true"], app_env)
    assert checked.returncode == 0 and "hpc_llm: container check ok on $SLURMD_NODENAME" in checked.stdout


def test_container_check_reads_the_images_versions_through_enroot_start(app_env, image):
    """``hpc-llm container check container=pyxis``: the image's Python run here by ``enroot start``
    of the squashfs (no Slurm, no unpack), its versions against the login side's; a registry
    reference, or no enroot on this machine, is one line saying where the image is checked."""
    from hpc_llm.devcluster import pyxis

    if not pyxis.enroot().is_file():
        pytest.skip(f"enroot is not built here ({pyxis.enroot()}): scripts/install-pyxis.sh")
    base = ["container", "check", "container=pyxis", BINDS]
    # enroot named by its path: its helpers are found beside it
    ok = run_cli([*base, f"container.image={image}", f"container.executable={pyxis.enroot()}"], app_env)
    assert ok.returncode == 0, explain(ok)
    for dist in ("hpc-llm", "torch", "mosaicml", "llm-foundry"):
        assert re.search(rf"^{dist}\s+image \S+\s+expected \S+\s+ok$", ok.stdout, re.M), ok.stdout
    ref = run_cli([*base, "container.image='nvcr.io#nvidia/pytorch:24.05-py3'"], app_env)
    assert ref.returncode != 0 and "registry reference" in ref.stderr, explain(ref)
    assert len(ref.stderr.strip().splitlines()) == 1, ref.stderr
    none = run_cli([*base, f"container.image={image}", "container.executable=/nowhere/enroot"], app_env)
    assert none.returncode != 0 and "is not on this machine" in none.stderr, explain(none)


def test_a_registry_reference_in_enroots_syntax_is_taken_as_it_is(app_env):
    ref = "nvcr.io#nvidia/pytorch:24.05-py3"
    # Hydra's grammar takes '#' only in a quoted value
    proc = run_cli(["render", "+experiment=mpt_tiny", "container=pyxis", f"container.image='{ref}'", *FIXED], app_env)
    assert proc.returncode == 0, explain(proc)
    assert f"export PYXIS_CONTAINER_IMAGE='{ref}'" in proc.stdout


BAD = [
    ([], "container.image is required for container=pyxis; allowed: a squashfs file"),
    (["container.image=/nowhere/x.sqsh"], "container.image='/nowhere/x.sqsh' does not exist; allowed: a squashfs"),
    (["container.image={tmp}"], "is a directory; allowed: a squashfs file"),
    (["container.image={corrupt}"], "is not a squashfs image (no squashfs superblock)"),
    (["container.image={cut}"], "is a truncated squashfs image: its superblock says"),
    (
        ["container.image=nvcr.io/nvidia/pytorch:24.05-py3"],
        "enroot separates it with '#': nvcr.io#nvidia/pytorch:24.05",
    ),
    (["container.image='nvcr.io#NVIDIA/PyTorch'"], "is not a registry reference enroot reads; allowed:"),
    (["container.image=oras://ghcr.io/x/y:1"], "has a scheme enroot does not pull from"),
    (["container.image={image}", "container.flags=['--container-image=/x.sqsh']"], "set container.image"),
    (["container.image={image}", "container.flags=['--container-name=warm']"], "a named container outlives"),
    (["container.image={image}", "container.flags=[--nv]"], "'--nv' is not a pyxis flag hpc_llm passes"),
    (["container.image={image}", "container.stage=true"], "pyxis unpacks the image onto each node's own disk"),
    (["container.image={image}", "container.gpus=true"], "enroot's nvidia hook gives each task the GPUs"),
    (["container.image={image}", "container.binds=[/nowhere/data]"], "bind source '/nowhere/data' does not exist"),
]


@pytest.mark.parametrize("overrides,message", BAD, ids=[" ".join(b[0]) or "no image" for b in BAD])
def test_bad_pyxis_input_is_one_line_before_anything(overrides, message, app_env, image, tmp_path, runs_dir):
    corrupt = tmp_path / "corrupt.sqsh"
    corrupt.write_bytes(os.urandom(4096))
    cut = tmp_path / "cut.sqsh"
    cut.write_bytes(image.read_bytes()[:1024])
    fmt = {"image": image, "tmp": tmp_path, "corrupt": corrupt, "cut": cut}
    overrides = [o.format(**fmt) for o in overrides]
    proc = run_app(
        ["+experiment=mpt_tiny", "hydra/launcher=slurm", "container=pyxis", *overrides], app_env, cwd=tmp_path
    )
    assert proc.returncode == 2, explain(proc)
    [line] = proc.stderr.strip().splitlines()
    assert message in line, line
    assert not runs_dir.exists()


# -- real Slurm, real pyxis and enroot ---------------------------------------------------------


def reference(env: dict[str, str], pytestconfig: pytest.Config) -> dict:
    from tests.test_faults import SHORT as FAULTS_SHORT
    from tests.test_faults import reference as shared_reference

    assert FAULTS_SHORT == SHORT  # the same run: one reference for both modules
    return shared_reference(SHORT, env, pytestconfig)


@pytest.mark.slurm
@pytest.mark.train
def test_a_2_node_run_in_pyxis_trains_as_without_a_container_and_a_killed_rank_trains_again(
    cluster, env, image, tmp_path, pytestconfig
):
    """One paced run inside the image: the loss of the same run without a container, the
    image's Python in provenance, every rank in the container, and a rank SIGKILLed midway
    forked again by its warm agent inside the same container (no new step: no unpack)."""
    started = time.monotonic()
    ref = reference(env, pytestconfig)
    ref_s = time.monotonic() - started
    env = dict(env, HPC_LLM_RUNS=str(tmp_path / "runs"))
    job_id, run_dir = submit([*SHORT, *paced(0.1), "container=pyxis", f"container.image={image}", BINDS], env, tmp_path)
    victim = wait_for(lambda: beat(run_dir, 1).get("batch", -1) >= 8 and beat(run_dir, 1), 240, "rank 1 at batch 8")
    environ = Path(f"/proc/{victim['pid']}/environ").read_bytes().split(b"\0")
    assert f"PYXIS_CONTAINER_IMAGE={image}".encode() in environ
    root = os.stat(f"/proc/{victim['pid']}/root")  # the rank's / is the container's, not the host's
    assert (root.st_dev, root.st_ino) != (os.stat("/").st_dev, os.stat("/").st_ino)
    os.kill(victim["pid"], signal.SIGKILL)
    r = finished(run_dir, 300)
    assert r["status"] == "completed" and r["batches_done"] == ref["batches_done"], r.get("error")
    assert r["train_loss"] == pytest.approx(ref["train_loss"], rel=1e-5)
    first, second = r["attempts"]
    assert (first["cause"], first["action"]) == ("failure", "restart") and "killed by SIGKILL" in first["error"]
    assert (second["job_id"], second["restart"], second["generation"]) == (job_id, 0, 1)
    assert r["provenance"]["job"]["executable"] == f"{IMAGE_VENV}/bin/python3"
    ranks = sorted(r["ranks"], key=lambda x: x["rank"])
    assert len({x["node"] for x in ranks}) == 2
    for x in ranks:
        assert x["container"]["image"] == str(image) and x["container"]["runtime"] == "pyxis", x
    # each node's agent warmed up once: the restart forked from it, inside its container
    logs = run_dir / "logs"
    assert [p.read_text().count("warm in") for p in sorted(logs.glob("agent*.0.log"))] == [1, 1]
    print(f"\n[pyxis {cluster.slurm}] reference {ref_s:.0f} s, whole test {time.monotonic() - started:.0f} s")


@pytest.mark.slurm
@pytest.mark.train
def test_a_preempted_run_in_pyxis_resumes_at_the_same_batch(cluster, env, image, tmp_path):
    if cluster.slurm != "22.05":
        pytest.skip("one preemption for both versions (CI's budget): 22.05's cluster runs it")
    env = dict(env, HPC_LLM_RUNS=str(tmp_path / "runs"))
    args = [
        *BASE,
        "resources.nodes=1",
        "train.max_duration=200ba",
        "hydra.launcher.exclusive=true",
        "container=pyxis",
        f"container.image={image}",
        BINDS,
        *paced(0.1),
    ]
    job_id, run_dir = submit(args, env, tmp_path)
    wait_for(lambda: beat(run_dir, 0).get("batch", -1) >= 10, 300, "rank 0 to pass batch 10")
    preempt(job_nodes(job_id, env), env)
    r = finished(run_dir, 400)
    assert r["status"] == "completed" and r["batches_done"] == 200, r.get("error")
    first, second = r["attempts"]
    assert (first["state"], first["cause"], first["signal"]) == ("stopped", "preemption", "SIGUSR2")
    assert 0 < first["stopped_at_batch"] < 200 and second["resumed_at_batch"] == first["stopped_at_batch"]
    assert r["batches_lost"] == 0 and r["slurm_job_ids"] == [job_id]
    assert r["ranks"][0]["container"]["image"] == str(image)


@pytest.mark.slurm
@pytest.mark.train
def test_a_node_killed_in_pyxis_is_swapped_for_the_spare(cluster, env, image, tmp_path):
    from hpc_llm.devcluster import cluster as devcluster

    if cluster.slurm != "24.11":
        pytest.skip("spare nodes need Slurm >= 23.02.6 (its --no-kill fixes): 24.11's cluster runs it")
    env = dict(env, HPC_LLM_RUNS=str(tmp_path / "runs"))
    args = [
        *SHORT,
        "resources.spare_nodes=1",
        "container=pyxis",
        f"container.image={image}",
        BINDS,
        *paced(0.1),
    ]
    job_id, run_dir = submit(args, env, tmp_path)
    victim = wait_for(lambda: beat(run_dir, 1).get("batch", -1) >= 8 and beat(run_dir, 1), 240, "rank 1 at batch 8")
    devcluster.kill_node(cluster, victim["node"])
    try:
        r = finished(run_dir, 400)
    finally:
        devcluster.revive_node(cluster, victim["node"])
    assert r["status"] == "completed" and r["batches_done"] == 60, r.get("error")
    first = r["attempts"][0]
    assert first["cause"] == "node_failure" and first["suspects"] == [victim["node"]], first
    nodes = {x["node"] for x in r["ranks"]}
    assert victim["node"] not in nodes and len(nodes) == 2 and r["slurm_job_ids"] == [job_id]
    assert {x["container"]["image"] for x in r["ranks"]} == {str(image)}
