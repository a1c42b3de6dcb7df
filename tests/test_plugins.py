"""Real pluggy discovery of pip-installed plugin packages.

Packages are installed with ``pip install --target`` into a per-test
directory put on PYTHONPATH, so the test environment itself is not changed,
and discovered through their ``hpc_llm`` entry points like any user install.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from hpc_llm.plugins.manager import Plugins
from tests.conftest import EXAMPLE_PLUGIN as EXAMPLE
from tests.conftest import explain, pip_install, run_cli


def make_package(root: Path, dist: str, ep_name: str, module: str, body: str) -> Path:
    pkg = root / dist
    (pkg / module).mkdir(parents=True)
    (pkg / "pyproject.toml").write_text(
        textwrap.dedent(f"""
        [build-system]
        requires = ["hatchling"]
        build-backend = "hatchling.build"
        [project]
        name = "{dist}"
        version = "9.9"
        [project.entry-points.hpc_llm]
        {ep_name} = "{module}"
        [tool.hatch.build.targets.wheel]
        packages = ["{module}"]
    """)
    )
    (pkg / module / "__init__.py").write_text(textwrap.dedent(body))
    return pkg


CLONE = """
    from hpc_llm import hookimpl
    from hpc_llm.plugins.base import DataSource

    class Clone(DataSource):
        name = "jsonl"
        description = "another jsonl"
        def train_config(self, section, plan):
            return {}

    @hookimpl
    def hpc_llm_register_data_sources(register):
        register(Clone())
"""

TYPO = """
    from hpc_llm import hookimpl

    @hookimpl
    def hpc_llm_register_data_source(register):
        pass
"""


@pytest.fixture
def site(tmp_path: Path, app_env: dict[str, str]) -> tuple[Path, dict[str, str]]:
    target = tmp_path / "site"
    env = dict(app_env, PYTHONPATH=str(target))
    return target, env


def test_builtins_are_registered_through_the_same_manager():
    plugins = Plugins(external=False)
    assert plugins.names("parallelism") == ["ddp", "fsdp", "hsdp"]
    assert set(plugins.names("data")) >= {"tiny_corpus", "mds", "remote_mds"}
    assert plugins.names("checkpoint") == ["folder", "uri"]
    assert plugins.names("evaluator") == ["heldout", "hf_convert", "inference"]
    assert plugins.names("container") == ["apptainer", "none"]
    assert plugins.names("health_check") == ["allreduce", "container", "gpu"]
    assert {e.package for e in plugins.entries()} == {"hpc-llm (built-in)"}


def test_example_package_is_discovered_from_its_entry_point(site):
    target, env = site
    before = run_cli(["plugins"], env)
    assert before.returncode == 0 and "jsonl" not in before.stdout, explain(before)
    pip_install(EXAMPLE, target)
    proc = run_cli(["plugins"], env)
    assert proc.returncode == 0, explain(proc)
    row = next(line for line in proc.stdout.splitlines() if " jsonl " in line)
    assert "hpc-llm-jsonl 0.1.0" in row and "data source" in row
    for name in ("ddp", "fsdp", "hsdp"):
        assert f" {name} " in proc.stdout


def test_name_collision_is_reported_not_resolved(site, tmp_path):
    target, env = site
    pip_install(EXAMPLE, target)
    pip_install(make_package(tmp_path / "src", "jsonl-clone", "jsonl_clone", "jsonl_clone", CLONE), target)
    proc = run_cli(["plugins"], env)
    assert proc.returncode == 1, explain(proc)
    assert "COLLISION" in proc.stdout
    assert "collision: data source 'jsonl' is registered by" in proc.stdout
    data = tmp_path / "d.jsonl"
    data.write_text('{"text": "hello"}\n')
    used = run_cli(["config", "data.name=jsonl", f"data.path={data}"], env)
    assert used.returncode == 2, explain(used)
    assert "hpc-llm-jsonl 0.1.0" in used.stderr and "jsonl-clone 9.9" in used.stderr
    assert len(used.stderr.strip().splitlines()) == 1
    # Blocking one package by name resolves it.
    blocked = run_cli(
        ["config", "data.name=jsonl", f"data.path={data}", "+train.tokenizer.name=x"],
        dict(env, HPC_LLM_BLOCK_PLUGINS="jsonl-clone"),
    )
    assert blocked.returncode == 0, explain(blocked)
    assert "train_loader" in blocked.stdout


def test_a_plugin_can_be_blocked_from_the_config(site, tmp_path):
    target, env = site
    pip_install(EXAMPLE, target)
    data = tmp_path / "d.jsonl"
    data.write_text('{"text": "hello"}\n')
    proc = run_cli(["config", "data.name=jsonl", f"data.path={data}", "plugins.block=[jsonl]"], env)
    assert proc.returncode == 2, explain(proc)
    assert "unknown data source 'jsonl'" in proc.stderr


def test_misspelled_hook_is_an_error(site, tmp_path):
    target, env = site
    pip_install(make_package(tmp_path / "src", "typo-plugin", "typo", "typo_plugin", TYPO), target)
    proc = run_cli(["plugins"], env)
    assert proc.returncode == 2, explain(proc)
    assert "plugin 'typo' (typo-plugin 9.9) implements a hook that does not exist" in proc.stderr
    assert "hpc_llm_register_data_source" in proc.stderr
    assert "hpc_llm_register_data_sources" in proc.stderr  # listed among the known hooks


def test_example_plugin_validates_its_file(site, tmp_path):
    target, env = site
    pip_install(EXAMPLE, target)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"body": "no text field"}\n')
    proc = run_cli(["config", "data.name=jsonl", f"data.path={bad}"], env)
    assert proc.returncode == 2
    assert "line 1 has no 'text' field" in proc.stderr


WRONG_ARGS = """
    from hpc_llm import hookimpl

    @hookimpl
    def hpc_llm_register_data_sources(register, config):
        pass
"""

UNMARKED = """
    from hpc_llm import hookimpl
    from hpc_llm.plugins.base import DataSource

    class Mine(DataSource):
        name = "mine"
        def train_config(self, section, plan):
            return {}

    def hpc_llm_register_data_sources(register):   # no @hookimpl: pluggy ignores it
        register(Mine())
"""

HELPER = """
    from hpc_llm import hookimpl
    from hpc_llm.plugins.base import DataSource

    class Helped(DataSource):
        name = "helped"
        def train_config(self, section, plan):
            return {}

    def _add_all(register):
        register(Helped())

    @hookimpl
    def hpc_llm_register_data_sources(register):
        _add_all(register)   # registered from a helper: still attributed to this plugin
"""


def test_a_hook_with_wrong_arguments_is_one_line(site, tmp_path):
    target, env = site
    pip_install(make_package(tmp_path / "src", "args-plugin", "args", "args_plugin", WRONG_ARGS), target)
    proc = run_cli(["plugins"], env)
    assert proc.returncode == 2, explain(proc)
    [line] = proc.stderr.strip().splitlines()
    assert line.startswith("hpc_llm: error: plugin 'args' (args-plugin 9.9):") and "config" in line, line


def test_an_unmarked_hook_function_is_warned_about(site, tmp_path):
    target, env = site
    pip_install(make_package(tmp_path / "src", "unmarked-plugin", "unmarked", "unmarked_plugin", UNMARKED), target)
    proc = run_cli(["plugins"], env)
    assert proc.returncode == 0, explain(proc)
    assert (
        "hpc_llm: warning: plugin 'unmarked' (unmarked-plugin 9.9) defines hpc_llm_register_data_sources "
        "without @hpc_llm.hookimpl; it is ignored"
    ) in proc.stderr
    assert " mine " not in proc.stdout


def test_components_are_attributed_to_the_plugin_whose_hook_registered_them(site, tmp_path):
    """Hooks run through pluggy's own calling (pm.hook.<name>), not one by one."""
    target, env = site
    pip_install(make_package(tmp_path / "src", "helper-plugin", "helper", "helper_plugin", HELPER), target)
    proc = run_cli(["plugins"], env)
    assert proc.returncode == 0, explain(proc)
    [row] = [ln for ln in proc.stdout.splitlines() if " helped " in ln]
    assert "helper-plugin 9.9" in row and "helper" in row.split("helper-plugin 9.9")[1]
