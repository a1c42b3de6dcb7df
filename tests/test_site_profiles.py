"""Site config directories: cluster profiles (and other presets) outside the package.

``$HPC_LLM_CONFIG_PATH`` (colon-separated) then ``~/.config/hpc_llm`` ($XDG_CONFIG_HOME) are
on Hydra's search path after the shipped ``conf/`` (hydra_plugins/hpc_llm_site): found by
``python -m hpc_llm`` and every ``hpc-llm`` command that composes; the first file of a name
wins (shipped, then the variable's directories, then the user's); ``hpc-llm config`` and
``hpc-llm plugins`` say where a preset came from, and a site file a shipped one hides is
named on every run.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import ROOT, explain, run_app, run_cli

SHIPPED_H100 = ROOT / "conf" / "cluster" / "h100.yaml"
FIXED = ["hydra.launcher.python=/opt/hpc_llm/venv/bin/python", "hydra.sweep.dir=/shared/runs/golden"]


def profile(directory: Path, name: str, marker: str, group: str = "cluster") -> Path:
    """A CPU cluster profile that exports SITE_MARKER=<marker> (what the tests look for)."""
    path = directory / group / f"{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        "# @package _global_\n"
        f"cluster:\n  name: {name}\n  device: cpu\n  partition: sitepart\n"
        f"  env:\n    SITE_MARKER: {marker}\n"
        "resources:\n  tasks_per_node: 2\n  cpus_per_task: 1\n"
    )
    return path


@pytest.fixture
def site_env(app_env: dict[str, str], tmp_path: Path) -> dict[str, str]:
    """No site directory at all, whatever the machine's ~/.config has."""
    env = dict(app_env, XDG_CONFIG_HOME=str(tmp_path / "xdg"))
    env.pop("HPC_LLM_CONFIG_PATH", None)
    return env


def test_a_profile_in_hpc_llm_config_path_is_found_by_the_app_and_the_cli(site_env, tmp_path):
    empty, site = tmp_path / "empty", tmp_path / "site"
    empty.mkdir()
    path = profile(site, "sitecpu", "from-env-dir")
    env = dict(site_env, HPC_LLM_CONFIG_PATH=f"{empty}:{site}")

    app = run_app(["--cfg", "job", "cluster=sitecpu"], env, cwd=tmp_path)
    assert app.returncode == 0, explain(app)
    assert "name: sitecpu" in app.stdout and "SITE_MARKER: from-env-dir" in app.stdout

    config = run_cli(["config", "cluster=sitecpu"], env)
    assert config.returncode == 0, explain(config)
    assert config.stdout.splitlines()[0] == f"# cluster=sitecpu from {path} (site config, $HPC_LLM_CONFIG_PATH)"

    rendered = run_cli(["render", "+experiment=mpt_tiny", "cluster=sitecpu", *FIXED], env)
    assert rendered.returncode == 0, explain(rendered)
    assert "(cluster profile 'sitecpu')" in rendered.stdout
    assert "export SITE_MARKER=from-env-dir" in rendered.stdout and "#SBATCH --partition=sitepart" in rendered.stdout
    assert rendered.stderr == "", explain(rendered)

    plugins = run_cli(["plugins"], env)
    assert plugins.returncode == 0, explain(plugins)
    assert f"  {site} ($HPC_LLM_CONFIG_PATH)" in plugins.stdout
    assert "cluster=sitecpu" in plugins.stdout and str(path) in plugins.stdout


def test_a_profile_in_the_users_config_dir_is_found(site_env, tmp_path):
    path = profile(tmp_path / "xdg" / "hpc_llm", "mine", "from-xdg")
    config = run_cli(["config", "cluster=mine"], site_env)
    assert config.returncode == 0, explain(config)
    assert config.stdout.splitlines()[0] == f"# cluster=mine from {path} (site config, ~/.config/hpc_llm)"
    app = run_app(["--cfg", "job", "cluster=mine"], site_env, cwd=tmp_path)
    assert app.returncode == 0 and "SITE_MARKER: from-xdg" in app.stdout, explain(app)


def test_the_variables_directories_come_before_the_users_in_their_order(site_env, tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    used = profile(first, "same", "first")
    hidden = [profile(second, "same", "second"), profile(tmp_path / "xdg" / "hpc_llm", "same", "xdg")]
    env = dict(site_env, HPC_LLM_CONFIG_PATH=f"{first}:{second}")

    rendered = run_cli(["render", "+experiment=mpt_tiny", "cluster=same", *FIXED], env)
    assert rendered.returncode == 0, explain(rendered)
    assert "export SITE_MARKER=first" in rendered.stdout

    config = run_cli(["config", "cluster=same"], env)
    assert config.returncode == 0, explain(config)
    assert config.stdout.splitlines()[0] == (
        f"# cluster=same from {used} (site config, $HPC_LLM_CONFIG_PATH); hidden, not used: {hidden[0]}, {hidden[1]}"
    )
    plugins = run_cli(["plugins"], env).stdout
    assert f"{hidden[0]}  (not used: hidden by {used})" in plugins
    assert plugins.index(str(first)) < plugins.index(str(second)) < plugins.index(str(tmp_path / "xdg"))

    swapped = run_cli(
        ["render", "+experiment=mpt_tiny", "cluster=same", *FIXED], dict(env, HPC_LLM_CONFIG_PATH=f"{second}:{first}")
    )
    assert "export SITE_MARKER=second" in swapped.stdout, explain(swapped)


def test_a_site_file_with_a_shipped_name_is_not_used_and_said_so(site_env, tmp_path):
    """Shipped names come first: a site cluster/h100.yaml cannot silently change cluster=h100;
    every run names the file it ignores, and `hpc-llm config` / `plugins` show it."""
    site = tmp_path / "site"
    shadow = profile(site, "h100", "shadow")
    env = dict(site_env, HPC_LLM_CONFIG_PATH=str(site))
    warning = (
        f"hpc_llm: warning: site config {shadow} is not used: hpc_llm ships cluster=h100 "
        f"({SHIPPED_H100}), which is found first; "
        "rename it (e.g. cluster/site_h100.yaml, chosen with cluster=site_h100)"
    )

    rendered = run_cli(
        ["render", "+experiment=mpt_tiny", "cluster=h100", "train.global_train_batch_size=64", *FIXED], env
    )
    assert rendered.returncode == 0, explain(rendered)
    assert "SITE_MARKER" not in rendered.stdout and "#SBATCH --gpus-per-node=8" in rendered.stdout
    assert rendered.stderr.splitlines() == [warning], explain(rendered)

    app = run_app(["--cfg", "job", "cluster=h100"], env, cwd=tmp_path)
    assert app.returncode == 0 and "SITE_MARKER" not in app.stdout, explain(app)
    assert warning in app.stderr.splitlines(), explain(app)

    config = run_cli(["config", "cluster=h100"], env)
    assert config.stdout.splitlines()[0] == (
        f"# cluster=h100 from {SHIPPED_H100} (shipped with hpc_llm); hidden, not used: {shadow}"
    )
    plugins = run_cli(["plugins"], env).stdout
    assert f"{shadow}  (not used: hpc_llm ships {SHIPPED_H100})" in plugins


def test_site_presets_of_other_groups_and_the_error_for_an_unknown_name(site_env, tmp_path):
    site = tmp_path / "site"
    exp = site / "experiment" / "site_tiny.yaml"
    exp.parent.mkdir(parents=True)
    exp.write_text(
        "# @package _global_\ndefaults:\n  - override /model: mpt_tiny\n"
        "experiment: site_tiny\ntrain:\n  max_duration: 7ba\n"
    )
    profile(site, "sitecpu", "x")
    env = dict(site_env, HPC_LLM_CONFIG_PATH=str(site))
    config = run_cli(["config", "+experiment=site_tiny"], env)
    assert config.returncode == 0, explain(config)
    assert config.stdout.splitlines()[0].startswith(f"# experiment=site_tiny from {exp} (site config")
    assert "max_duration: 7ba" in config.stdout

    bad = run_app(["cluster=nope"], env, cwd=tmp_path)
    assert bad.returncode == 2, explain(bad)
    [line] = bad.stderr.splitlines()
    assert line == (
        f"hpc_llm: error: unknown cluster 'nope'; allowed: a100, h100, local, sitecpu "
        f"(site config directories searched too: {site})"
    )


def test_the_example_site_profile_carries_the_seeds_fabric(site_env, tmp_path):
    """docs/examples/site is a site directory: the seeds' RoCE settings left cluster=h100 for
    its cluster/roce_h100_example.yaml, copied into ~/.config/hpc_llm as the README does."""
    import shutil

    example = ROOT / "docs" / "examples" / "site" / "cluster" / "roce_h100_example.yaml"
    mine = tmp_path / "xdg" / "hpc_llm" / "cluster"
    mine.mkdir(parents=True)
    shutil.copy(example, mine / "mysite.yaml")
    fabric = (
        "export NCCL_IB_HCA='^=mlx5_1,mlx5_2,mlx5_7,mlx5_8'",
        "export NCCL_IB_GID_INDEX=1",
        "#SBATCH --gpus-per-node=h100:8",
    )
    copied = run_cli(["render", "+experiment=mpt125m_c4", "cluster=mysite", "resources.nodes=8", *FIXED], site_env)
    assert copied.returncode == 0, explain(copied)
    assert all(line in copied.stdout for line in (*fabric, "#SBATCH --nodes=8")), copied.stdout
    config = run_cli(["config", "cluster=mysite"], site_env)
    assert config.stdout.startswith(f"# cluster=mysite from {mine / 'mysite.yaml'} (site config, ~/.config/hpc_llm)")

    env = dict(site_env, HPC_LLM_CONFIG_PATH=str(example.parents[1]))
    named = run_cli(["render", "+experiment=mpt125m_c4", "cluster=roce_h100_example", *FIXED], env)
    assert named.returncode == 0, explain(named)
    assert all(line in named.stdout for line in fabric) and "(cluster profile 'roce_h100_example')" in named.stdout
    generic = run_cli(["render", "+experiment=mpt125m_c4", "cluster=h100", "resources.nodes=2", *FIXED], env)
    assert "NCCL_IB_HCA" not in generic.stdout and "#SBATCH --gpus-per-node=8\n" in generic.stdout, explain(generic)
