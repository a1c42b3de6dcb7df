"""Built-in health checks (filled in with the preflight work)."""

from __future__ import annotations

from hpc_llm import hookimpl


@hookimpl
def hpc_llm_register_health_checks(register) -> None:
    pass
