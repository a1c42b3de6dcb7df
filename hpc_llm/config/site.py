"""Site config directories: cluster profiles (and experiments, data, model presets) kept
outside the installed package.

Searched by Hydra after the package's own ``conf/`` (the SearchPathPlugin in
``hydra_plugins/hpc_llm_site``), in this order:

1. each directory of ``$HPC_LLM_CONFIG_PATH`` (colon-separated; a site-wide directory an
   admin maintains goes here), first listed first;
2. the user's own ``$XDG_CONFIG_HOME/hpc_llm`` (``~/.config/hpc_llm`` by default).

A directory has the layout of ``conf/``: ``cluster/NAME.yaml``, ``experiment/NAME.yaml``,
``data/NAME.yaml``, ... so ``cluster=NAME`` finds ``<dir>/cluster/NAME.yaml``.
``hpc-llm doctor --write-profile NAME`` writes into :func:`user_dir` unless told otherwise.

The first file of a name wins: a shipped name (``conf/cluster/h100.yaml``) cannot be
replaced from a site directory, and a name in ``$HPC_LLM_CONFIG_PATH`` hides the same
name in ``~/.config/hpc_llm``. A site file that a shipped one hides is never used; every
entry point says so once (:func:`warn_unused`), and ``hpc-llm plugins`` lists it.

No torch here: the login-node path reads it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

ENV_PATH = "HPC_LLM_CONFIG_PATH"
#: the provider name of the site directories in Hydra's search path (hydra.runtime.config_sources)
PROVIDER = "hpc_llm site config"


def user_dir() -> Path:
    """``$XDG_CONFIG_HOME/hpc_llm`` (``~/.config/hpc_llm``): where a user's own profiles go."""
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "hpc_llm"


def env_dirs() -> list[Path]:
    """The directories of ``$HPC_LLM_CONFIG_PATH``, in order (empty entries skipped)."""
    return [Path(p).expanduser() for p in os.environ.get(ENV_PATH, "").split(":") if p.strip()]


def config_dirs() -> list[Path]:
    """Every site config directory, in search order (``$HPC_LLM_CONFIG_PATH`` first, then
    :func:`user_dir`), whether or not it exists."""
    dirs: list[Path] = []
    for d in [*env_dirs(), user_dir()]:
        d = d.absolute()
        if d not in dirs:
            dirs.append(d)
    return dirs


def existing_dirs() -> list[Path]:
    """:func:`config_dirs` that exist (the ones Hydra is told to search); the shipped
    ``conf/`` itself is no site directory."""
    from hpc_llm.paths import conf_dir

    shipped = conf_dir().resolve()
    return [d for d in config_dirs() if d.is_dir() and d.resolve() != shipped]


def where(d: Path) -> str:
    """How a site directory came to be searched, for messages."""
    return "~/.config/hpc_llm" if d == user_dir().absolute() else f"${ENV_PATH}"


def missing_hint(group: str, name: str) -> str:
    """Where a ``group=name`` hpc_llm does not ship would be looked for, for the error."""
    if group.startswith("hydra"):
        return ""
    dirs = existing_dirs()
    if dirs:
        return f" (site config directories searched too: {', '.join(str(d) for d in dirs)})"
    return f" (a site {group} goes in {user_dir()}/{group}/{name}.yaml, or in a directory of ${ENV_PATH})"


def _shipped(rel: str) -> Path | None:
    from hpc_llm.paths import conf_dir

    path = conf_dir() / rel
    return path if path.is_file() else None


def origin_of(group: str, name: str) -> Path | None:
    """The site file ``<dir>/<group>/<name>.yaml`` that Hydra picks for ``group=name``; None
    when the package ships that name (it comes first) or no site directory has it."""
    rel = f"{group}/{name}.yaml"
    if _shipped(rel) is not None:
        return None
    for d in existing_dirs():
        if (d / rel).is_file():
            return d / rel
    return None


@dataclass(frozen=True)
class SiteFile:
    """One yaml file of a site directory, and whether Hydra uses it."""

    directory: Path
    rel: str  # "cluster/mysite.yaml"
    #: the file Hydra finds first under the same name (shipped, or an earlier site dir); None: used
    hidden_by: Path | None = None
    #: outside the config groups (top level, hydra/): it may change every run's composition
    outside_groups: bool = False

    @property
    def path(self) -> Path:
        return self.directory / self.rel

    @property
    def note(self) -> str:
        """'' for a file Hydra uses; else why it does not use it as meant."""
        if self.hidden_by is not None:
            shipped = _shipped(self.rel) is not None
            return f"not used: {'hpc_llm ships' if shipped else 'hidden by'} {self.hidden_by}"
        return "outside the config groups" if self.outside_groups else ""

    @property
    def choice(self) -> str:
        """``cluster=mysite`` (``+experiment=NAME`` for experiments)."""
        group, _, name = self.rel.removesuffix(".yaml").rpartition("/")
        return f"{'+' if group == 'experiment' else ''}{group}={name}" if group else name


def site_files() -> list[SiteFile]:
    """Every yaml file of every existing site directory, in search order."""
    seen: dict[str, Path] = {}
    out: list[SiteFile] = []
    for d in existing_dirs():
        for path in sorted(d.rglob("*.yaml")):
            rel = path.relative_to(d).as_posix()
            first = _shipped(rel) or seen.get(rel)
            seen.setdefault(rel, path)
            outside = "/" not in rel or rel.startswith("hydra/")
            out.append(SiteFile(d, rel, first, outside))
    return out


def unused_message(f: SiteFile) -> str:
    """The warning for a site file Hydra cannot use as meant ('' for one it uses)."""
    if f.hidden_by is not None and _shipped(f.rel) is not None:
        group, _, name = f.rel.removesuffix(".yaml").rpartition("/")
        renamed = SiteFile(f.directory, f"{group}/site_{name}.yaml")
        return (
            f"site config {f.path} is not used: hpc_llm ships {f.choice} ({f.hidden_by}), which is found first; "
            f"rename it (e.g. {renamed.rel}, chosen with {renamed.choice})"
        )
    if f.outside_groups:
        return (
            f"site config {f.path} is outside the config groups (cluster/, experiment/, data/, model/, ...); "
            "a site directory is for group presets: move it into a group folder"
        )
    return ""


def warn_unused() -> None:
    """One warning line per site file a shipped name hides, or that sits outside the groups
    (once per process). A name hidden by an earlier site directory is the documented order
    (``$HPC_LLM_CONFIG_PATH`` before ``~/.config/hpc_llm``), shown by ``hpc-llm plugins``."""
    from hpc_llm.errors import warn_once

    for f in site_files():
        message = unused_message(f)
        if message:
            warn_once(message)


@dataclass(frozen=True)
class Origin:
    """Where a group choice of a composed config came from: a site file, or a shipped one that
    hides a site file of the same name."""

    group: str
    name: str
    directory: Path
    #: the same name further down the search path (site files, not used)
    hidden: tuple[Path, ...] = ()
    site: bool = True

    @property
    def path(self) -> Path:
        return self.directory / self.group / f"{self.name}.yaml"

    def line(self) -> str:
        what = f"site config, {where(self.directory)}" if self.site else "shipped with hpc_llm"
        text = f"{self.group}={self.name} from {self.path} ({what})"
        if self.hidden:
            text += "; hidden, not used: " + ", ".join(str(p) for p in self.hidden)
        return text


def origins(choices: Mapping[str, object], sources: Iterable[Mapping[str, object]]) -> list[Origin]:
    """The group choices (``hydra.runtime.choices``) that Hydra took from a site directory, or
    that hide a site file of the same name, found in the search path Hydra used
    (``hydra.runtime.config_sources``), in its order."""
    sources = list(sources)
    dirs = [Path(str(s["path"])) for s in sources if s.get("schema") == "file"]
    site = {Path(str(s["path"])) for s in sources if s.get("provider") == PROVIDER}
    found: list[Origin] = []
    for group, name in choices.items():
        if name is None or group.startswith("hydra/"):
            continue
        rel = f"{group}/{name}.yaml"
        hits = [d for d in dirs if (d / rel).is_file()]
        hidden = tuple(d / rel for d in hits[1:] if d in site)
        if hits and (hits[0] in site or hidden):
            found.append(Origin(group, str(name), hits[0], hidden, site=hits[0] in site))
    return found
