"""constraints/llmfoundry.txt: the resolved LLM Foundry environment every install uses (issue #41 item 3).

The README's first command, scripts/setup-dev.sh (CI), and the container definitions install
``hpc_llm[train]`` with ``-c constraints/llmfoundry.txt``: pip installs those versions instead of
resolving again. These tests fail when pyproject.toml and the file disagree (a requirement with
no pin, or a pin its range refuses), and when this environment is not the one the file
describes (an install that bypassed it). Regenerate with ``scripts/freeze-constraints.py``.
"""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

import tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
CONSTRAINTS = ROOT / "constraints" / "llmfoundry.txt"


def pins() -> dict[str, str]:
    out = {}
    for line in CONSTRAINTS.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, version = line.split("==")
            out[canonicalize_name(name)] = version
    return out


def requirements() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    return [Requirement(r) for r in [*project["dependencies"], *extras["train"], *extras["test"]]]


def test_every_requirement_of_pyproject_is_pinned_within_its_range():
    pinned = pins()
    wrong = []
    for req in requirements():
        version = pinned.get(canonicalize_name(req.name))
        if version is None or not req.specifier.contains(version, prereleases=True):
            wrong.append(f"{req} -> {version or 'not pinned'}")
    assert not wrong, f"pyproject.toml and {CONSTRAINTS.name} disagree (scripts/freeze-constraints.py): {wrong}"


def test_this_environment_is_the_one_the_constraints_pin():
    """CI installs with the constraints (scripts/setup-dev.sh): every pin is what is installed."""
    differ = []
    for name, version in pins().items():
        try:
            installed = metadata.version(name)
        except metadata.PackageNotFoundError:
            differ.append(f"{name}=={version}: not installed")
            continue
        if installed.split("+")[0] != version.split("+")[0]:
            differ.append(f"{name}=={version}: {installed} installed")
    assert not differ, differ


def test_every_install_uses_them():
    flag = "-c constraints/llmfoundry.txt"
    first_block = (ROOT / "README.md").read_text().split("```bash", 1)[1].split("```", 1)[0]
    assert flag in first_block.splitlines()[1]  # the first command
    assert flag in (ROOT / "scripts" / "setup-dev.sh").read_text()
    for name in ("cpu.def", "h100.def"):
        assert "-c /opt/hpc_llm/src/constraints/llmfoundry.txt" in (ROOT / "containers" / name).read_text(), name
