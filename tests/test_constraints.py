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


def pins(path: Path = CONSTRAINTS) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
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


TITAN = ROOT / "constraints" / "torchtitan.txt"
TITAN_PYTHON = ROOT / ".venv-torchtitan" / "bin" / "python"
#: what the login process pickles a job's payload with and the torchtitan ranks unpickle it with
#: (hpc_llm.rundir.payload): one version in both environments
SHARED = ("cloudpickle", "hydra-core", "omegaconf")


def test_the_torchtitan_extra_is_pinned_within_its_range_and_shares_the_payload_stack():
    titan = pins(TITAN)
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wrong = []
    for line in [*project["dependencies"], *project["optional-dependencies"]["torchtitan"]]:
        req = Requirement(line)
        version = titan.get(canonicalize_name(req.name))
        if version is None or not req.specifier.contains(version, prereleases=True):
            wrong.append(f"{req} -> {version or 'not pinned'}")
    assert not wrong, f"pyproject.toml and {TITAN.name} disagree (scripts/freeze-constraints.py): {wrong}"
    foundry = pins()
    differ = {name: (foundry.get(name), titan.get(name)) for name in SHARED if foundry.get(name) != titan.get(name)}
    assert not differ, f"the two environments must unpickle the same payload: {differ}"
    assert (
        TITAN.read_text().splitlines()[0].split(" on Python ")[1].split(",")[0]
        == (CONSTRAINTS.read_text().splitlines()[0].split(" on Python ")[1].split(",")[0])
    ), "both environments pin the same Python minor"


def test_the_torchtitan_environment_is_the_one_its_constraints_pin():
    """scripts/setup-dev.sh installs .venv-torchtitan with constraints/torchtitan.txt."""
    import json
    import subprocess

    code = (
        "import json, sys; from importlib import metadata\n"
        "out = {}\n"
        "for n in json.loads(sys.argv[1]):\n"
        "    try: out[n] = metadata.version(n)\n"
        "    except metadata.PackageNotFoundError: out[n] = None\n"
        "print(json.dumps(out))"
    )
    pinned = pins(TITAN)
    proc = subprocess.run([str(TITAN_PYTHON), "-c", code, json.dumps(list(pinned))], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    installed = json.loads(proc.stdout)
    differ = [f"{n}=={v}: {installed.get(n)}" for n, v in pinned.items() if (installed.get(n) or "").split("+")[0] != v]
    assert not differ, differ
    assert "-c constraints/torchtitan.txt" in (ROOT / "scripts" / "setup-torchtitan.sh").read_text()
    assert "setup-torchtitan.sh" in (ROOT / "scripts" / "setup-dev.sh").read_text()


def test_the_torchtitan_image_installs_with_its_constraints_at_the_extras_pins():
    text = (ROOT / "containers" / "torchtitan.def").read_text()
    assert '"/opt/hpc_llm/src[torchtitan]" -c /opt/hpc_llm/src/constraints/torchtitan.txt' in text
    titan = pins(TITAN)
    for dist in ("torch", "torchtitan"):
        assert f"org.hpc_llm.{dist} {titan[dist]}" in text, dist
