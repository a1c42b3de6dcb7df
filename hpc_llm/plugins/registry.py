"""What a register hook receives: a registry that knows whose components it takes.

Every register hook (:mod:`hpc_llm.plugins.hookspecs`) is called with
``register``, a :class:`Registry`. Each plugin's implementation gets a registry
of its own, made for that plugin and the distribution that installed it, so
everything it registers (directly, through a helper, or by calling another
package's hook function) is attributed to it, with no look at the call stack.

Plugin authors call ``register(component)``, as they always have, and may read
``register.plugin``, ``register.distribution`` and ``register.kind``.
Login-side and import-light (both sides import it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from hpc_llm.errors import ConfigError
from hpc_llm.plugins.base import Component
from hpc_llm.plugins.kinds import Kind

#: the distribution of the built-in plugins
BUILTIN_DISTRIBUTION = "hpc-llm"
#: how the built-in plugins' package is shown (``hpc-llm plugins``, messages)
BUILTIN_PACKAGE = "hpc-llm (built-in)"


@dataclass(frozen=True)
class Entry:
    """One registered component and where it came from."""

    kind: str
    name: str
    component: Component
    #: the plugin (entry-point name, or built-in module) whose registry took it
    plugin: str
    #: the distribution and its version ("hpc-llm-jsonl 0.1.0"), or BUILTIN_PACKAGE
    package: str


class Registry:
    """``register`` in a register hook: ``register(component)`` adds one component.

    One per plugin and kind; it knows the plugin it registers for and the
    distribution that plugin came from.
    """

    def __init__(
        self,
        kind: Kind,
        base: type[Component],
        plugin: str,
        distribution: str,
        package: str,
        add: Callable[[Entry], None] | None,
    ) -> None:
        #: the kind this registry takes (``register.kind.name == "data"``)
        self.kind = kind
        #: the plugin it registers for: the entry-point name, or the built-in module
        self.plugin = plugin
        #: the name of the distribution that installed the plugin ("?" if unknown)
        self.distribution = distribution
        #: the distribution and its version, as ``hpc-llm plugins`` shows it
        self.package = package
        self._base = base
        self._add = add

    def __call__(self, component: Component) -> None:
        """Register ``component`` (an instance of this kind's base class, with a name)."""
        base = self._base
        if not isinstance(component, base):
            raise ConfigError(
                f"plugin '{self.plugin}' ({self.package}) registered {component!r} as a {base.kind}; "
                f"it must be an instance of hpc_llm.plugins.base.{base.__name__}"
            )
        if not component.name:
            raise ConfigError(f"plugin '{self.plugin}' ({self.package}) registered a {base.kind} with no name")
        if self._add is None:
            raise RuntimeError(
                f"{self.kind.hook} was called outside hpc_llm's plugin manager; "
                "registries are handed to each plugin by hpc_llm.plugins.manager.Plugins"
            )
        self._add(Entry(self.kind.name, component.name, component, self.plugin, self.package))

    def __repr__(self) -> str:
        return f"<Registry {self.kind.name} for plugin {self.plugin!r} ({self.package})>"
