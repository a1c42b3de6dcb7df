"""OmegaConf's interpolation parser, memoised for the login process.

OmegaConf parses an interpolation string (``${hydra.job.num}``, ``${now:%Y-%m-%d}``) with its
ANTLR grammar every time a node holding one is read: ~0.3 ms a parse, and a sweep reads the
same few dozen strings in every point's config (the sweep and run dirs, the experiment's
``${max_seq_len}`` references), ~8 parses a point. The parse tree depends on the string alone
(``omegaconf.grammar_parser.parse``: a fresh input stream per call, tokens that keep their own
text) and resolving one only reads it (``omegaconf.grammar_visitor`` sets nothing on a tree),
so one tree per string serves every read. A string that does not parse raises each time, as
before (functools.lru_cache keeps no exception).

OmegaConf imports ``parse`` by name into ``omegaconf.base`` (node resolution) and
``omegaconf._utils`` (value-kind checks): those two names are replaced. omegaconf is pinned
to 2.3 (pyproject.toml); ``install`` leaves OmegaConf as it is if either name is missing.
"""

from __future__ import annotations

import functools
import importlib
from typing import Any

from omegaconf import grammar_parser

_MODULES = ("omegaconf.base", "omegaconf._utils")


def install() -> None:
    """Memoise OmegaConf's interpolation parser in this process (idempotent)."""
    modules = [importlib.import_module(name) for name in _MODULES]
    if not all(getattr(m, "parse", None) in (grammar_parser.parse, _memoised) for m in modules):
        return  # not the OmegaConf this was written against
    for m in modules:
        m.parse = _memoised  # type: ignore[attr-defined]


@functools.lru_cache(maxsize=4096)
def _memoised(value: str, parser_rule: str = "configValue", lexer_mode: str = "DEFAULT_MODE") -> Any:
    return grammar_parser.parse(value, parser_rule, lexer_mode)
