"""Hydra's launcher contract, kept by both of hpc_llm's launchers.

Two ways of checking it:

* Hydra's own conformance suite for launcher plugins
  (``hydra.test_utils.launcher_common_tests``, what hydra-submitit-launcher
  and Hydra's basic launcher are tested with), run against
  ``hydra/launcher=local`` and ``hydra/launcher=slurm`` (on the dev cluster).
* A plain Hydra app (``tests/hydra_app``, not hpc_llm's task) run under
  Hydra's basic launcher, ``local`` and ``slurm``: every job must see the
  same config (a resolver registered only in the launching process
  included), the same Hydra runtime, env_set and output files.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hydra.test_utils.launcher_common_tests import (
    BatchedSweeperTestSuite,
    IntegrationTestSuite,
    LauncherTestSuite,
)

import hydra_plugins.hpc_llm_launchers.hpc_llm_plugins  # noqa: F401  registers hydra/launcher=local|slurm
from tests.conftest import ROOT, explain

APP = ROOT / "tests" / "hydra_app" / "app.py"


@pytest.fixture(autouse=True)
def _fresh_hydra_singletons():
    """Hydra's suite runs in this process and assumes a fresh Hydra (no version_base set:
    hydra.job.chdir then defaults to true); other tests in the same worker may have composed
    with version_base="1.3". Start from fresh singletons, restore the previous ones after."""
    from hydra.core.singleton import Singleton
    from hydra.version import VersionBase

    state = Singleton.get_state()
    Singleton._instances.pop(VersionBase, None)  # type: ignore[attr-defined]
    yield
    Singleton.set_state(state)


@pytest.mark.parametrize("launcher_name, overrides", [("local", ["hydra.launcher.stream=false"])])
class TestLocalLauncher(LauncherTestSuite):
    pass


@pytest.mark.parametrize(
    "launcher_name, overrides", [("local", ["hydra/sweeper=basic", "hydra.sweeper.max_batch_size=2"])]
)
class TestLocalLauncherBatched(BatchedSweeperTestSuite):
    pass


@pytest.mark.parametrize(
    "task_launcher_cfg, extra_flags",
    [({}, ["-m", "hydra/launcher=local", "hydra/job_logging=disabled", "hydra/hydra_logging=disabled"])],
)
class TestLocalLauncherIntegration(IntegrationTestSuite):
    pass


@pytest.fixture
def on_dev_cluster(dev_cluster, monkeypatch):
    """Hydra's suite runs the sweep in this process: point it at the dev cluster."""
    monkeypatch.setenv("SLURM_CONF", str(dev_cluster.conf))
    return dev_cluster


@pytest.mark.slurm
@pytest.mark.usefixtures("on_dev_cluster")
@pytest.mark.parametrize(
    "launcher_name, overrides", [("slurm", ["hydra.launcher.wait=true", "hydra.launcher.poll_s=1"])]
)
class TestSlurmLauncher(LauncherTestSuite):
    pass


def run_plain_app(launcher: list[str], sweep_dir: Path, env: dict[str, str]) -> list[dict]:
    proc = subprocess.run(
        [sys.executable, str(APP), "-m", "x=3,4", *launcher, f"hydra.sweep.dir={sweep_dir}"],
        env=env,
        cwd=sweep_dir.parent,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, explain(proc)
    seen = []
    for num in (0, 1):
        job = sweep_dir / str(num)
        assert (job / ".hydra" / "config.yaml").is_file() and (job / ".hydra" / "overrides.yaml").is_file()
        assert (job / "app.log").is_file(), f"no job log (hydra.job_logging) in {job}"
        seen.append(json.loads((job / "seen.json").read_text()))
    return seen


def comparable(seen: dict, sweep_dir: Path) -> dict:
    out = dict(seen)
    out["output_dir"] = str(Path(seen["output_dir"]).relative_to(sweep_dir))
    out.pop("cwd")  # hydra.job.chdir=false: each launcher's own working dir
    return out


@pytest.mark.slurm
def test_a_plain_hydra_app_sees_the_same_under_basic_local_and_slurm(slurm_env, tmp_path):
    env = {k: v for k, v in slurm_env.items() if not k.startswith("HPC_LLM_")}
    env["HPC_LLM_HOME"] = slurm_env["HPC_LLM_HOME"]
    results = {}
    for name, launcher in {
        "basic": ["hydra/launcher=basic"],
        "local": ["hydra/launcher=local", "hydra.launcher.stream=false"],
        "slurm": ["hydra/launcher=slurm", "hydra.launcher.wait=true", "hydra.launcher.poll_s=1"],
    }.items():
        sweep = tmp_path / name / "sweep"
        sweep.parent.mkdir()
        results[name] = [comparable(s, sweep) for s in run_plain_app(launcher, sweep, env)]
    assert results["basic"][0]["cfg"] == {"x": 3, "doubled": 6} and results["basic"][1]["cfg"]["doubled"] == 8
    assert results["basic"][0]["env_set"] == "set by hydra.job.env_set"
    assert not results["basic"][0]["has_hydra_node"]
    assert results["local"] == results["basic"]
    assert results["slurm"] == results["basic"]


def test_a_copied_job_config_is_a_deep_copy_with_its_flags():
    """copy_config (the launchers' fast deepcopy): equal, independent, same flags and types."""
    from dataclasses import dataclass

    from omegaconf import OmegaConf, open_dict

    from hpc_llm.launch.base import copy_config

    @dataclass
    class Local:  # a class pickle cannot name: the copy falls back to deepcopy
        a: int = 1

    for original in (
        OmegaConf.create({"a": {"b": [1, 2]}, "c": "${a.b}"}),
        OmegaConf.structured(Local),
    ):
        OmegaConf.set_struct(original, True)
        copied = copy_config(original)
        assert copied == original and copied is not original
        assert OmegaConf.is_struct(copied) and OmegaConf.get_type(copied) is OmegaConf.get_type(original)
        with open_dict(copied):
            copied.extra = 1
        assert "extra" not in original


def test_a_job_return_makes_its_config_when_first_read():
    from hpc_llm.launch.base import LazyJobReturn

    made: list[int] = []
    ret = LazyJobReturn(lambda: made.append(1) or {"x": 1})  # type: ignore[arg-type,func-returns-value]
    ret.overrides = ["x=1"]
    assert made == []
    assert ret.cfg == {"x": 1} and ret.cfg == {"x": 1} and made == [1]
    ret.cfg = {"x": 2}
    assert ret.cfg == {"x": 2} and made == [1]
