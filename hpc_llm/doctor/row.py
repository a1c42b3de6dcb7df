"""One row of ``hpc-llm doctor``'s table: a check's verdict, OK / WARN / FAIL."""

from __future__ import annotations

from dataclasses import dataclass

OK, WARN, FAIL = "OK", "WARN", "FAIL"


@dataclass(frozen=True)
class Row:
    """One check: what was found, the verdict and, for a problem, what breaks and what to ask."""

    check: str
    value: str
    status: str
    detail: str = ""
