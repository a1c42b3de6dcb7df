"""Glue to LLM Foundry's registries (in-job only).

LLM Foundry builds loggers and callbacks by name from the train config, with
the config's kwargs; ours need the running rank's JobContext, which they find
in ``hpc_llm.job.rank.context.CURRENT``.
"""

from __future__ import annotations

from hpc_llm.config.train_config import PREEMPTION_CALLBACK, RESULTS_LOGGER, STRAGGLER_CALLBACK, WATCHDOG_CALLBACK


def register() -> None:
    """Make our logger and callbacks buildable by name from the train config."""
    from llmfoundry.registry import callbacks, loggers

    from hpc_llm.job.rank.preemption_callback import PreemptionCallback
    from hpc_llm.job.rank.results_logger import ResultsLogger
    from hpc_llm.job.rank.straggler_callback import StragglerMeasure
    from hpc_llm.job.rank.watchdog_callback import Watchdog

    if RESULTS_LOGGER not in loggers.get_all():
        loggers.register(RESULTS_LOGGER, func=ResultsLogger)
    if PREEMPTION_CALLBACK not in callbacks.get_all():
        callbacks.register(PREEMPTION_CALLBACK, func=PreemptionCallback)
    if WATCHDOG_CALLBACK not in callbacks.get_all():
        callbacks.register(WATCHDOG_CALLBACK, func=Watchdog)
    if STRAGGLER_CALLBACK not in callbacks.get_all():
        callbacks.register(STRAGGLER_CALLBACK, func=StragglerMeasure)
