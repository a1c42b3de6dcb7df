"""The plugin manager: a typed facade over pluggy.

Built-in plugins (``hpc_llm.builtin.*``) and third-party packages (entry-point
group ``hpc_llm``) take the same path: each is registered with pluggy, checked
against the hookspecs (a misspelled hook is an error), then asked to register
its components. Loading happens once per process on first use, never at
import time. The kinds, their hooks and the built-in modules all come from
:mod:`hpc_llm.plugins.kinds`.

Each register hook is called once, through pluggy (``pm.hook.<name>``, so
``tryfirst``/``trylast`` and wrappers work), and every implementation receives
a :class:`~hpc_llm.plugins.registry.Registry` of its own plugin: that is how a
component is attributed to the plugin and distribution that registered it.

A user blocks a plugin by its entry-point name or its distribution name, with
``plugins.block=[name]`` in the config or ``HPC_LLM_BLOCK_PLUGINS=a,b`` in the
environment. ``HPC_LLM_NO_EXTERNAL_PLUGINS=1`` loads the built-ins only.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import os
from collections import defaultdict
from collections.abc import Iterable
from importlib import metadata
from typing import Any

import pluggy

from hpc_llm.errors import ConfigError, allowed, warn_once
from hpc_llm.plugins import hookspecs
from hpc_llm.plugins.base import KINDS as BASES
from hpc_llm.plugins.base import Component
from hpc_llm.plugins.kinds import KINDS, Kind
from hpc_llm.plugins.markers import PROJECT
from hpc_llm.plugins.registry import BUILTIN_DISTRIBUTION, BUILTIN_PACKAGE, Entry, Registry

ENTRY_POINT_GROUP = "hpc_llm"
BLOCK_ENV = "HPC_LLM_BLOCK_PLUGINS"
NO_EXTERNAL_ENV = "HPC_LLM_NO_EXTERNAL_PLUGINS"
HOOK_PREFIX = "hpc_llm_"
#: the built-in plugin modules, in the order of the kinds
BUILTIN_MODULES = tuple(dict.fromkeys(kind.builtin for kind in KINDS))
#: kind name -> the register hook of that kind
HOOK_FOR_KIND = {kind.name: kind.hook for kind in KINDS}


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
        #: plugin name -> its distribution and version ("hpc-llm-jsonl 0.1.0")
        self.packages: dict[str, str] = {}
        #: plugin name -> its distribution's name
        self._distribution_of: dict[str, str] = {}
        #: the installed distributions whose plugins were loaded: name -> version
        self.distributions: dict[str, str] = {}
        self.blocked: list[str] = []
        self._entries: dict[str, list[Entry]] = defaultdict(list)
        self._load()

    # -- loading --------------------------------------------------------
    def _load(self) -> None:
        for modname in BUILTIN_MODULES:
            self._register(importlib.import_module(modname), modname, BUILTIN_DISTRIBUTION, BUILTIN_PACKAGE)
        if self.external:
            self._load_entry_points()
        try:
            self.pm.check_pending()
        except pluggy.PluginValidationError as exc:
            name = self.pm.get_name(exc.plugin) or repr(exc.plugin)
            raise ConfigError(
                f"plugin '{name}' ({self.packages.get(name, '?')}) implements a hook "
                f"that does not exist: {exc}; known hooks: {allowed(hookspecs.HOOKS)}"
            ) from None
        for kind in KINDS:
            hook = getattr(self.pm.hook, kind.hook)
            for impl in hook.get_hookimpls():
                _hand_own_registry(impl, self._registry(kind, impl.plugin_name))
            # one call: pluggy calls every implementation (in its order, through any wrappers)
            hook(register=self._registry(kind, "?", add=False))

    def _load_entry_points(self) -> None:
        # pluggy's load_setuptools_entrypoints() blocks by entry-point name only
        # and drops the distribution; we need both for blocking and attribution.
        for ep in sorted(metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
            dist = getattr(ep, "dist", None)
            dist_name = str(dist.metadata["Name"]) if dist is not None else "?"
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
            self._register(plugin, ep.name, dist_name, package)
            if dist is not None:
                self.distributions[dist_name] = dist.version

    def _register(self, plugin: object, name: str, distribution: str, package: str) -> None:
        self.packages[name] = package
        self._distribution_of[name] = distribution
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

    def _registry(self, kind: Kind, plugin: str, add: bool = True) -> Registry:
        """The registry ``plugin``'s implementation of ``kind``'s hook receives."""
        return Registry(
            kind,
            BASES[kind.name],
            plugin,
            self._distribution_of.get(plugin, "?"),
            self.packages.get(plugin, "?"),
            self._entries[kind.name].append if add else None,
        )

    # -- queries --------------------------------------------------------
    def entries(self, kind: str | None = None) -> list[Entry]:
        kinds = [kind] if kind else [k.name for k in KINDS]
        return [e for k in kinds for e in sorted(self._entries[k], key=lambda e: e.name)]

    def names(self, kind: str) -> list[str]:
        return sorted({e.name for e in self._entries[kind]})

    def collisions(self) -> dict[tuple[str, str], list[Entry]]:
        by_key: dict[tuple[str, str], list[Entry]] = defaultdict(list)
        for kind in KINDS:
            for e in self._entries[kind.name]:
                by_key[(kind.name, e.name)].append(e)
        return {k: v for k, v in by_key.items() if len(v) > 1}

    def get(self, kind: str, name: str) -> Component:
        """The component ``name`` of ``kind``, or a one-line ConfigError."""
        matches = [e for e in self._entries[kind] if e.name == name]
        base = BASES[kind]
        if not matches:
            raise ConfigError(f"unknown {base.kind} '{name}' ({base.selector}); allowed: {allowed(self.names(kind))}")
        if len(matches) > 1:
            who = " and ".join(f"{e.package} [plugin {e.plugin}]" for e in matches)
            raise ConfigError(
                f"{base.kind} '{name}' is registered by more than one plugin: {who}; "
                f"block all but one with plugins.block=[<plugin>] or {BLOCK_ENV}"
            )
        return matches[0].component


def _hand_own_registry(impl: pluggy.HookImpl, registry: Registry) -> None:
    """Make pluggy call ``impl`` with ``registry`` as its ``register`` argument.

    pluggy hands every implementation of a hook the same arguments and has no
    per-implementation ones, so the implementation's function is wrapped (in
    this manager only; the plugin's own function is untouched): whatever the
    hook call passes as ``register`` is replaced by the plugin's own registry.
    An implementation that takes no ``register`` (pluggy allows a subset of
    the spec's arguments) is left as it is.
    """
    function = impl.function
    signature = inspect.signature(function)
    if "register" not in signature.parameters:
        return

    @functools.wraps(function)
    def with_own_registry(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(*args, **kwargs)
        bound.arguments["register"] = registry
        return function(*bound.args, **bound.kwargs)

    # HookImpl.function is typed Final; pluggy reads it on every call
    impl.function = with_own_registry  # type: ignore[misc]


_CACHE: dict[tuple[frozenset[str], bool], Plugins] = {}


def get_plugins(block: Iterable[str] = ()) -> Plugins:
    """The process-wide plugin set for this block list (loaded once)."""
    names = frozenset(block) | frozenset(blocked_from_env())
    external = os.environ.get(NO_EXTERNAL_ENV, "") in ("", "0")
    key = (names, external)
    if key not in _CACHE:
        _CACHE[key] = Plugins(names, external=external)
    return _CACHE[key]
