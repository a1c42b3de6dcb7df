"""What hpc_llm's two launchers share through their base (hpc_llm.launch.base)."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from hpc_llm import errors
from hpc_llm.config.launcher_options import LocalLauncherConf, SlurmLauncherConf
from hpc_llm.errors import ConfigError
from hpc_llm.launch.base import BaseLauncher, shown
from hpc_llm.launch.local import LocalLauncher
from hpc_llm.launch.slurm import SlurmLauncher


def test_both_launchers_name_their_resources_by_one_key():
    cfg = OmegaConf.create({"res": {"nodes": 1, "tasks_per_node": 3}})
    local = LocalLauncher(resources_key="res")
    assert local.ranks(cfg) == 3
    local.check_job(cfg)
    with pytest.raises(ConfigError, match=r"res\.nodes=2: hydra/launcher=local runs one node"):
        local.check_job(OmegaConf.create({"res": {"nodes": 2}}))
    for conf in (LocalLauncherConf, SlurmLauncherConf):
        assert OmegaConf.structured(conf).resources_key == "resources"


def test_the_old_local_launcher_keys_still_work_with_a_deprecation_warning(capsys, monkeypatch):
    monkeypatch.setattr(errors, "_warned", set())
    local = LocalLauncher(nodes_key="a.n", tasks_key="a.t")
    assert local.ranks(OmegaConf.create({"a": {"t": 2}})) == 2
    err = capsys.readouterr().err
    assert "hydra.launcher.nodes_key is deprecated; use hydra.launcher.resources_key" in err
    assert "hydra.launcher.tasks_key is deprecated" in err


def test_check_job_is_declared_on_the_base_and_accepts_by_default():
    class Plain(BaseLauncher):
        def launch(self, job_overrides, initial_job_idx):  # type: ignore[override]
            return []

    assert Plain().check_job(OmegaConf.create({})) is None
    assert LocalLauncher.check_job is not BaseLauncher.check_job
    assert SlurmLauncher.check_job is not BaseLauncher.check_job


def test_overrides_are_shown_in_one_line():
    assert shown(["resources.nodes=2", "hydra.launcher.wait=true"]) == "resources.nodes=2"
    assert shown([]) == "(defaults)"
