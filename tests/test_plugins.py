"""Real pluggy discovery of pip-installed plugin packages.

Packages are installed with ``pip install --target`` into a per-test
directory put on PYTHONPATH, so the test environment itself is not changed,
and discovered through their ``hpc_llm`` entry points like any user install.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from hpc_llm.errors import ConfigError
from hpc_llm.plugins.manager import Plugins
from tests.conftest import EXAMPLE_PLUGIN as EXAMPLE
from tests.conftest import ROOT, explain, pip_install, run_cli


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
    assert plugins.names("container") == ["apptainer", "none", "pyxis"]
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


# -- kinds declared once ---------------------------------------------------------


def test_every_kind_reaches_the_hookspecs_the_bases_and_the_manager():
    from hpc_llm.plugins import base, hookspecs, kinds, manager

    names = [k.name for k in kinds.KINDS]
    hooks = [k.hook for k in kinds.KINDS]
    assert len(set(names)) == len(names) and len(set(hooks)) == len(hooks)
    assert len({k.base for k in kinds.KINDS}) == len(names)
    specs = sorted(n for n, fn in vars(hookspecs).items() if callable(fn) and hasattr(fn, "hpc_llm_spec"))
    assert specs == sorted(hooks)
    assert {k.name: k.hook for k in kinds.KINDS} == manager.HOOK_FOR_KIND
    assert tuple(dict.fromkeys(k.builtin for k in kinds.KINDS)) == manager.BUILTIN_MODULES
    assert list(base.KINDS) == names
    for kind in kinds.KINDS:
        cls = base.KINDS[kind.name]
        assert cls.__name__ == kind.base and (cls.kind, cls.selector) == (kind.label, kind.selector)
    plugins = Plugins(external=False)
    assert {e.kind for e in plugins.entries()} == set(names)


def _string_constants(path: Path) -> list[str]:
    """The string literals of a module, docstrings left out."""
    tree = ast.parse(path.read_text())
    docs = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docs.add(id(first.value))
    return [
        n.value
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs
    ]


def test_no_plugin_module_but_kinds_names_a_register_hook():
    """Lists of hooks by hand are how the kinds drifted apart; only kinds.py spells them."""
    found = [
        f"{path.name}: {value!r}"
        for path in sorted((ROOT / "hpc_llm" / "plugins").glob("*.py"))
        if path.name != "kinds.py"
        for value in _string_constants(path)
        if "hpc_llm_register_" in value
    ]
    assert found == []


RENAME_A_KIND = """
import dataclasses, json
from hpc_llm.plugins import kinds

# before anything else imports the kinds: a kind none of the other modules has heard of
health = next(k for k in kinds.KINDS if k.name == "health_check")
probe = dataclasses.replace(
    health, name="probe", hook="hpc_llm_register_probes", label="probe", section="probes", key="list",
    builtin="probe_builtin",
)
kinds.KINDS = tuple(probe if k is health else k for k in kinds.KINDS)

from hpc_llm.errors import ConfigError
from hpc_llm.plugins import base, hookspecs, manager

plugins = manager.Plugins(external=False)
try:
    plugins.get("probe", "nope")
except ConfigError as exc:
    unknown = str(exc)
print(json.dumps({
    "hookspecs": sorted(hookspecs.HOOKS),
    "module_has_hook": hasattr(hookspecs, "hpc_llm_register_probes"),
    "hook_for_kind": manager.HOOK_FOR_KIND,
    "builtin_modules": list(manager.BUILTIN_MODULES),
    "base": base.KINDS["probe"].__name__,
    "label": [base.HealthCheck.kind, base.HealthCheck.selector],
    "names": plugins.names("probe"),
    "package": [e.package for e in plugins.entries("probe")],
    "unknown": unknown,
}))
"""

PROBE_BUILTIN = """
from hpc_llm import hookimpl
from hpc_llm.plugins.base import HealthCheck

class Ping(HealthCheck):
    name = "ping"

@hookimpl
def hpc_llm_register_probes(register):
    register(Ping())
"""


def test_a_kind_declared_in_kinds_py_reaches_everything_else(tmp_path):
    """A kind put into kinds.KINDS (here one replacing ``health_check``, so that it has a
    base class) gets its hookspec, its hook call, its built-in module, its base-class
    label and its messages: a list kept by hand anywhere would miss it."""
    (tmp_path / "probe_builtin.py").write_text(textwrap.dedent(PROBE_BUILTIN))
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    proc = subprocess.run(
        [sys.executable, "-c", RENAME_A_KIND], capture_output=True, text=True, cwd=ROOT, env=env, timeout=120
    )
    assert proc.returncode == 0, explain(proc)
    out = json.loads(proc.stdout)
    assert "hpc_llm_register_probes" in out["hookspecs"] and out["module_has_hook"]
    assert "hpc_llm_register_health_checks" not in out["hookspecs"]
    assert out["hook_for_kind"]["probe"] == "hpc_llm_register_probes" and "health_check" not in out["hook_for_kind"]
    assert "probe_builtin" in out["builtin_modules"] and "hpc_llm.builtin.health" not in out["builtin_modules"]
    assert out["base"] == "HealthCheck" and out["label"] == ["probe", "probes.list"]
    assert out["names"] == ["ping"] and out["package"] == ["hpc-llm (built-in)"]
    assert out["unknown"] == "unknown probe 'nope' (probes.list); allowed: ping"


# -- attribution through the registry ---------------------------------------------------


def fake_distribution(root: Path, dist: str, ep_name: str, module: str, body: str) -> None:
    """An installed distribution as importlib.metadata sees one: a module and its dist-info."""
    (root / module).mkdir(parents=True)
    (root / module / "__init__.py").write_text(textwrap.dedent(body))
    info = root / f"{dist.replace('-', '_')}-9.9.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 9.9\n")
    (info / "entry_points.txt").write_text(f"[hpc_llm]\n{ep_name} = {module}\n")


SHARED_SOURCE = """
    from hpc_llm import hookimpl
    from hpc_llm.plugins.base import DataSource

    class Shared(DataSource):
        name = "shared_source"
        def train_config(self, section, plan):
            return {}

    @hookimpl
    def hpc_llm_register_data_sources(register):
        register(Shared())
"""

REUSES_SHARED = """
    import shared_source_plugin
    from hpc_llm import hookimpl
    from hpc_llm.plugins.base import Evaluator

    SEEN = []

    class Late(Evaluator):
        name = "late_eval"

    @hookimpl
    def hpc_llm_register_data_sources(register):
        SEEN.append((register.plugin, register.distribution, register.package, register.kind.name))
        # another package's hook function, called with this plugin's registry
        shared_source_plugin.hpc_llm_register_data_sources(register)

    @hookimpl(tryfirst=True)
    def hpc_llm_register_evaluators(register=None):   # a keyword argument works too
        register(Late())
"""


@pytest.fixture
def fake_site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    root = tmp_path / "fake_site"
    root.mkdir()
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.delenv("HPC_LLM_BLOCK_PLUGINS", raising=False)
    before = set(sys.modules)
    yield root
    for name in set(sys.modules) - before:
        if name.startswith(("shared_source_plugin", "reuses_plugin")):
            del sys.modules[name]


def test_attribution_is_the_registry_of_the_plugin_not_the_call_stack(fake_site, monkeypatch):
    fake_distribution(fake_site, "shared-dist", "shared", "shared_source_plugin", SHARED_SOURCE)
    fake_distribution(fake_site, "reuses-dist", "reuses", "reuses_plugin", REUSES_SHARED)
    Plugins(external=False)  # the built-ins are imported before the stack is taken away

    def no_frames(*args):
        raise AssertionError("the plugin manager looked at the call stack")

    monkeypatch.setattr(sys, "_getframe", no_frames)
    plugins = Plugins()
    monkeypatch.undo()

    shared = sorted((e.plugin, e.package) for e in plugins.entries("data") if e.name == "shared_source")
    # the same function registered it twice, each time with the registry of the plugin whose hook ran:
    # a walk up the stack finds shared_source_plugin's hook function both times
    assert shared == [("reuses", "reuses-dist 9.9"), ("shared", "shared-dist 9.9")]
    import reuses_plugin

    assert reuses_plugin.SEEN == [("reuses", "reuses-dist", "reuses-dist 9.9", "data")]
    [late] = [e for e in plugins.entries("evaluator") if e.name == "late_eval"]
    assert (late.plugin, late.package) == ("reuses", "reuses-dist 9.9")
    assert plugins.distributions["reuses-dist"] == "9.9"
    assert {e.package for e in plugins.entries() if e.plugin.startswith("hpc_llm.builtin.")} == {"hpc-llm (built-in)"}


def test_a_registry_refuses_what_is_not_its_kind(fake_site):
    fake_distribution(
        fake_site,
        "wrong-dist",
        "wrong",
        "shared_source_plugin",
        """
        from hpc_llm import hookimpl
        from hpc_llm.plugins.base import Evaluator

        class NotData(Evaluator):
            name = "not_data"

        @hookimpl
        def hpc_llm_register_data_sources(register):
            register(NotData())
        """,
    )
    with pytest.raises(ConfigError, match=r"plugin 'wrong' \(wrong-dist 9.9\) registered .* as a data source"):
        Plugins()


def test_the_manager_never_walks_the_stack():
    source = (ROOT / "hpc_llm" / "plugins" / "manager.py").read_text()
    assert not re.search(r"_getframe|currentframe|inspect\.stack|f_back", source)


def test_typed_options_are_each_sections_own():
    """Component._typed_options merges the same options once (hpc_llm.plugins.base._TYPED): other
    options still get their own result, a bad one is refused every time, and what a caller does
    to its copy reaches nobody else."""
    from omegaconf import OmegaConf

    from hpc_llm.plugins.manager import get_plugins

    data = get_plugins(()).get("data", "tiny_corpus")
    a = data.options(OmegaConf.create({"options": {"cache_dir": "/a"}}))
    b = data.options(OmegaConf.create({"options": {"cache_dir": "/b"}}))
    assert (a.cache_dir, b.cache_dir, data.options(OmegaConf.create({})).cache_dir) == ("/a", "/b", None)
    a.cache_dir = "/changed"
    assert data.options(OmegaConf.create({"options": {"cache_dir": "/a"}})).cache_dir == "/a"
    for _ in range(2):
        with pytest.raises(ConfigError, match="data.options.cache_dirr: not an option"):
            data.options(OmegaConf.create({"options": {"cache_dirr": "/a"}}))
