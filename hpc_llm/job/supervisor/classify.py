"""Whose fault a failed generation was: the node to blame, and the user's errors told from the machine's.

Pure functions of a stop's facts (:class:`~hpc_llm.job.supervisor.stop.Stop`) and the run's
earlier failure reports: the node where it failed first (a rank's own report, else the first
rank to end that the supervisor did not kill), and whether an error is the code's or data's
(it repeats at the same batch, on another node), the node's (it repeats on the same node, at
another batch; or only hardware raises it), or a transient one of the store (retried in place).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from hpc_llm.job.failures import INFRA_PATTERNS, RankFailure
from hpc_llm.job.supervisor.stop import Stop
from hpc_llm.rundir.outcome import Cause
from hpc_llm.rundir.record import Attempt

#: errors of the code or the data although they name CUDA (a device-side assert, an illegal
#: access at a given batch): ambiguous on first sight, decided by where they repeat
AMBIGUOUS = re.compile(r"device-side assert|illegal memory access|CUDA out of memory|OutOfMemoryError")
#: errors only a faulty GPU or node raises: the node's, even at a batch where another node had
#: the same (a restart replays the batches since the last checkpoint; at 2,048 nodes two faulty
#: GPUs at one batch happen: benchmarks/long_run.py failed 15 % of its runs as a user error)
HARDWARE = re.compile(r"uncorrectable ECC|ECC error|\bXid\b|fallen off the bus", re.I)
#: object-store and network hiccups worth retrying in place (botocore's and requests' words)
TRANSIENT = re.compile(
    r"SlowDown|Service ?Unavailable|\b503\b|\b500\b|InternalError|RequestTimeout|ReadTimeoutError|"
    r"EndpointConnectionError|ConnectTimeoutError|Connection was closed before we received a valid response"
)


def first_failure(stop: Stop) -> RankFailure | None:
    return min(stop.failures, key=lambda f: (f.time, f.rank)) if stop.failures else None


def blamed_node(stop: Stop) -> str | None:
    """The node where the generation failed first: the earliest rank failure report, else the
    first rank to end that the supervisor did not kill (not a bystander)."""
    first = first_failure(stop)
    if first is not None:
        return first.node
    own = [e for e in stop.rank_exits if not e.killed]
    return own[0].node if own else None


def _key(f: RankFailure) -> tuple[str, str]:
    return (f.type, re.sub(r"\d+", "N", f.message)[:200])


def classify_failure(stop: Stop, current: Attempt, earlier: Sequence[RankFailure]) -> tuple[Cause, str, str | None]:
    """(cause, reason, node to blame) of a generation that failed without a stop signal or a hang."""
    if stop.failed_nodes:
        nodes = ", ".join(sorted(set(stop.failed_nodes)))
        return Cause.NODE_FAILURE, f"Slurm reported node failure on {nodes}", sorted(set(stop.failed_nodes))[0]
    by_signal = [e for e in stop.rank_exits if e.by_signal and not e.killed]
    if by_signal:
        # a rank killed by a signal (the OOM killer, a GPU off the bus) writes no report; the
        # reports of its peers ("Connection closed by peer") are consequences
        return Cause.FAILURE, str(by_signal[0]), by_signal[0].node
    first = first_failure(stop)
    if first is None:
        node = blamed_node(stop)
        ends = [e for e in stop.rank_exits if e.node == node] or list(stop.rank_exits)
        return Cause.FAILURE, str(ends[0]) if ends else "the ranks ended abnormally and no rank said why", node
    text = f"{first.type}: {first.message}"
    what = f"{text} (rank {first.rank} on {first.node}"
    same = [e for e in earlier if _key(e) == _key(first)]
    if TRANSIENT.search(text):
        return Cause.TRANSIENT, f"{what}, during batch {first.batch + 1}; a transient storage error, retrying)", None
    if not HARDWARE.search(text) and any(e.batch == first.batch and e.node != first.node for e in same):
        return (
            Cause.USER_ERROR,
            f"{what}, during batch {first.batch + 1} again, now on another node: the code or data)",
            None,
        )
    infra = bool(INFRA_PATTERNS.search(text)) and not AMBIGUOUS.search(text)
    if any(e.node == first.node and e.batch != first.batch for e in same) or (
        infra and any(e.node == first.node for e in earlier)
    ):
        return Cause.FAILURE, f"{what}, again on this node at another batch: the node)", first.node
    if infra:
        return Cause.FAILURE, f"{what}, during batch {first.batch + 1})", first.node
    if first.batch <= current.resumed_at_batch and not AMBIGUOUS.search(text):
        return Cause.USER_ERROR, f"{what}, before the first batch of the attempt)", None
    if any(e.batch == first.batch for e in same):
        return Cause.USER_ERROR, f"{what}, during batch {first.batch + 1} again)", None
    return Cause.FAILURE, f"{what}, during batch {first.batch + 1}; retrying once)", first.node
