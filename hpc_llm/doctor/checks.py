"""Every ``hpc-llm doctor`` check, in the table's order: :func:`evaluate` turns parsed facts
into rows and asks nothing; :func:`exit_code` is 1 when a must-have is missing (a FAIL row).
"""

from __future__ import annotations

from collections.abc import Sequence

from hpc_llm.doctor.checks_long_run import (
    check_accounting,
    check_grace_time,
    check_kill_wait,
    check_node_failure,
    check_preempt_signal,
    check_preemption,
    check_requeue,
    check_requeue_delay,
)
from hpc_llm.doctor.checks_node import (
    check_apptainer,
    check_image,
    check_node_gpus,
    check_probe,
    check_python,
    check_pyxis,
    check_run_arg,
    check_run_dir,
    check_store,
)
from hpc_llm.doctor.checks_scheduler import (
    check_gres,
    check_nodes,
    check_partition,
    check_slurm,
    check_spares,
    check_test_only,
    check_time_limit,
)
from hpc_llm.doctor.facts import Facts, Needs, partition_name
from hpc_llm.doctor.row import FAIL, Row

CHECKS = (
    check_slurm,
    check_partition,
    check_spares,
    check_test_only,
    check_time_limit,
    check_nodes,
    check_gres,
    check_preemption,
    check_preempt_signal,
    check_grace_time,
    check_requeue,
    check_kill_wait,
    check_requeue_delay,
    check_node_failure,
    check_accounting,
    check_probe,
    check_run_dir,
    check_run_arg,
    check_python,
    check_image,
    check_apptainer,
    check_pyxis,
    check_node_gpus,
    check_store,
)


def evaluate(facts: Facts, needs: Needs) -> list[Row]:
    """Every check's row (pure: asks nothing)."""
    part = partition_name(facts, needs)
    return [row for check in CHECKS if (row := check(facts, needs, part)) is not None]


def exit_code(rows: Sequence[Row]) -> int:
    return 1 if any(r.status == FAIL for r in rows) else 0
