"""Pluggy markers for the ``hpc_llm`` project.

``hookimpl`` is public (``from hpc_llm import hookimpl``); ``hookspec`` is
used only by :mod:`hpc_llm.plugins.hookspecs`.
"""

import pluggy

PROJECT = "hpc_llm"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)
