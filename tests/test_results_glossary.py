"""docs/reference/results-json.md names every field a run's results.json can contain.

The record written here goes through the real writers (rank 0's RunRecord, then
the supervisor's update_results) with a real plan, run info and provenance;
the fields only training produces are checked on a real run's results.json
by tests/test_train_local.py (``assert_documented``), so no run is added here.
"""

from __future__ import annotations

import re
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from tests.conftest import ROOT

GLOSSARY = ROOT / "docs" / "reference" / "results-json.md"
#: lists of records and objects of a fixed shape: each of their keys is a field of its own in
#: the glossary; other objects map names chosen at run time (a cause, a package, a check)
FIXED_LISTS = ("attempts", "ranks", "watchdog_events")
FIXED_OBJECTS = ("eval", "preflight", "provenance")
ISO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")


def documented() -> list[str]:
    """The field names of the glossary's tables: the first cell of each row, in backquotes."""
    return re.findall(r"^\| `([^`]+)` \|", GLOSSARY.read_text(), re.M)


def fields_of(results: dict[str, Any]) -> set[str]:
    """Top-level keys, ``attempts[].job_id`` for each key of a fixed list's records and
    ``eval.loss`` for each key of a fixed object."""
    out = set(results)
    for key in FIXED_LISTS:
        out |= {f"{key}[].{k}" for item in results.get(key) or [] if isinstance(item, dict) for k in item}
    for key in FIXED_OBJECTS:
        value = results.get(key)
        out |= {f"{key}.{k}" for k in (value if isinstance(value, dict) else {})}
    return out


def assert_documented(results: dict[str, Any]) -> None:
    missing = sorted(fields_of(results) - set(documented()))
    assert not missing, f"results.json fields that docs/reference/results-json.md does not list: {missing}"


def _record(run_dir: Path) -> dict[str, Any]:
    """A results.json as a supervised run that stopped once and was requeued leaves it."""
    from hpc_llm.config.compose import compose
    from hpc_llm.config.validate import resolve_job
    from hpc_llm.rundir import provenance
    from hpc_llm.rundir.record import Attempts, RunRecord, read_results, run_info, update_results

    cfg = compose(["+experiment=mpt_tiny", "resources.nodes=2", "resources.tasks_per_node=1"])
    plan = resolve_job(cfg, str(run_dir)).plan
    prov, diff = provenance.collect(ROOT)
    provenance.write(run_dir, prov, diff)
    info = {**run_info(cfg), "provenance": provenance.for_results(run_dir)}
    now = time.time()
    record = RunRecord.open(
        run_dir, plan, info, job_id="7", restart=0, started_at=now, nodes=["n1", "n2"], alloc_started_at=now - 2
    )
    record.note(resumed_at_batch=0, last_batch=12, train_s=30.0, signal="SIGUSR2", stopped_at_batch=12, save_s=1.5)
    event = {"batch": 9, "tokens_per_sec": 10.0, "median_tokens_per_sec": 40.0, "ratio": 0.25}
    event.update(nodes=["n2"], action="warn", time=now - 5)
    record.stopped(
        {"batches_done": 12, "train_loss": 3.5, "checkpoint": "ckpt/ba12", "watchdog_events": [event]},
        batch=12,
        cause="preemption",
    )
    attempts = Attempts.load(run_dir)
    attempts.current.action, attempts.current.signal_to_requeue_s = "requeue", 2.0
    update_results(run_dir, attempts, "requeued", {"error": "preempted", "excluded_nodes": None, "warnings": []})
    results = read_results(run_dir)
    assert results is not None
    return results


def test_a_record_through_both_writers_is_documented_and_its_times_are_iso(tmp_path):
    results = _record(tmp_path / "run")
    assert results["status"] == "requeued" and results["restarts_by_cause"] == {"preemption": 1}
    assert_documented(results)
    assert {"attempts[].queue_wait_s", "provenance.git", "watchdog_events[].ratio"} <= fields_of(results)
    # every epoch timestamp has its ISO 8601 (UTC) twin, to the second
    for epoch, text in (
        (results["finished_at"], results["finished_at_iso"]),
        (results["provenance"]["submitted_at"], results["provenance"]["submitted_at_iso"]),
        (results["watchdog_events"][0]["time"], results["watchdog_events"][0]["time_iso"]),
    ):
        assert ISO.match(text), text
        assert datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc).timestamp() == int(epoch)


def test_iso_by_hand():
    from hpc_llm.rundir.record import iso

    assert iso(0) == "1970-01-01T00:00:00Z"
    assert iso(365 * 86400 + 3600 + 61.9) == "1971-01-01T01:01:01Z"
    assert iso(None) is None and iso("x") is None and iso(True) is None


def test_the_glossary_lists_each_field_once_with_the_writers_own_keys():
    from hpc_llm.builtin.evaluators import HfConvert, Inference
    from hpc_llm.rundir.record import ATTEMPT_SUMMARY

    names = documented()
    assert len(names) == len(set(names)), sorted({n for n in names if names.count(n) > 1})
    for key in (*HfConvert.top_level_keys, *Inference.top_level_keys):
        assert key in names
    assert {f"attempts[].{k}" for k in ATTEMPT_SUMMARY} <= set(names)
    for timing in ("wallclock_s", "train_s", "fit_s", "total_wallclock_s", "goodput", "finished_at_iso"):
        assert timing in names


def test_every_documented_field_is_one_the_code_writes():
    """A field renamed or dropped in the code leaves its glossary entry naming nothing: each
    name must be a key (``"name"``), keyword or attribute (``name=``, ``name:``) in hpc_llm."""
    source = "\n".join(p.read_text() for p in (ROOT / "hpc_llm").rglob("*.py"))

    def written(name: str) -> bool:
        leaf = re.escape(re.split(r"\[\]\.|\.", name)[-1])
        return re.search(rf"""["']{leaf}["']|\b{leaf}\s*[=:]""", source) is not None

    stale = [name for name in documented() if not written(name)]
    assert not stale, f"docs/reference/results-json.md lists fields no code in hpc_llm writes: {stale}"
