"""The wheel carries conf/ (and the Hydra plugins) and finds them when installed."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

from tests.conftest import ROOT, explain


def test_wheel_ships_and_resolves_package_data(tmp_path: Path):
    wheels = tmp_path / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(ROOT)],
        check=True,
        capture_output=True,
        text=True,
    )
    [whl] = wheels.glob("hpc_llm-*.whl")
    names = set(zipfile.ZipFile(whl).namelist())
    for required in (
        "hpc_llm/_data/conf/config.yaml",
        "hpc_llm/_data/conf/experiment/mpt_tiny.yaml",
        "hpc_llm/_data/sbatch_templates/default.sh.j2",
        "hpc_llm/assets/tiny_corpus.txt",
        "hpc_llm/py.typed",
        "hydra_plugins/hpc_llm_launchers/hpc_llm_plugins.py",
        "hydra_plugins/hpc_llm_site/searchpath.py",
    ):
        assert required in names, required
    site = tmp_path / "site"
    zipfile.ZipFile(whl).extractall(site)
    env = {"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    code = "from hpc_llm.paths import conf_dir; import hpc_llm; print(conf_dir()); print(hpc_llm.__file__)"
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True)
    assert out.returncode == 0, explain(out)
    conf, module = out.stdout.split()
    assert conf == str(site / "hpc_llm" / "_data" / "conf")
    assert module.startswith(str(site))
    # the installed wheel's Hydra plugin puts a site config directory on the search path
    profile = tmp_path / "site_conf" / "cluster" / "wheelsite.yaml"
    profile.parent.mkdir(parents=True)
    profile.write_text("# @package _global_\ncluster:\n  name: wheelsite\n")
    cfg = subprocess.run(
        [
            sys.executable,
            "-c",
            "from hpc_llm.cli import main; main()",
            *("config", "+experiment=mpt_tiny", "eval=none", "cluster=wheelsite"),
        ],
        # the check before the queue is off, as everywhere in the suite but where it is the subject:
        # it starts the training stack (~10 s)
        env=dict(env, HPC_LLM_CONFIG_PATH=str(profile.parents[1]), HPC_LLM_PRECHECK="0"),
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert cfg.returncode == 0, explain(cfg)
    assert "max_duration: 40ba" in cfg.stdout
    assert cfg.stdout.startswith(f"# cluster=wheelsite from {profile} (site config, $HPC_LLM_CONFIG_PATH)\n")
