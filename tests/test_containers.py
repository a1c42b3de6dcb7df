"""Apptainer, for real: rendered scripts, bad input, ``hpc-llm container build|inspect|check``
through spython, and Slurm runs whose every rank runs inside ``apptainer exec``.

Apptainer comes from scripts/install-apptainer.sh (Debian sid's package with a
private glibc). No registry is reachable here, so images are built offline from
a *skeleton*: an empty root filesystem (``usr/ etc/ tmp/ ...``, ``bin -> usr/bin``
and friends, ``/etc/passwd``) whose ``/usr``, this checkout and its virtualenv are
bound in from the host, so the image's ``python3`` is this test's interpreter
with torch, Composer and LLM Foundry. It is built in well under a second.

Tests that need the apptainer executable skip without it, except in CI
(``CI=true``), where setup installs it and its absence is a failure.

Not tested, because it cannot run here: ``--nv`` with a GPU (rendered only; on
this machine it is a silent no-op) and other runtimes (enroot/pyxis).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import tomllib

from tests.conftest import PY, ROOT, explain, pip_install, results_of, run_app, run_cli, with_site
from tests.jobs import beat, finished, job_nodes, paced, preempt, submit, wait_for
from tests.skeleton import host_binds, make_skeleton

GOLDEN = ROOT / "tests" / "golden"
FIXED = ["hydra.sweep.dir=/shared/runs/golden", "hydra.launcher.python=/opt/hpc_llm/venv/bin/python"]
IMAGE_IN_GOLDEN = "/shared/images/hpc_llm-h100.sif"
VENV_BIN = Path(PY).parent


BINDS = "container.binds=[" + ",".join(host_binds()) + "]"


def apptainer_build(image: Path, source: Path | str) -> Path:
    proc = subprocess.run(["apptainer", "build", "-F", str(image), str(source)], capture_output=True, text=True)
    assert proc.returncode == 0, explain(proc)
    return image


@pytest.fixture(scope="session")
def apptainer() -> str:
    path = shutil.which("apptainer")
    if path is None:
        reason = "needs Apptainer (scripts/install-apptainer.sh installs it)"
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    return path


@pytest.fixture(scope="session")
def images_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Under --basetemp, which Slurm tests need outside /tmp (jobs get a private /tmp)."""
    return tmp_path_factory.mktemp("images")


@pytest.fixture(scope="session")
def sandbox(images_dir: Path) -> Path:
    """The skeleton as a sandbox directory (an image Apptainer runs as it is)."""
    return make_skeleton(images_dir / "skeleton")


@pytest.fixture(scope="session")
def sif(apptainer: str, sandbox: Path, images_dir: Path) -> Path:
    """The skeleton as a SIF file (real ``apptainer build``, well under a second)."""
    return apptainer_build(images_dir / "skeleton.sif", sandbox)


@pytest.fixture(scope="session")
def no_python(apptainer: str, images_dir: Path) -> Path:
    """An image with a shell (the host's dash and the libc it links) and no python."""
    root = make_skeleton(images_dir / "shell-only", host=False)
    for src, dest in (
        ("/usr/bin/dash", "usr/bin/sh"),
        ("/lib/x86_64-linux-gnu/libc.so.6", "usr/lib/x86_64-linux-gnu/libc.so.6"),
        ("/lib64/ld-linux-x86-64.so.2", "usr/lib64/ld-linux-x86-64.so.2"),
    ):
        (root / dest).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(src, root / dest)
    return apptainer_build(images_dir / "shell-only.sif", root)


NO_PYTHON = 'python3 in the image failed: FATAL: "python3": executable file not found in $PATH'


@pytest.mark.stack  # imports torch inside the image
def test_the_skeleton_image_runs_the_venv_python_inside_apptainer(sif):
    started = time.monotonic()
    binds = [a for b in host_binds() for a in ("--bind", b)]
    code = "import os, sys, torch; print(sys.executable, os.environ['APPTAINER_CONTAINER'], os.path.isdir('/.singularity.d'))"  # noqa: E501
    cmd = ["apptainer", "exec", *binds, str(sif), "python3", "-c", code]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, explain(proc)
    assert proc.stdout.split() == [str(VENV_BIN / "python3"), str(sif), "True"]
    assert time.monotonic() - started < 30


def test_an_image_without_python_runs_a_shell_but_no_python(no_python):
    sh = subprocess.run(["apptainer", "exec", str(no_python), "sh", "-c", "echo in"], capture_output=True, text=True)
    assert sh.returncode == 0 and sh.stdout == "in\n", explain(sh)
    py = subprocess.run(["apptainer", "exec", str(no_python), "python3", "-V"], capture_output=True, text=True)
    assert py.returncode != 0 and '"python3": executable file not found in $PATH' in py.stderr, explain(py)


# -- rendered scripts (no apptainer needed) -------------------------------------


@pytest.mark.parametrize("container", ["none", "apptainer"])
def test_render_h100_8_nodes_matches_golden(container, app_env, sandbox):
    env = dict(app_env, HPC_LLM_CACHE="/shared/cache/hpc_llm")
    args = [
        "+experiment=mpt_tiny",
        "cluster=h100",
        "resources.nodes=8",
        "train.global_train_batch_size=256",
        f"container={container}",
        *FIXED,
    ]
    if container == "apptainer":
        args.append(f"container.image={sandbox}")
    proc = run_cli(["render", *args], env)
    assert proc.returncode == 0, explain(proc)
    text = proc.stdout.replace(str(sandbox), IMAGE_IN_GOLDEN)
    golden = GOLDEN / f"sbatch_h100_8nodes_container_{container}.sh"
    if not golden.exists():
        golden.write_text(text)
        pytest.fail(f"wrote missing golden file {golden}; check it and commit it")
    assert text == golden.read_text(), f"render changed; delete {golden} to regenerate"


def test_apptainer_render_wraps_every_task_with_gpus_and_binds(app_env, sandbox, tmp_path):
    """``--nv`` is only rendered here: no GPU on the test machines (where Apptainer takes
    it silently and exits 0), so GPU injection itself is untested."""
    data = tmp_path / "extra"
    data.mkdir()
    proc = run_cli(
        [
            "render",
            "+experiment=mpt_tiny",
            "cluster=h100",
            "resources.nodes=2",
            "container=apptainer",
            "train.global_train_batch_size=64",
            f"container.image={sandbox}",
            f"container.binds=[{data}:/data:ro]",
            f"checkpoint.location={tmp_path / 'ckpt'}",
            *FIXED,
        ],
        app_env,
    )
    assert proc.returncode == 0, explain(proc)
    [task_line] = [ln for ln in proc.stdout.splitlines() if "hpc_llm.job.agent" in ln and "apptainer exec" in ln]
    assert task_line.strip().startswith("apptainer exec --nv --bind ")
    for bind in ("/shared/runs/golden/0", f"{tmp_path / 'ckpt'}", f"{data}:/data:ro"):
        assert f"--bind {bind} " in task_line
    assert f"{sandbox} python3 -u -m hpc_llm.job.agent /shared/runs/golden/0/.hpc_llm/job.pkl" in task_line
    # the checkpoint folder exists before apptainer binds it; each node is checked first
    [mkdir] = [ln.split() for ln in proc.stdout.splitlines() if ln.startswith("mkdir -p ")]
    assert str(tmp_path / "ckpt") in mkdir[2:]
    assert "container check failed on ${SLURMD_NODENAME:-$(hostname)}" in proc.stdout


def test_secrets_pass_into_the_container_by_name_only(app_env, sandbox):
    env = dict(app_env, MY_TOKEN="tok-value-123")
    proc = run_cli(
        [
            "render",
            "+experiment=mpt_tiny",
            "container=apptainer",
            f"container.image={sandbox}",
            "container.env_passthrough=[MY_TOKEN]",
            *FIXED,
        ],
        env,
    )
    assert proc.returncode == 0, explain(proc)
    assert 'export APPTAINERENV_MY_TOKEN="${MY_TOKEN}"' in proc.stdout
    assert "tok-value-123" not in proc.stdout and "--env" not in proc.stdout


def test_stage_copies_the_image_to_node_local_disk(app_env, sif):
    proc = run_cli(
        [
            "render",
            "+experiment=mpt_tiny",
            "container=apptainer",
            f"container.image={sif}",
            "container.stage=true",
            "cluster.scratch=/local/scratch",
            *FIXED,
        ],
        app_env,
    )
    assert proc.returncode == 0, explain(proc)
    staged = re.search(r"mv -f \S+ (/local/scratch/hpc_llm-image-[0-9a-f]{12}\.sif)", proc.stdout)
    assert staged, proc.stdout
    [task_line] = [ln for ln in proc.stdout.splitlines() if "hpc_llm.job.agent" in ln and "apptainer exec" in ln]
    assert f" {staged.group(1)} python3 " in task_line and "--bind /local/scratch " in task_line


def test_apptainer_missing_on_login_node_warns_but_renders(app_env, sandbox):
    env = dict(app_env, PATH=os.path.dirname(sys.executable))  # no apptainer here
    proc = run_cli(["render", "+experiment=mpt_tiny", "container=apptainer", f"container.image={sandbox}", *FIXED], env)
    assert proc.returncode == 0, explain(proc)
    assert "warning: 'apptainer' is not on PATH here; the job checks for it on every node" in proc.stderr


# -- bad input: one line before anything is submitted ---------------------------

BAD = [
    (["container.image=/nowhere/x.sif"], "container.image='/nowhere/x.sif' does not exist"),
    (["container.image=docker://nvcr.io/nvidia/pytorch:24.05"], "a registry URI would be pulled by every node"),
    (["container.image={corrupt}"], "is not an Apptainer image (no SIF or squashfs header); allowed: a .sif file"),
    (["container.image={tmp}"], "is a directory but not an Apptainer sandbox (it has no .singularity.d)"),
    (["container.image={image}", "container.binds=[/nowhere/data]"], "bind source '/nowhere/data' does not exist"),
    (
        ["container.image={image}", "container.binds=[{tmp}:/data,{image}:/data]"],
        "conflicting binds for /data in the container",
    ),
    (["container.image={image}", "container.binds=[{tmp}:data]"], "the destination must be an absolute path"),
    (["container.image={image}", "container.flags=[--cleanenv]"], "'--cleanenv' is not allowed: it drops the SLURM_*"),
    (["container.image={image}", "container.flags=[--nv]"], "set container.gpus"),
    (["container.image={image}", "container.stage=true"], "container.stage=true copies one image file to each node"),
    (["container=apptainer"], "container.image"),
]


@pytest.mark.parametrize("overrides,message", BAD, ids=[" ".join(b[0]) for b in BAD])
def test_bad_container_input_is_one_line_before_anything(overrides, message, app_env, sandbox, tmp_path, runs_dir):
    corrupt = tmp_path / "corrupt.sif"
    corrupt.write_bytes(os.urandom(4096))
    overrides = [o.format(image=sandbox, tmp=tmp_path, corrupt=corrupt) for o in overrides]
    proc = run_app(
        ["+experiment=mpt_tiny", "hydra/launcher=slurm", "container=apptainer", *overrides],
        app_env,
        cwd=tmp_path,
        timeout=120,
    )
    assert proc.returncode == 2, explain(proc)
    [line] = proc.stderr.strip().splitlines()
    assert message in line, line
    assert not runs_dir.exists()


def test_a_truncated_sif_is_refused_and_a_whole_one_accepted(app_env, sif, tmp_path):
    """A copy cut short (a full disk, an interrupted transfer) is named before submitting."""
    cut = tmp_path / "cut.sif"
    data = sif.read_bytes()
    cut.write_bytes(data[: len(data) // 2])
    args = ["render", "+experiment=mpt_tiny", "container=apptainer", *FIXED]
    proc = run_cli([*args, f"container.image={cut}"], app_env)
    assert proc.returncode == 2, explain(proc)
    [line] = proc.stderr.strip().splitlines()
    assert f"is a truncated SIF image: its header says {len(data)} bytes, the file has {len(data) // 2}" in line
    ok = run_cli([*args, f"container.image={sif}"], app_env)
    assert ok.returncode == 0, explain(ok)


def test_unreadable_image_is_refused(app_env, sandbox, tmp_path, tmp_path_factory):
    """Run as an ordinary user (nobody): root reads any file, so the check is for users."""
    image = tmp_path / "image"
    shutil.copytree(sandbox, image, symlinks=True)
    image.chmod(0o700)
    # pytest makes its directories 0700 (under xdist one level more): the user must see the run dir
    base = Path(str(tmp_path_factory.getbasetemp()))
    root = base.parent if base.name.startswith("popen-gw") else base
    for d in (tmp_path, *tmp_path.parents):
        d.chmod(d.stat().st_mode | 0o755)
        if d == root:
            break
    as_user = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"] if os.geteuid() == 0 else []
    # the user runs this checkout's hpc_llm: where a parent of it is closed to others (a clone
    # under a 0700 home), nobody can, and there is nothing of the image check to see
    probe = subprocess.run([*as_user, PY, "-c", "import hpc_llm"], capture_output=True, text=True, cwd=tmp_path)
    if probe.returncode != 0:
        pytest.skip(f"user nobody cannot run this checkout's hpc_llm ({ROOT}): {probe.stderr.strip()[-200:]}")
    cmd = [
        *as_user,
        PY,
        "-c",
        "from hpc_llm.cli import main; main()",
        "render",
        "+experiment=mpt_tiny",
        "container=apptainer",
        f"container.image={image}",
    ]
    env = dict(app_env, HOME=str(tmp_path), HPC_LLM_CACHE=str(tmp_path / "cache"))
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert proc.returncode == 2, explain(proc)
    [line] = proc.stderr.strip().splitlines()
    assert f"container.image='{image}' is not readable by this user" in line
    image.chmod(0o755)  # and the same command as that user passes once it can read it
    ok = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert ok.returncode == 0, explain(ok)


# -- hpc-llm container build | inspect | check (spython -> real apptainer) -------

#: the shape of containers/cpu.def (src argument, %files of the checkout, %environment,
#: %post, %test, labels), bootstrapped from the local skeleton: no registry is reachable
TEST_DEF = """\
Bootstrap: localimage
From: {base}

%arguments
    src=.

%files
    {{{{ src }}}}/pyproject.toml /opt/hpc_llm/src/pyproject.toml
    {{{{ src }}}}/hpc_llm /opt/hpc_llm/src/hpc_llm

%environment
    export PYTHONNOUSERSITE=1

%post
    set -eu
    python3 -c "import torch, composer, llmfoundry, hpc_llm" > /opt/hpc_llm/post-ran

%test
    python3 -c "import hpc_llm"

%labels
    org.hpc_llm.image test
    org.hpc_llm.llm-foundry {foundry}
"""


def train_pins() -> dict[str, str]:
    pins = {}
    for req in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["train"]:
        if "==" in req:
            name, version = req.split("==")
            pins[name.strip()] = version.strip()
    return pins


@pytest.mark.stack  # %post imports the training stack inside the image
def test_container_build_inspect_check_through_spython(sif, app_env, tmp_path):
    """A real ``apptainer build`` of a definition with %files/%post/%test, driven by spython.

    Wrapped in ``unshare -U -r``: this VM's capability bounding set lacks CAP_SYS_RESOURCE,
    so a root build's %post dies (docs/design/verified/apptainer.md); in a user
    namespace it builds as an unprivileged user's would.
    """
    definition = tmp_path / "test.def"
    definition.write_text(TEST_DEF.format(base=sif, foundry=train_pins()["llm-foundry"]))
    image = tmp_path / "built.sif"
    binds = [a for b in host_binds() for a in ("--bind", b)]
    build = ["unshare", "-U", "-r", PY, "-c", "from hpc_llm.cli import main; main()", "container", "build"]
    started = time.monotonic()
    built = subprocess.run([*build, str(definition), str(image), *binds], env=app_env, capture_output=True, text=True)
    assert built.returncode == 0, explain(built)
    build_s = time.monotonic() - started
    assert image.is_file() and build_s < 120
    again = run_cli(["container", "build", str(definition), str(image)], app_env)
    assert again.returncode == 2 and "pass --force" in again.stderr
    inspected = run_cli(["container", "inspect", str(image)], app_env)
    assert inspected.returncode == 0, explain(inspected)
    labels = json.loads(inspected.stdout)["attributes"]["labels"]
    assert labels["org.hpc_llm.llm-foundry"] == train_pins()["llm-foundry"]
    # %files copied the checkout and %post ran python3 inside the image
    files = subprocess.run(
        ["apptainer", "exec", *binds, str(image), "ls", "/opt/hpc_llm/src/hpc_llm/cli.py", "/opt/hpc_llm/post-ran"],
        capture_output=True,
        text=True,
    )
    assert files.returncode == 0, explain(files)
    ok = run_cli(["container", "check", f"container.image={image}", BINDS], app_env)
    assert ok.returncode == 0, explain(ok)
    for dist in ("hpc-llm", "torch", "mosaicml", "llm-foundry"):
        assert re.search(rf"^{dist}\s+image \S+\s+expected \S+\s+ok$", ok.stdout, re.M), ok.stdout


def test_container_check_names_every_plugin_and_fails_in_one_line(sif, app_env, request):
    """An hpc_llm plugin installed on the login side (here on PYTHONPATH, which Apptainer
    passes in) must be in the image too; one line says which is not.

    Installed outside every path the image sees (the checkout, which holds CI's --basetemp,
    and what Apptainer binds by default: $HOME, /tmp, /var/tmp, the working directory)."""
    plugins = Path(tempfile.mkdtemp(prefix="hpc_llm-test-plugins-", dir="/srv"))
    request.addfinalizer(lambda: shutil.rmtree(plugins, ignore_errors=True))
    assert not any(str(plugins).startswith(b + "/") for b in host_binds())
    pip_install(ROOT / "plugins" / "hpc-llm-jsonl", plugins)
    env = dict(app_env, PYTHONPATH=str(plugins))
    missing = run_cli(["container", "check", f"container.image={sif}", BINDS], env)
    assert missing.returncode == 1, explain(missing)
    assert re.search(r"^hpc-llm-jsonl\s+image -\s+expected 0\.1\.0\s+MISMATCH$", missing.stdout, re.M), missing.stdout
    [line] = missing.stderr.strip().splitlines()
    assert line == f"hpc_llm: error: container check of {sif}: hpc-llm-jsonl is missing in the image, 0.1.0 expected"
    # bound into the container, the same plugin is found there: everything matches
    binds = BINDS[:-1] + f",{plugins}]"
    ok = run_cli(["container", "check", f"container.image={sif}", binds], env)
    assert ok.returncode == 0, explain(ok)
    assert re.search(r"^hpc-llm-jsonl\s+image 0\.1\.0\s+expected 0\.1\.0\s+ok$", ok.stdout, re.M)


def test_container_check_of_an_image_without_python_is_one_line(no_python, app_env):
    proc = run_cli(["container", "check", f"container.image={no_python}"], app_env)
    assert proc.returncode == 1, explain(proc)
    [line] = proc.stderr.strip().splitlines()
    assert line == f"hpc_llm: error: container check of {no_python}: {NO_PYTHON}"


def test_shipped_definitions_pin_what_pyproject_pins():
    pins = train_pins()
    for name in ("h100.def", "cpu.def"):
        text = (ROOT / "containers" / name).read_text()
        assert f"torch=={pins['torch']}" in text
        for dist in ("llm-foundry", "mosaicml", "torch"):
            assert f"org.hpc_llm.{dist} {pins[dist]}" in text, (name, dist)
        # everything else comes from pyproject itself, at the versions the constraints pin
        assert '"/opt/hpc_llm/src[train]" -c /opt/hpc_llm/src/constraints/llmfoundry.txt' in text
    # the same stack for enroot (container=pyxis): docker build, then enroot import dockerd://
    text = (ROOT / "containers" / "h100.Dockerfile").read_text()
    assert f"torch=={pins['torch']}" in text
    for dist in ("llm-foundry", "mosaicml", "torch"):
        assert f"org.hpc_llm.{dist}={pins[dist]}" in text, dist
    assert '"/opt/hpc_llm/src[train]" -c /opt/hpc_llm/src/constraints/llmfoundry.txt' in text


# -- real Slurm jobs, every rank in apptainer exec ------------------------------

RUN = [
    "+experiment=mpt_tiny",
    "eval=none",
    "hydra/launcher=slurm",
    "resources.nodes=2",
    "resources.tasks_per_node=1",
    "container=apptainer",
    BINDS,
]


def files_containing(root: Path, text: str) -> list[Path]:
    needle = text.encode()
    return [p for p in root.rglob("*") if p.is_file() and not p.is_symlink() and needle in p.read_bytes()]


@pytest.mark.slurm
def test_a_2_node_run_trains_inside_apptainer_on_every_rank(slurm_env, sif, tmp_path):
    token = f"tok-{secrets.token_hex(8)}"  # made here: the run dir keeps a diff of this very file
    env = dict(slurm_env, HPC_LLM_RUNS=str(tmp_path / "runs"), MY_TOKEN=token)
    # long enough to be caught training: on an idle machine 12 batches took 0.5 s, over before the
    # agent's first heartbeat, and the test waited 300 s for a beat that never came
    args = [*RUN, "train.max_duration=200ba", f"container.image={sif}", "container.env_passthrough=[MY_TOKEN]"]
    job_id, run_dir = submit(args, env, tmp_path)
    # while rank 1 trains: the secret is in its environment, put there by Apptainer from
    # APPTAINERENV_MY_TOKEN (which Apptainer consumes: it is not passed on as such)
    live = wait_for(lambda: beat(run_dir, 1).get("pid") and beat(run_dir, 1), 300, "rank 1 to train")
    environ = dict(kv.split("=", 1) for kv in Path(f"/proc/{live['pid']}/environ").read_text().split("\0") if "=" in kv)
    assert environ["MY_TOKEN"] == token and "APPTAINERENV_MY_TOKEN" not in environ
    assert environ["APPTAINER_CONTAINER"] == str(sif)
    r = finished(run_dir, 300)
    assert r["status"] == "completed" and r["batches_done"] == 200, r.get("error")
    version = subprocess.run(["apptainer", "--version"], capture_output=True, text=True).stdout.strip()
    ranks = sorted(r["ranks"], key=lambda x: x["rank"])
    assert [x["rank"] for x in ranks] == [0, 1] and len({x["node"] for x in ranks}) == 2
    for x in ranks:
        assert x["container"] == {"image": str(sif), "apptainer_version": version}, x
    # the per-node check ran on both nodes before training
    [log] = run_dir.rglob("slurm-*.0.out")  # the first attempt's own batch log
    checked = set(re.findall(r"hpc_llm: container check ok on (\S+)", log.read_text()))
    assert checked == {x["node"] for x in ranks}, log.read_text()
    # checkpoints and results landed in the bound run dir; the secret is in no file
    assert Path(r["checkpoint"]).is_file() and str(run_dir) in r["checkpoint"]
    assert (run_dir / "results.json").is_file()
    assert files_containing(run_dir, token) == []
    assert job_id in r["slurm_job_ids"]


@pytest.mark.slurm
def test_a_torchtitan_run_trains_inside_its_own_image_on_2_nodes(slurm_env, apptainer, images_dir, tmp_path):
    """trainer=torchtitan through an image, as containers/torchtitan.def builds one: the
    image's python3 is torchtitan's environment (torch 2.14), not the login node's."""
    titan_bin = ROOT / ".venv-torchtitan" / "bin"
    image = apptainer_build(images_dir / "torchtitan.sif", make_skeleton(images_dir / "titan", venv_bin=titan_bin))
    env = dict(slurm_env, HPC_LLM_RUNS=str(tmp_path / "runs"), HPC_LLM_TORCHTITAN_PYTHON=str(titan_bin / "python"))
    args = ["+experiment=llama3_tiny", *RUN[2:], f"container.image={image}", "train.max_duration=10ba"]
    proc = run_app([*args, "hydra.launcher.wait=true", "hydra.launcher.poll_s=1"], env, cwd=tmp_path)
    assert proc.returncode == 0, explain(proc)
    [r] = results_of(tmp_path / "runs")
    assert r["status"] == "completed" and r["batches_done"] == 10, r.get("error")
    assert {x["container"]["image"] for x in r["ranks"]} == {str(image)} and len({x["node"] for x in r["ranks"]}) == 2
    job = r["provenance"]["job"]
    assert job["executable"].startswith(str(titan_bin)) and job["versions"]["torch"].startswith("2.14"), job
    assert job["versions"]["torchtitan"] == "0.3.0" and r["checkpoint"].endswith("/step-10")


@pytest.mark.slurm
def test_stage_true_runs_every_rank_from_a_node_local_copy(slurm_env, sif, tmp_path):
    scratch = tmp_path / "scratch"  # node-local in spirit: each node copies the image there
    env = dict(slurm_env, HPC_LLM_RUNS=str(tmp_path / "runs"))
    args = [
        *RUN,
        "train.max_duration=6ba",
        f"container.image={sif}",
        "container.stage=true",
        f"cluster.scratch={scratch}",
        "hydra.launcher.wait=true",
        "hydra.launcher.poll_s=1",
    ]
    proc = run_app(args, env, cwd=tmp_path)
    assert proc.returncode == 0, explain(proc)
    [r] = results_of(tmp_path / "runs")
    assert r["status"] == "completed" and r["batches_done"] == 6, r.get("error")
    [staged] = {x["container"]["image"] for x in r["ranks"]}
    assert re.fullmatch(rf"{scratch}/hpc_llm-image-[0-9a-f]{{12}}\.sif", staged), staged
    assert Path(staged).read_bytes() == sif.read_bytes()


@pytest.mark.slurm
def test_a_node_whose_image_has_no_python_is_named_and_nothing_trains(slurm_env, no_python, tmp_path):
    """Passes the login-side checks (a whole SIF); every node's check fails, by name."""
    env = dict(slurm_env, HPC_LLM_RUNS=str(tmp_path / "runs"))
    args = [
        "+experiment=mpt_tiny",
        "hydra/launcher=slurm",
        "resources.nodes=2",
        "resources.tasks_per_node=1",
        "container=apptainer",
        f"container.image={no_python}",
        "hydra.launcher.wait=true",
        "hydra.launcher.poll_s=1",
    ]
    proc = run_app(args, env, cwd=tmp_path)
    assert proc.returncode == 1, explain(proc)
    [out] = (tmp_path / "runs").rglob("slurm-*.0.out")
    text = out.read_text()
    failed = re.findall(r'container check failed on (n\d+): FATAL: +"python3": executable file not found', text)
    assert len(set(failed)) == 2, text
    assert "not training" in text
    assert not list((tmp_path / "runs").rglob("rank*.log"))


@pytest.mark.slurm
def test_a_preempted_run_in_apptainer_saves_requeues_and_resumes(slurm_env, sif, test_site, tmp_path):
    """Slurm's stop signal goes to the supervisor, which forwards it to the srun step; srun
    signals each task, which is apptainer's process, and Apptainer passes it on to the rank."""
    env = with_site(dict(slurm_env, HPC_LLM_RUNS=str(tmp_path / "runs")), test_site)
    args = [
        *RUN,
        "resources.nodes=1",
        "train.max_duration=200ba",
        "hydra.launcher.exclusive=true",
        f"container.image={sif}",
        *paced(0.1),  # still training when the preemption lands, on any machine
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
    [rank] = r["ranks"]
    assert rank["container"]["image"] == str(sif)


def test_no_stand_in_is_left():
    assert not (ROOT / "tests" / "standins").exists()
