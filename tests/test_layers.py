"""The layers the folders promise (docs/design/overview.md, "Two process worlds").

* The login side (everything but ``hpc_llm.job``, ``hpc_llm.builtin``, the
  built-in data helpers ``hpc_llm.data`` and the control plane's simulator
  ``hpc_llm.sim``, which runs the in-job code) imports neither the in-job side
  nor the training stack.
* Core code reaches the built-in plugins only through the plugin manager,
  which imports them by name (never with an import statement).
"""

from __future__ import annotations

import ast
import importlib.util
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import pytest

import hpc_llm
from tests.conftest import ROOT

NOT_CORE = ("hpc_llm.job", "hpc_llm.builtin", "hpc_llm.data", "hpc_llm.sim")
#: boto3: an object store is checked before submitting from the job's own Python, in a subprocess
TRAINING_STACK = ("torch", "composer", "llmfoundry", "streaming", "transformers", "datasets", "boto3", "botocore")
#: the two places where the login side hands over to the job: the Hydra task
#: function and the callable submitit pickles for each job (RankEntry in
#: hpc_llm.launch.handover, which the batch script never runs). Both import the
#: in-job side only when called.
IN_JOB_HANDOVERS = {
    ("hpc_llm.app", "hpc_llm.job.rank.task"),
    ("hpc_llm.launch.handover", "hpc_llm.job.rank.entry"),
}


def core_modules() -> list[str]:
    names = [m.name for m in pkgutil.walk_packages(hpc_llm.__path__, "hpc_llm.")]
    names += ["hpc_llm", "hydra_plugins.hpc_llm_launchers.hpc_llm_plugins", "hydra_plugins.hpc_llm_site.searchpath"]
    return sorted(n for n in names if not n.startswith(NOT_CORE) and n != "hpc_llm.__main__")


def test_the_walk_finds_the_login_side():
    mods = core_modules()
    for expected in (
        "hpc_llm.cli",
        "hpc_llm.results.report",
        "hpc_llm.results.estimate",
        "hpc_llm.results.status",
        "hpc_llm.rundir.record",
        "hpc_llm.launch.slurm",
        "hpc_llm.launch.sbatch.render",
        "hpc_llm.plugins.manager",
    ):
        assert expected in mods


@pytest.mark.parametrize("module", core_modules())
def test_importing_a_login_module_pulls_in_no_job_builtin_or_training_stack(module):
    out = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", f"import {module}"], capture_output=True, text=True, cwd=ROOT
    )
    assert out.returncode == 0, out.stderr[-2000:]
    imported = re.findall(r"\|\s+([\w.]+)\s*$", out.stderr, flags=re.M)
    assert imported, "python -X importtime printed nothing"
    bad = sorted({m for m in imported if m.startswith(NOT_CORE) or m.split(".")[0] in TRAINING_STACK})
    assert not bad, f"import {module} imports {bad}"


def _imports(path: Path) -> list[str]:
    """Every module a file imports at run time (``if TYPE_CHECKING:`` blocks are for type checkers)."""
    out: list[str] = []

    class Visitor(ast.NodeVisitor):
        def visit_If(self, node: ast.If) -> None:
            if isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
                for child in node.orelse:
                    self.visit(child)
                return
            self.generic_visit(node)

        def visit_Import(self, node: ast.Import) -> None:
            out.extend(a.name for a in node.names)

        def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
            if node.module and node.level == 0:
                out.extend(f"{node.module}.{a.name}" for a in node.names)

    Visitor().visit(ast.parse(path.read_text(), filename=str(path)))
    return out


def test_core_code_never_imports_builtin_plugins_or_the_job_side():
    """Also the lazy imports inside functions, which an import-time check cannot see."""
    found = []
    for module in core_modules():
        spec = importlib.util.find_spec(module)
        assert spec is not None and spec.origin is not None, module
        for target in _imports(Path(spec.origin)):
            handover = any(module == m and target.startswith(t) for m, t in IN_JOB_HANDOVERS)
            if target.startswith(("hpc_llm.builtin", "hpc_llm.job")) and not handover:
                found.append(f"{module} -> {target}")
    assert not found, found


def test_the_plugin_manager_loads_the_builtins_by_name():
    from hpc_llm.plugins import manager

    assert all(m.startswith("hpc_llm.builtin.") for m in manager.BUILTIN_MODULES)
    assert "import hpc_llm.builtin" not in (ROOT / "hpc_llm" / "plugins" / "manager.py").read_text()


def test_login_path_with_plugins_loaded_imports_no_job_module():
    """Composing, resolving the plugins and building the train config, as `hpc-llm config` does."""
    code = (
        "import sys\n"
        "from hpc_llm.config.compose import compose\n"
        "from hpc_llm.config.validate import resolve_job\n"
        "from hpc_llm.config.train_config import build_train_config\n"
        "import hpc_llm.app, hpc_llm.launch.local, hpc_llm.launch.slurm\n"
        "import hpc_llm.results.report, hpc_llm.results.estimate\n"
        "import hpc_llm.results.status, hpc_llm.launch.images, hpc_llm.rundir.record, hpc_llm.results.ledger\n"
        "cfg = compose(['+experiment=mpt_tiny', 'parallelism=hsdp', 'resources.tasks_per_node=4'])\n"
        "build_train_config(cfg, resolve_job(cfg, '/r/0'), run_name='t')\n"
        f"stack = {TRAINING_STACK!r}\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in stack or m.startswith('hpc_llm.job'))\n"
        "print(bad)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"


# -- the job's control plane: the supervisor and the agents' loop, stdlib only ---------------

#: packages whose every module the supervisor or an agent's control loop imports: the batch host
#: and the agents' loop run on the stdlib alone (the agent imports the training stack on purpose,
#: in hpc_llm.job.agent.warm's functions, never by importing a module)
CONTROL_PLANE_PACKAGES = ("hpc_llm.job.supervisor", "hpc_llm.slurm")
CONTROL_PLANE_MODULES = (
    "hpc_llm.job.agent.loop",
    "hpc_llm.job.agent.forker",
    "hpc_llm.job.agent.warm",
    "hpc_llm.job.wire",
    "hpc_llm.job.messages",
    "hpc_llm.job.heartbeat",
    "hpc_llm.job.env",
    "hpc_llm.job.failures",
    "hpc_llm.rundir.record",
    "hpc_llm.rundir.layout",
)


def control_plane_modules() -> list[str]:
    names = list(CONTROL_PLANE_MODULES)
    for pkg in CONTROL_PLANE_PACKAGES:
        path = importlib.util.find_spec(pkg).submodule_search_locations  # type: ignore[union-attr]
        names += [pkg] + [m.name for m in pkgutil.walk_packages(path, f"{pkg}.")]
    return sorted({n for n in names if not n.endswith(".__main__")})  # __main__ runs, not imports


def test_the_control_plane_walk_finds_the_supervisor_and_the_agent():
    mods = control_plane_modules()
    for expected in ("hpc_llm.job.supervisor.fleet", "hpc_llm.job.supervisor.policy", "hpc_llm.job.agent.loop"):
        assert expected in mods


@pytest.mark.parametrize("module", control_plane_modules())
def test_importing_the_control_plane_loads_nothing_third_party(module):
    """Not pluggy (``from hpc_llm import hookimpl`` is lazy), not omegaconf or hydra (the
    rendezvous ports live in hpc_llm.config.ports, stdlib only), not cloudpickle (the agent
    unpickles its payload when it warms)."""
    code = (
        "import importlib, sys\n"
        "before = set(sys.modules)\n"
        f"importlib.import_module({module!r})\n"
        "new = {m.split('.')[0] for m in set(sys.modules) - before}\n"
        "print(sorted(n for n in new if n not in sys.stdlib_module_names and n != 'hpc_llm'))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]", f"import {module} loads {out.stdout.strip()}"


def _imports_of_package(package: str) -> list[tuple[str, str]]:
    """(module, what it imports) for every module of ``package``, lazy imports included."""
    spec = importlib.util.find_spec(package)
    assert spec is not None and spec.submodule_search_locations
    found = []
    for m in [package, *(m.name for m in pkgutil.walk_packages(spec.submodule_search_locations, f"{package}."))]:
        origin = importlib.util.find_spec(m).origin  # type: ignore[union-attr]
        found += [(m, target) for target in _imports(Path(origin))]
    return found


def test_config_does_not_import_launch():
    """config/ composes and checks; launch/ launches what config/ made. The launcher's options
    are config (hpc_llm.config.launcher_options)."""
    bad = [f"{m} -> {t}" for m, t in _imports_of_package("hpc_llm.config") if t.startswith("hpc_llm.launch")]
    assert not bad, bad


def test_the_rank_side_never_imports_a_builtin_plugin():
    """builtin/ imports job/rank (a plugin's in-job half); the way back would be a cycle, and core
    code reaches the built-in plugins only through the plugin manager."""
    bad = [f"{m} -> {t}" for m, t in _imports_of_package("hpc_llm.job") if t.startswith("hpc_llm.builtin")]
    assert not bad, bad
