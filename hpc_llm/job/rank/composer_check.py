"""Before the queue: a point's Composer settings through Composer's own parsers.

Part of :mod:`hpc_llm.job.rank.foundry_check` (which runs it in the job's environment for
every point of a sweep): every time string by Composer's ``Time``, the precision by
Composer's own validation for the cluster profile's device (not this machine's). Each
problem is added to the caller's :class:`~hpc_llm.job.rank.foundry_check.Problems` under its
train-config key, with what is allowed.
"""

from __future__ import annotations

from typing import Any

#: the caller's hpc_llm.job.rank.foundry_check.Problems (not imported: foundry_check imports this)
Problems = Any

#: train-config keys that hold a Composer time string
TIME_KEYS = ("max_duration", "eval_interval", "save_interval", "console_log_interval")
TIME_ALLOWED = "an integer and a unit: ba, ep, sp, tok (e.g. 100ba, 1ep, 2e6tok)"


def _time(value: Any, key: str) -> None:
    from composer.core import Time, TimeUnit

    if isinstance(value, str):
        t = Time.from_timestring(value)
        if key == "max_duration" and t.unit == TimeUnit.DURATION:
            raise ValueError("max_duration cannot be in units of dur (a fraction of itself)")
    elif isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{value!r} is a {type(value).__name__}, not a time")


def check_times(train: dict[str, Any], problems: Problems) -> None:
    for key in TIME_KEYS:
        if train.get(key) is not None:
            with problems.about(key, TIME_ALLOWED + ("" if key == "max_duration" else ", 0.5dur")):
                _time(train[key], key)
    for key, value in (train.get("scheduler") or {}).items():
        if key.startswith("t_") and isinstance(value, str):  # Composer parses them at the first batch
            with problems.about(f"scheduler.{key}", TIME_ALLOWED + ", 0.5dur"):
                _time(value, key)


def check_precision(value: Any, device: str, problems: Problems) -> None:
    from composer.core.precision import Precision, _validate_precision

    if value is None:
        return
    allowed = ", ".join(p.value for p in Precision)
    with problems.about("precision", allowed):
        precision = Precision(value)
    if device == "cpu" and value in {p.value for p in Precision}:
        from composer.devices import DeviceCPU

        # judged by the cluster profile's device, not this machine's
        cpu = "fp32 on a CPU profile (cluster.device=cpu); a GPU profile such as cluster=h100"
        with problems.about("precision", cpu):
            _validate_precision(precision, DeviceCPU())
