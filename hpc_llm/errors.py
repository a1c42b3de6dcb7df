"""The exceptions hpc_llm and its plugins raise.

A ``ConfigError`` is bad user input, raised before anything is started or
submitted. Its message is a single line that names what is wrong and what is
allowed; the entry points print it as ``hpc_llm: error: <message>`` and exit
with status 2, without a traceback.

Plugin authors raise ``ConfigError`` (from ``validate`` and the other
login-side methods) and ``CheckFailed`` (from a health check's ``run``, in the
job). This module is import-light: both sides import it.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Any


class ConfigError(ValueError):
    """Bad user input: one line, naming the key and the allowed values.

    ``more``: further problems found in the same pass (every unknown key of a yaml, every
    bad value of a sweep), one line each; the entry points print each on its own line."""

    def __init__(self, message: str, more: Iterable[str] = ()) -> None:
        super().__init__(" ".join(message.split()))
        self.more = [" ".join(m.split()) for m in more]

    def lines(self) -> list[str]:
        return [str(self), *self.more]


class Failed(RuntimeError):
    """Something hpc_llm ran (a job, apptainer build) failed; the message is one
    line naming where to look. Entry points exit with status 1."""


class CheckFailed(Exception):
    """A health check found the allocation unfit; ``nodes`` names the culprits if known.

    Raised from :meth:`hpc_llm.plugins.base.HealthCheck.run` inside the job: the
    job stops before its first batch, and the reason, the nodes and ``details``
    are recorded in results.json.
    """

    def __init__(self, reason: str, nodes: list[str] | tuple[str, ...] = (), details: Any = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.nodes = sorted(set(nodes))
        #: the check's figures up to the failure (kept in results.json)
        self.details = details


def allowed(values: Iterable[str]) -> str:
    """Format a sorted list of allowed values for an error message."""
    vals = sorted(set(values))
    return ", ".join(vals) if vals else "(none registered)"


def require_scheme(key: str, value: str, schemes: Iterable[str], what: str) -> str:
    """``value`` if it is a URI with one of ``schemes``, else a one-line ConfigError."""
    scheme = value.split("://", 1)[0] if "://" in value else ""
    if scheme not in schemes:
        raise ConfigError(f"{key}={value!r}: not {what}; allowed schemes: " + ", ".join(f"{s}://" for s in schemes))
    return value


_warned: set[str] = set()


def warn_once(message: str) -> None:
    """One line on stderr (``hpc_llm: warning: ...``), once per process."""
    if message not in _warned:
        _warned.add(message)
        sys.stderr.write(f"hpc_llm: warning: {' '.join(message.split())}\n")
