"""Containers on the login node: the binds a job needs, the wrapped task
command, and ``hpc-llm container build|check|inspect`` through spython.

The runtime itself (how a command is wrapped) is a plugin
(:mod:`hpc_llm.builtin.containers`); this module only gathers what every
runtime needs from the config and drives Apptainer for the CLI. spython calls
the ``singularity`` executable, which Apptainer installs as a compatibility
link, so spython works unchanged on Apptainer hosts.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from hpc_llm.errors import ConfigError, Failed
from hpc_llm.plugins.base import ContainerRuntime, Mounts
from hpc_llm.plugins.manager import get_plugins

#: distributions whose versions inside an image must match the login node's pins
PINNED = ("hpc-llm", "llm-foundry", "mosaicml", "torch", "mosaicml-streaming")


def mounts_for(cfg: DictConfig, run_dir: str) -> Mounts:
    """The host paths a job's tasks use, from its config (login node, pure)."""
    from hpc_llm.paths import cache_dir

    paths: list[tuple[str, str]] = []

    def local(value: Any) -> str | None:
        return None if not value or "://" in str(value) else str(Path(str(value)).expanduser().resolve())

    data = local(cfg.data.get("path"))
    if data:
        paths.append((data, "data.path"))
    ckpt = local(cfg.checkpoint.get("location"))
    if ckpt and cfg.checkpoint.name == "folder":
        paths.append((ckpt, "checkpoint folder"))
    load = local(cfg.checkpoint.get("load_path"))
    if load:
        paths.append((str(Path(load).parent), "checkpoint.load_path"))
    paths.append((str(cache_dir()), "hpc_llm cache"))
    return Mounts(
        run_dir=str(Path(run_dir).resolve()),
        paths=tuple(paths),
        scratch=str(cfg.cluster.scratch) if cfg.cluster.scratch else None,
        gpus=str(cfg.cluster.device) == "gpu",
    )



def runtime(cfg: DictConfig) -> ContainerRuntime:
    return get_plugins(cfg.plugins.block).get("container", cfg.container.name)  # type: ignore[return-value]


def passthrough_names(cfg: DictConfig, extra: list[str] | tuple[str, ...] = ()) -> list[str]:
    return sorted({*(cfg.cluster.env_passthrough or []), *(cfg.container.env_passthrough or []), *extra})


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
    definition: Path, image: Path, *, fakeroot: bool = True, force: bool = False, src: Path | None = None
) -> Path:
    """``apptainer build [--fakeroot] --build-arg src=<checkout> IMAGE DEF`` (spython).

    The shipped definitions copy hpc_llm from ``src`` (a source checkout) into
    the image; default: the checkout this package runs from.
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
    options = [*(["--fakeroot"] if fakeroot else []), "--build-arg", f"src={src.resolve()}"]
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


def expected_versions() -> dict[str, str]:
    """hpc-llm's version and the training stack pins it declares (``train`` extra)."""
    out = {"hpc-llm": metadata.version("hpc-llm")}
    for req in metadata.requires("hpc-llm") or []:
        spec = req.split(";")[0].strip()
        if "==" in spec:
            name, version = spec.split("==", 1)
            if name.strip() in PINNED:
                out[name.strip()] = version.strip()
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


def check(cfg: DictConfig, run_dir: str) -> CheckReport:
    """Image exists, is readable, has the expected versions; bind sources exist."""
    from hpc_llm.builtin.containers import all_binds
    from hpc_llm.config.validate import resolve_job

    if cfg.container.name == "none":
        raise ConfigError("container=none: nothing to check; allowed: container=apptainer container.image=X.sif")
    resolve_job(cfg, run_dir)  # the same one-line checks as before a submit
    mounts = mounts_for(cfg, run_dir)
    report = CheckReport(image=str(cfg.container.image), expected=expected_versions())
    created = {p for p, why in mounts.paths if why in ("checkpoint folder", "hpc_llm cache")}
    for bind in all_binds(cfg.container, mounts):
        if bind.source in (mounts.run_dir, mounts.scratch) or bind.source in created:
            continue  # made by the submit / exists on the nodes only
        if not os.path.exists(bind.source):
            report.problems.append(f"bind source {bind.source} ({bind.origin}) does not exist")
    client = _client()
    out = client.execute(
        str(Path(cfg.container.image).expanduser()),
        [str(cfg.container.python), "-c", VERSIONS_PY % (tuple(report.expected),)],
        return_result=True, quiet=True,
    )
    if out.get("return_code") != 0:
        report.problems.append(f"python in the image failed: {''.join(out.get('message') or '').strip()[-300:]}")
        return report
    message = out.get("message")
    text = "".join(message) if isinstance(message, list) else str(message)
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
