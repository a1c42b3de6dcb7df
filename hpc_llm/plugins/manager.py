"""The plugin manager: a typed facade over pluggy.

Built-in plugins (``hpc_llm.builtin.*``) and third-party packages (entry-point
group ``hpc_llm``) take the same path: each is registered with pluggy, checked
against the hookspecs (a misspelled hook is an error), then asked to register
its components. Loading happens once per process on first use, never at
import time.

A user blocks a plugin by its entry-point name or its distribution name, with
``plugins.block=[name]`` in the config or ``HPC_LLM_BLOCK_PLUGINS=a,b`` in the
environment. ``HPC_LLM_NO_EXTERNAL_PLUGINS=1`` loads the built-ins only.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from importlib import metadata
from typing import Any

import pluggy

from hpc_llm.errors import ConfigError, allowed, warn_once
from hpc_llm.plugins import hookspecs
from hpc_llm.plugins.base import KINDS, Component
from hpc_llm.plugins.markers import PROJECT

ENTRY_POINT_GROUP = "hpc_llm"
BLOCK_ENV = "HPC_LLM_BLOCK_PLUGINS"
NO_EXTERNAL_ENV = "HPC_LLM_NO_EXTERNAL_PLUGINS"
BUILTIN_PACKAGE = "hpc-llm (built-in)"
HOOK_PREFIX = "hpc_llm_"
BUILTIN_MODULES = (
    "hpc_llm.builtin.data",
    "hpc_llm.builtin.parallelism",
    "hpc_llm.builtin.checkpoint",
    "hpc_llm.builtin.evaluators",
    "hpc_llm.builtin.container_runtimes",
    "hpc_llm.builtin.health",
)
HOOK_FOR_KIND = {
    "data": "hpc_llm_register_data_sources",
    "parallelism": "hpc_llm_register_parallelism",
    "checkpoint": "hpc_llm_register_checkpoint_backends",
    "evaluator": "hpc_llm_register_evaluators",
    "container": "hpc_llm_register_container_runtimes",
    "health_check": "hpc_llm_register_health_checks",
}


@dataclass(frozen=True)
class Entry:
    """One registered component and where it came from."""

    kind: str
    name: str
    component: Component
    plugin: str
    package: str


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


def blocked_from_env() -> tuple[str, ...]:
    raw = os.environ.get(BLOCK_ENV, "")
    return tuple(sorted({n.strip() for n in raw.split(",") if n.strip()}))


class Plugins:
    """All components of all plugins, by kind and name."""

    def __init__(self, block: Iterable[str] = (), external: bool = True) -> None:
        self.block = frozenset(block)
        self.external = external
        self.pm = pluggy.PluginManager(PROJECT)
        self.pm.add_hookspecs(hookspecs)
        self.packages: dict[str, str] = {}
        #: the installed distributions whose plugins were loaded: name -> version
        self.distributions: dict[str, str] = {}
        self.blocked: list[str] = []
        self._entries: dict[str, list[Entry]] = defaultdict(list)
        self._load()

    # -- loading --------------------------------------------------------
    def _load(self) -> None:
        for modname in BUILTIN_MODULES:
            self._register(importlib.import_module(modname), modname, BUILTIN_PACKAGE)
        if self.external:
            self._load_entry_points()
        try:
            self.pm.check_pending()
        except pluggy.PluginValidationError as exc:
            name = self.pm.get_name(exc.plugin) or repr(exc.plugin)
            known = [h for h in dir(hookspecs) if h.startswith(HOOK_PREFIX)]
            raise ConfigError(
                f"plugin '{name}' ({self.packages.get(name, '?')}) implements a hook "
                f"that does not exist: {exc}; known hooks: {allowed(known)}"
            ) from None
        for kind, hook_name in HOOK_FOR_KIND.items():
            hook = getattr(self.pm.hook, hook_name)
            # pluggy calls every implementation (in its order, through any wrappers)
            hook(register=self._registrar(kind, {i.function.__code__: i.plugin_name for i in hook.get_hookimpls()}))

    def _load_entry_points(self) -> None:
        # pluggy's load_setuptools_entrypoints() blocks by entry-point name only
        # and drops the distribution; we need both for blocking and attribution.
        for ep in sorted(metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
            dist = getattr(ep, "dist", None)
            dist_name = dist.metadata["Name"] if dist is not None else "?"
            package = f"{dist_name} {dist.version}" if dist is not None else "?"
            if ep.name in self.block or dist_name in self.block:
                self.blocked.append(f"{ep.name} ({package})")
                continue
            if self.pm.get_plugin(ep.name) is not None:
                raise ConfigError(
                    f"two packages register a plugin named '{ep.name}' "
                    f"({self.packages[ep.name]} and {package}); uninstall or block one "
                    f"with {BLOCK_ENV}=<distribution name>"
                )
            try:
                plugin = ep.load()
            except Exception as exc:  # a broken third-party package must be named
                raise ConfigError(
                    f"plugin '{ep.name}' ({package}) failed to load: "
                    f"{type(exc).__name__}: {exc}; block it with {BLOCK_ENV}={ep.name}"
                ) from None
            self._register(plugin, ep.name, package)
            if dist is not None:
                self.distributions[dist_name] = dist.version

    def _register(self, plugin: object, name: str, package: str) -> None:
        self.packages[name] = package
        try:
            self.pm.register(plugin, name=name)
        except pluggy.PluginValidationError as exc:
            raise ConfigError(f"plugin '{name}' ({package}): {_one_line(exc)}") from None
        for attr in sorted(dir(plugin)):
            if (
                attr.startswith(HOOK_PREFIX)
                and callable(getattr(plugin, attr, None))
                and self.pm.parse_hookimpl_opts(plugin, attr) is None
            ):
                warn_once(
                    f"plugin '{name}' ({package}) defines {attr} without @hpc_llm.hookimpl; "
                    "it is ignored (decorate it with `from hpc_llm import hookimpl`)"
                )

    def _registrar(self, kind: str, plugin_of: dict[Any, str]) -> Callable[[Component], None]:
        """The ``register`` callback of one hook call; ``plugin_of`` maps each
        implementation's code object to its plugin, to attribute what it registers."""
        base = KINDS[kind]

        def register(component: Component) -> None:
            # the nearest caller that is a hook implementation registered this component
            frame = sys._getframe(1)
            while frame is not None and frame.f_code not in plugin_of:
                frame = frame.f_back  # type: ignore[assignment]
            plugin_name = plugin_of[frame.f_code] if frame is not None else "?"
            if not isinstance(component, base):
                raise ConfigError(
                    f"plugin '{plugin_name}' registered {component!r} as a {base.kind}; "
                    f"it must be an instance of hpc_llm.plugins.base.{base.__name__}"
                )
            if not component.name:
                raise ConfigError(f"plugin '{plugin_name}' registered a {base.kind} with no name")
            self._entries[kind].append(
                Entry(kind, component.name, component, plugin_name, self.packages.get(plugin_name, "?"))
            )

        return register

    # -- queries --------------------------------------------------------
    def entries(self, kind: str | None = None) -> list[Entry]:
        kinds = [kind] if kind else list(HOOK_FOR_KIND)
        return [e for k in kinds for e in sorted(self._entries[k], key=lambda e: e.name)]

    def names(self, kind: str) -> list[str]:
        return sorted({e.name for e in self._entries[kind]})

    def collisions(self) -> dict[tuple[str, str], list[Entry]]:
        by_key: dict[tuple[str, str], list[Entry]] = defaultdict(list)
        for kind in HOOK_FOR_KIND:
            for e in self._entries[kind]:
                by_key[(kind, e.name)].append(e)
        return {k: v for k, v in by_key.items() if len(v) > 1}

    def get(self, kind: str, name: str) -> Component:
        """The component ``name`` of ``kind``, or a one-line ConfigError."""
        matches = [e for e in self._entries[kind] if e.name == name]
        base = KINDS[kind]
        if not matches:
            raise ConfigError(f"unknown {base.kind} '{name}' ({base.selector}); allowed: {allowed(self.names(kind))}")
        if len(matches) > 1:
            who = " and ".join(f"{e.package} [plugin {e.plugin}]" for e in matches)
            raise ConfigError(
                f"{base.kind} '{name}' is registered by more than one plugin: {who}; "
                f"block all but one with plugins.block=[<plugin>] or {BLOCK_ENV}"
            )
        return matches[0].component


_CACHE: dict[tuple[frozenset[str], bool], Plugins] = {}


def get_plugins(block: Iterable[str] = ()) -> Plugins:
    """The process-wide plugin set for this block list (loaded once)."""
    names = frozenset(block) | frozenset(blocked_from_env())
    external = os.environ.get(NO_EXTERNAL_ENV, "") in ("", "0")
    key = (names, external)
    if key not in _CACHE:
        _CACHE[key] = Plugins(names, external=external)
    return _CACHE[key]
