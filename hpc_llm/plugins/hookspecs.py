"""Every hook hpc_llm calls: one register hook per plugin kind.

The hooks are made from :data:`hpc_llm.plugins.kinds.KINDS` (name and
documentation), so a kind declared there has its hook here. Each is
``hpc_llm_register_<kinds>(register)`` and returns nothing: ``register`` is a
:class:`~hpc_llm.plugins.registry.Registry` of the calling plugin's own, and the
plugin calls ``register(component)`` once per component it provides. The
component's ``name`` is what users write in the config (``data.name=jsonl``).
The core owns the registries, attributes each component to the plugin and
distribution whose registry took it, reports name collisions, and produces the
"allowed values" in error messages.

Call semantics (all hooks): every implementation is called, once per process,
when the plugin manager first loads (lazily, on first use, never at import).
Hook implementations must be cheap and must not import torch, composer or
llmfoundry: they also run on the login node. Heavy work belongs in a
component's ``prepare``/``after_train`` methods, which run inside the job.

The component interfaces are in :mod:`hpc_llm.plugins.base`. Plugin authors:
see ``docs/reference/plugins.md``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING

from hpc_llm.plugins.kinds import KINDS, Kind
from hpc_llm.plugins.markers import hookspec

if TYPE_CHECKING:  # pragma: no cover - typing only
    from hpc_llm.plugins.registry import Registry


def register_hook(kind: Kind) -> Callable[[Registry], None]:
    """The hookspec of ``kind``'s register hook."""

    def spec(register: Registry) -> None:
        pass

    spec.__name__ = spec.__qualname__ = kind.hook
    spec.__module__ = __name__
    spec.__doc__ = inspect.cleandoc(kind.doc) + f"\n\nBase class: ``hpc_llm.plugins.base.{kind.base}``."
    return hookspec(spec)


#: hook name -> hookspec, one per kind
HOOKS: dict[str, Callable[[Registry], None]] = {kind.hook: register_hook(kind) for kind in KINDS}
# module attributes, where pluggy's add_hookspecs(module) looks for them
globals().update(HOOKS)
