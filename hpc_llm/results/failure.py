"""What failed, in one line: the first rank's exception and its node, then the log to read.

Login side, reading what a failed run left in its run dir: the ranks' failure reports
(``.hpc_llm/failures/*.json``, written by each rank that raised under a supervisor; the
format is hpc_llm.job.failures'), else the exception the failed rank's log ends with, else the
run's own record (results.json ``error``). Only read here; the run's record is the job's.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from hpc_llm.rundir.layout import RunDir
from hpc_llm.rundir.record import read_results

#: the line a Python traceback ends with ("ValueError: d_model must be ..."), under any
#: "[rankN]: " prefixes torch's excepthook adds
_EXCEPTION_LINE = re.compile(
    r"^(?:\[rank\d+\]:\s*)*(?P<line>(?:[A-Za-z_][\w]*\.)*[A-Za-z_]\w*(?:Error|Exception|Interrupt|Failure|Exit)\b.*)$"
)


@dataclass(frozen=True)
class Failure:
    """The first rank's exception: ``error`` ("ValueError: ..."), its rank and node if known."""

    error: str
    rank: int | None = None
    node: str | None = None

    def where(self) -> str:
        if self.rank is None:
            return ""
        return f" (rank {self.rank}{f' on {self.node}' if self.node else ''})"


def first_failure(run_dir: str | Path, rank: int | None = None, node: str | None = None) -> Failure | None:
    """The run's first failure: the earliest rank failure report; else the exception the log of
    ``rank`` (the rank seen to fail first, on ``node``) ends with; else the record's error."""
    rd = RunDir(run_dir)
    reports = []
    if rd.failure_reports.is_dir():
        for path in rd.failure_reports.glob("*.json"):
            try:
                reports.append(json.loads(path.read_text()))
            except (OSError, ValueError):
                continue
    if reports:
        first = min(reports, key=lambda r: (float(r.get("time") or 0), int(r.get("rank") or 0)))
        return Failure(f"{first.get('type')}: {first.get('message')}", first.get("rank"), first.get("node"))
    if rank is not None:
        line = last_exception(rd.rank_log(rank))
        if line:
            return Failure(line, rank, node)
    try:
        results = read_results(run_dir)
    except (OSError, ValueError):
        results = None
    error = (results or {}).get("error")
    if error:
        return Failure(" ".join(str(error).split()), rank, node)
    return None


def final_failure(run_dir: str | Path) -> Failure | None:
    """What ended the run, for the last line a user sees: the run's own verdict (results.json's
    ``error``, the policy's reason, which names the last stop) with the rank and node of the
    last attempt's first failure report; without a verdict, that report; else
    :func:`first_failure`. A run that failed after several attempts is named by its last one,
    not by the first attempt's exception (a disk that filled up ended a run with ``OSError:
    [Errno 28]`` while the first attempt had died of another error)."""
    rd = RunDir(run_dir)
    by_attempt: dict[str, list[dict[str, object]]] = {}
    if rd.failure_reports.is_dir():
        for path in rd.failure_reports.glob("*.json"):
            try:
                report = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            tag = path.name.rsplit(".", 2)[0]  # <job>.<restart>.<generation>; the rank and .json off
            by_attempt.setdefault(tag, []).append(report)
    last = None
    if by_attempt:
        latest = max(by_attempt.values(), key=lambda rs: max(float(str(r.get("time") or 0)) for r in rs))
        first = min(latest, key=lambda r: (float(str(r.get("time") or 0)), int(str(r.get("rank") or 0))))
        rank = first.get("rank")
        last = Failure(
            f"{first.get('type')}: {first.get('message')}",
            int(str(rank)) if rank is not None else None,
            str(first.get("node")) if first.get("node") else None,
        )
    try:
        results = read_results(run_dir) or {}
    except (OSError, ValueError):
        results = {}
    error = " ".join(str(results.get("error") or "").split())
    if results.get("status") == "failed" and error:
        mentions = last is not None and last.error.split(":", 1)[0] in error
        return Failure(error, last.rank, last.node) if last is not None and mentions else Failure(error)
    return last or first_failure(run_dir)


def last_exception(log: Path, tail_bytes: int = 65536) -> str | None:
    """The last exception line of a rank's log (its traceback's final line)."""
    try:
        with log.open("rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - tail_bytes))
            text = f.read().decode(errors="replace")
    except OSError:
        return None
    for raw in reversed(text.splitlines()):
        m = _EXCEPTION_LINE.match(raw.strip())
        if m:
            return " ".join(m.group("line").split())
    return None


def one_prefix(text: str) -> str:
    """Each line's "[rankN]: " once: torch's excepthook adds it again for every process group
    initialised in the process, and a failing rank's traceback read "[rank0]: [rank0]: ..."."""
    return _REPEATED.sub(r"\1", text)


_REPEATED = re.compile(r"(\[rank\d+\]: )(?:\1)+")
