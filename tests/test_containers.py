"""Apptainer: rendered scripts, bad input, spython build/check/inspect, and a
real Slurm run whose every task goes through ``apptainer exec``.

``tests/standins/apptainer`` stands in for Apptainer (see its docstring): it checks
the flags, image and bind sources it is given, records each call and runs the
inner command on the host.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

from tests.conftest import PY, ROOT, explain, results_of, run_app, run_cli

STANDINS = ROOT / "tests" / "standins"
GOLDEN = ROOT / "tests" / "golden"
FIXED = ["hydra.sweep.dir=/shared/runs/golden", "hydra.launcher.python=/opt/hpc_llm/venv/bin/python"]
IMAGE_IN_GOLDEN = "/shared/images/hpc_llm-h100.sif"


@pytest.fixture
def image(tmp_path: Path) -> Path:
    """An "image" the stand-in runs: its python3 is this interpreter (which has hpc_llm)."""
    path = tmp_path / "images" / "hpc_llm.sif"
    path.parent.mkdir()
    path.write_text(json.dumps({"python": sys.executable, "labels": {}}))
    return path


@pytest.fixture
def standin_env(app_env: dict[str, str], tmp_path: Path) -> dict[str, str]:
    return dict(
        app_env,
        PATH=f"{STANDINS}{os.pathsep}{app_env['PATH']}",
        STANDIN_APPTAINER_LOG=str(tmp_path / "apptainer-calls.jsonl"),
    )


def calls(env: dict[str, str]) -> list[dict]:
    path = Path(env["STANDIN_APPTAINER_LOG"])
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.parametrize("container", ["none", "apptainer"])
def test_render_h100_8_nodes_matches_golden(container, app_env, image):
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
        args.append(f"container.image={image}")
    proc = run_cli(["render", *args], env)
    assert proc.returncode == 0, explain(proc)
    text = proc.stdout.replace(str(image), IMAGE_IN_GOLDEN)
    golden = GOLDEN / f"sbatch_h100_8nodes_container_{container}.sh"
    if not golden.exists():
        golden.write_text(text)
        pytest.fail(f"wrote missing golden file {golden}; check it and commit it")
    assert text == golden.read_text(), f"render changed; delete {golden} to regenerate"


def test_apptainer_render_wraps_every_task_with_gpus_and_binds(app_env, image, tmp_path):
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
            f"container.image={image}",
            f"container.binds=[{data}:/data:ro]",
            f"checkpoint.location={tmp_path / 'ckpt'}",
            *FIXED,
        ],
        app_env,
    )
    assert proc.returncode == 0, explain(proc)
    [task_line] = [ln for ln in proc.stdout.splitlines() if "submitit.core._submit" in ln]
    assert task_line.strip().startswith("apptainer exec --nv --bind ")
    for bind in ("/shared/runs/golden/0", f"{tmp_path / 'ckpt'}", f"{data}:/data:ro"):
        assert f"--bind {bind} " in task_line
    assert f"{image} python3 -u -m submitit.core._submit /shared/runs/golden/0/.submitit" in task_line
    # the checkpoint folder exists before apptainer binds it; each node is checked first
    [mkdir] = [ln.split() for ln in proc.stdout.splitlines() if ln.startswith("mkdir -p ")]
    assert str(tmp_path / "ckpt") in mkdir[2:]
    assert "container check failed on ${SLURMD_NODENAME:-$(hostname)}" in proc.stdout


def test_secrets_pass_into_the_container_by_name_only(app_env, image):
    env = dict(app_env, MY_TOKEN="tok-value-123")
    proc = run_cli(
        [
            "render",
            "+experiment=mpt_tiny",
            "container=apptainer",
            f"container.image={image}",
            "container.env_passthrough=[MY_TOKEN]",
            *FIXED,
        ],
        env,
    )
    assert proc.returncode == 0, explain(proc)
    assert 'export APPTAINERENV_MY_TOKEN="${MY_TOKEN}"' in proc.stdout
    assert "tok-value-123" not in proc.stdout and "--env" not in proc.stdout


def test_stage_copies_the_image_to_node_local_disk(app_env, image):
    proc = run_cli(
        [
            "render",
            "+experiment=mpt_tiny",
            "container=apptainer",
            f"container.image={image}",
            "container.stage=true",
            "cluster.scratch=/local/scratch",
            *FIXED,
        ],
        app_env,
    )
    assert proc.returncode == 0, explain(proc)
    staged = re.search(r"mv -f \S+ (/local/scratch/hpc_llm-image-[0-9a-f]{12}\.sif)", proc.stdout)
    assert staged, proc.stdout
    [task_line] = [ln for ln in proc.stdout.splitlines() if "submitit.core._submit" in ln]
    assert f" {staged.group(1)} python3 " in task_line and "--bind /local/scratch " in task_line


def test_apptainer_missing_on_login_node_warns_but_renders(app_env, image):
    env = dict(app_env, PATH=os.path.dirname(sys.executable))  # no apptainer here
    proc = run_cli(["render", "+experiment=mpt_tiny", "container=apptainer", f"container.image={image}", *FIXED], env)
    assert proc.returncode == 0, explain(proc)
    assert "warning: 'apptainer' is not on PATH here; the job checks for it on every node" in proc.stderr


BAD = [
    (["container.image=/nowhere/x.sif"], "container.image='/nowhere/x.sif' does not exist"),
    (["container.image=docker://nvcr.io/nvidia/pytorch:24.05"], "a registry URI would be pulled by every node"),
    (["container.image={image}", "container.binds=[/nowhere/data]"], "bind source '/nowhere/data' does not exist"),
    (
        ["container.image={image}", "container.binds=[{tmp}:/data,{image_dir}:/data]"],
        "conflicting binds for /data in the container",
    ),
    (["container.image={image}", "container.binds=[{tmp}:data]"], "the destination must be an absolute path"),
    (["container.image={image}", "container.flags=[--cleanenv]"], "'--cleanenv' is not allowed: it drops the SLURM_*"),
    (["container.image={image}", "container.flags=[--nv]"], "set container.gpus"),
    (["container=apptainer"], "container.image"),
]


@pytest.mark.parametrize("overrides,message", BAD, ids=[" ".join(b[0]) for b in BAD])
def test_bad_container_input_is_one_line_before_anything(overrides, message, standin_env, image, tmp_path, runs_dir):
    overrides = [o.format(image=image, tmp=tmp_path, image_dir=image.parent) for o in overrides]
    proc = run_app(
        ["+experiment=mpt_tiny", "hydra/launcher=slurm", "container=apptainer", *overrides],
        standin_env,
        cwd=tmp_path,
        timeout=120,
    )
    assert proc.returncode == 2, explain(proc)
    [line] = proc.stderr.strip().splitlines()
    assert message in line, line
    assert not runs_dir.exists()


def test_unreadable_image_is_refused(app_env, image, tmp_path, tmp_path_factory):
    """Run as an ordinary user (nobody): root reads any file, so the check is for users."""
    image.chmod(0o600)
    # pytest makes its directories 0700 (under xdist one level more): the user must see the run dir
    base = Path(str(tmp_path_factory.getbasetemp()))
    root = base.parent if base.name.startswith("popen-gw") else base
    for d in (tmp_path, *tmp_path.parents):
        d.chmod(d.stat().st_mode | 0o755)
        if d == root:
            break
    as_user = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"] if os.geteuid() == 0 else []
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
    image.chmod(0o644)  # and the same command as that user passes once it can read it
    ok = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert ok.returncode == 0, explain(ok)


def test_container_build_inspect_check_through_spython(standin_env, tmp_path):
    """spython drives the (stand-in) executable: build from the shipped .def, inspect, check versions."""
    sif = tmp_path / "cpu.sif"
    env = dict(standin_env, STANDIN_IMAGE_PYTHON=sys.executable)
    built = run_cli(["container", "build", "containers/cpu.def", str(sif)], env)
    assert built.returncode == 0, explain(built)
    manifest = json.loads(sif.read_text())
    assert manifest["fakeroot"] is True and manifest["build_args"]["src"] == str(ROOT)
    again = run_cli(["container", "build", "containers/cpu.def", str(sif)], env)
    assert again.returncode == 2 and "pass --force" in again.stderr
    inspected = run_cli(["container", "inspect", str(sif)], env)
    assert inspected.returncode == 0, explain(inspected)
    assert json.loads(inspected.stdout)["attributes"]["labels"]["org.hpc_llm.llm-foundry"] == "0.22.0"
    ok = run_cli(["container", "check", f"container.image={sif}"], env)
    assert ok.returncode == 0, explain(ok)
    assert re.search(r"llm-foundry\s+image 0\.22\.0\s+expected 0\.22\.0\s+ok", ok.stdout)
    # an image whose Python lacks the stack: every pinned package is named
    bare = tmp_path / "bare.sif"
    bare.write_text(json.dumps({"python": "/usr/bin/python3", "labels": {}}))
    bad = run_cli(["container", "check", f"container.image={bare}"], env)
    assert bad.returncode == 1, explain(bad)
    assert "problem: hpc-llm is missing in the image, 0.1.0 expected" in bad.stdout


def test_shipped_definitions_pin_what_pyproject_pins():
    pins = {}
    for req in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["train"]:
        if "==" in req:
            name, version = req.split("==")
            pins[name.strip()] = version.strip()
    for name in ("h100.def", "cpu.def"):
        text = (ROOT / "containers" / name).read_text()
        assert f"torch=={pins['torch']}" in text
        for dist in ("llm-foundry", "mosaicml", "torch"):
            assert f"org.hpc_llm.{dist} {pins[dist]}" in text, (name, dist)
        assert '"/opt/hpc_llm/src[train]"' in text  # everything else comes from pyproject itself


@pytest.mark.slurm
def test_slurm_run_trains_through_apptainer_exec_on_every_task(slurm_env, standin_env, image, runs_dir, tmp_path):
    env = dict(
        slurm_env,
        PATH=standin_env["PATH"],
        STANDIN_APPTAINER_LOG=standin_env["STANDIN_APPTAINER_LOG"],
        MY_TOKEN="tok-value-123",
        STANDIN_SECRETS="MY_TOKEN",
    )
    proc = run_app(
        [
            "+experiment=mpt_tiny",
            "train.max_duration=6ba",
            "eval=none",
            "hydra/launcher=slurm",
            "resources.nodes=2",
            "resources.tasks_per_node=1",
            "container=apptainer",
            f"container.image={image}",
            "container.env_passthrough=[MY_TOKEN]",
            # the job gets an explicit --export list: the stand-in's own variables must be on it
            "hydra.launcher.env_passthrough=[STANDIN_APPTAINER_LOG,STANDIN_SECRETS]",
            "hydra.launcher.wait=true",
            "hydra.launcher.poll_s=1",
        ],
        env,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, explain(proc)
    [r] = results_of(runs_dir)
    assert r["status"] == "completed" and r["batches_done"] == 6, r.get("error")
    recorded = calls(env)
    checks = [c for c in recorded if c["command"][-1] == "import hpc_llm"]
    tasks = [c for c in recorded if "submitit.core._submit" in c["command"]]
    assert len({c["node"] for c in checks}) == 2  # one check per node
    assert sorted(int(c["rank_env"]["SLURM_PROCID"]) for c in tasks) == [0, 1]
    for c in tasks:
        assert r["run_dir"] in c["binds"] and c["image"] == str(image) and not c["nv"]
        assert c["apptainerenv"] == ["MY_TOKEN"] and c["rank_env"]["MASTER_ADDR"]
    assert len({c["node"] for c in tasks}) == 2


@pytest.mark.slurm
def test_a_node_failing_the_container_check_is_named_and_nothing_trains(slurm_env, standin_env, tmp_path, runs_dir):
    broken = tmp_path / "broken.sif"
    broken.write_text(json.dumps({"python": "/nonexistent/python3"}))
    env = dict(slurm_env, PATH=standin_env["PATH"])
    proc = run_app(
        [
            "+experiment=mpt_tiny",
            "hydra/launcher=slurm",
            "container=apptainer",
            f"container.image={broken}",
            "hydra.launcher.wait=true",
            "hydra.launcher.poll_s=1",
        ],
        env,
        cwd=tmp_path,
    )
    assert proc.returncode == 1, explain(proc)
    [out] = runs_dir.rglob("slurm-*.out")
    text = out.read_text()
    assert re.search(r"container check failed on n\d+: FATAL: +/nonexistent/python3: No such file", text), text
    assert "not training" in text
    assert not list(runs_dir.rglob("rank*.log"))
