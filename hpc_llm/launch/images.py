"""Container images on the login node: ``hpc-llm container build|check|inspect``.

Apptainer is driven through spython, which calls the ``singularity``
executable that Apptainer installs as a compatibility link. How a task's
command is wrapped in a container is the container runtime plugin's business
(``container.name``); ``check`` asks that runtime for the binds it will make, and
runs the image's Python through it: Apptainer through spython, a runtime that says
how to start the image here (pyxis: ``enroot start``) through that command.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from hpc_llm.errors import ConfigError, Failed

#: distributions whose versions inside an image must match the login node's pins
PINNED = ("hpc-llm", "llm-foundry", "mosaicml", "torch", "mosaicml-streaming")


# -- hpc-llm container build | check | inspect ---------------------------------


def _client():
    from spython.main import Client
    from spython.utils import check_install

    if not check_install():
        raise ConfigError(
            "apptainer (its 'singularity' link, which spython calls) is not on PATH here; "
            "build and check images on a host that has Apptainer"
        )
    Client.quiet = True
    return Client


def build(
    definition: Path,
    image: Path,
    *,
    fakeroot: bool | None = None,
    force: bool = False,
    src: Path | None = None,
    binds: list[str] | None = None,
) -> Path:
    """``apptainer build [--fakeroot] [--bind B]... --build-arg src=<checkout> IMAGE DEF`` (spython).

    The shipped definitions copy hpc_llm from ``src`` (a source checkout) into
    the image; default: the checkout this package runs from. ``fakeroot`` None:
    only when not root (root builds without it; ``--fakeroot`` as root needs
    newuidmap). ``binds`` are host paths %post sees (a local wheelhouse, say).
    """
    from hpc_llm.paths import source_root

    src = src or source_root()
    if src is None or not (src / "pyproject.toml").is_file():
        raise ConfigError(
            "hpc-llm container build needs a source checkout of hpc_llm to copy into the image; "
            "pass --src DIR (a directory with pyproject.toml)"
        )
    if not definition.is_file():
        from hpc_llm.paths import containers_dir

        shipped = containers_dir() / definition.name
        if not shipped.is_file():
            names = sorted(p.name for p in containers_dir().glob("*.def"))
            raise ConfigError(f"definition file {str(definition)!r} not found; shipped: {', '.join(names)}")
        definition = shipped
    if image.exists() and not force:
        raise ConfigError(f"{image} exists; pass --force to overwrite it")
    client = _client()
    if fakeroot is None:
        fakeroot = os.geteuid() != 0
    options = [*(["--fakeroot"] if fakeroot else []), "--build-arg", f"src={src.resolve()}"]
    for b in binds or []:
        if not os.path.exists(b.split(":", 1)[0]):
            raise ConfigError(f"--bind {b}: the source {b.split(':', 1)[0]!r} does not exist")
        options += ["--bind", b]
    client.build(recipe=str(definition), image=str(image), sudo=False, options=options, force=force, quiet=False)
    if not image.exists():
        raise Failed(f"apptainer build did not produce {image}; its output is above")
    return image


def inspect(image: Path) -> dict[str, Any]:
    """Labels and metadata of an image (``apptainer inspect --json``)."""
    if not image.exists():
        raise ConfigError(f"image {str(image)!r} does not exist")
    result = _client().inspect(str(image), quiet=True)
    if not isinstance(result, dict) or result.get("return_code", 0) != 0:
        raise Failed(f"apptainer inspect {image} failed: {result}")
    return result


def expected_versions(block: Iterable[str] = ()) -> dict[str, str]:
    """What the login side will send the image: hpc-llm's version, the training stack
    pins it declares (``train`` extra; torch, composer = mosaicml, llm-foundry, ...) and
    the version of every plugin distribution the plugin manager loads here (``block``:
    the config's ``plugins.block``), whose components the config may name."""
    from hpc_llm.plugins.manager import get_plugins

    out = {"hpc-llm": metadata.version("hpc-llm")}
    for req in metadata.requires("hpc-llm") or []:
        spec = req.split(";")[0].strip()
        if "==" in spec:
            name, version = spec.split("==", 1)
            if name.strip() in PINNED:
                out[name.strip()] = version.strip()
    for dist, version in get_plugins(block).distributions.items():
        out.setdefault(dist, version)
    return out


VERSIONS_PY = (
    "import json, importlib.metadata as m\n"
    "out = {}\n"
    "for d in %r:\n"
    "    try: out[d] = m.version(d)\n"
    "    except m.PackageNotFoundError: out[d] = None\n"
    "print(json.dumps(out))\n"
)


def public_version(version: str | None) -> str | None:
    """'2.7.0+cpu' -> '2.7.0': a local build tag (CPU or CUDA wheel) is the same release."""
    return version.split("+", 1)[0] if version else version


@dataclass
class CheckReport:
    image: str
    problems: list[str] = field(default_factory=list)
    versions: dict[str, Any] = field(default_factory=dict)
    expected: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        """The failure as one line."""
        return f"container check of {self.image}: {'; '.join(self.problems)}"


def _run_here(cfg: DictConfig, command: list[str]) -> tuple[int, str]:
    """``command`` (the runtime's own way into the image) run here: its status and output. A
    registry reference, or a runtime whose executable this machine lacks, is one line saying the
    image is checked where it runs."""
    import shutil
    import subprocess

    image, exe = str(cfg.container.image), str(cfg.container.executable)
    if not os.path.exists(os.path.expanduser(image)):
        # the runtime's own validation let it through: a registry reference (pyxis's nvcr.io#...)
        raise ConfigError(
            f"container check: {image} is a registry reference, which each node imports at the job's start: "
            "nothing to check here (a squashfs file can be: enroot import, then container.image=PATH)"
        )
    if shutil.which(exe) is None:
        raise ConfigError(
            f"container check: {exe} (container.executable) is not on this machine: the image is checked on "
            "the nodes at the job's start (container.check=true)"
        )
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return 1, f"{' '.join(command[:2])} did not end in 600 s"
    return done.returncode, done.stdout + (done.stderr if done.returncode else "")


def check(cfg: DictConfig, run_dir: str) -> CheckReport:
    """Image exists, is readable, has the expected versions; bind sources exist."""
    from hpc_llm.config.validate import resolve_job

    if cfg.container.name == "none":
        raise ConfigError(
            "container=none: nothing to check; allowed: container=apptainer container.image=X.sif, "
            "container=pyxis container.image=X.sqsh"
        )
    job = resolve_job(cfg, run_dir)  # the same one-line checks as before a submit
    mounts = job.mounts(cfg)
    report = CheckReport(image=str(cfg.container.image), expected=expected_versions(cfg.plugins.block or ()))
    created = {p.path for p in mounts.paths if p.created_by_job}
    for bind in job.container.binds(cfg.container, mounts):
        if bind.source in (mounts.run_dir, mounts.scratch) or bind.source in created:
            continue  # made by the submit / exists on the nodes only
        if not os.path.exists(bind.source):
            report.problems.append(f"bind source {bind.source} ({bind.origin}) does not exist")
    if report.problems:
        return report
    versions = [str(cfg.container.python), "-c", VERSIONS_PY % (tuple(report.expected),)]
    here = getattr(job.container, "here", None)
    if here is not None:
        # a runtime that says how to run a command in the image on this machine (pyxis: enroot
        # start of the squashfs), as the check before the queue does (hpc_llm.launch.precheck)
        code, text = _run_here(cfg, here(cfg.container, mounts, versions))
    else:
        client = _client()
        # the binds the job makes that exist here (a job-made directory would fail the exec)
        binds = [b.spec() for b in job.container.binds(cfg.container, mounts) if os.path.exists(b.source)]
        out = client.execute(
            str(Path(cfg.container.image).expanduser()),
            versions,
            bind=binds,
            options=[str(f) for f in cfg.container.flags or []],
            return_result=True,
            quiet=True,
        )
        message = out.get("message")
        code, text = out.get("return_code"), "".join(message) if isinstance(message, list) else str(message or "")
    if code != 0:
        report.problems.append(f"{cfg.container.python} in the image failed: {' '.join(text.split())[-300:]}")
        return report
    try:
        report.versions = json.loads(text.strip().splitlines()[-1])
    except (ValueError, IndexError):
        report.problems.append(f"could not read versions from the image: {text[-200:]!r}")
        return report
    for name, want in report.expected.items():
        have = report.versions.get(name)
        if public_version(have) != want:
            report.problems.append(f"{name} is {have or 'missing'} in the image, {want} expected")
    return report
