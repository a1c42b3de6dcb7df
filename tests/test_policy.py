"""The fault policy's decision table (hpc_llm.job.supervisor.policy.decide), one row per rule and per
scenario of a long run; docs/design/decision-table.md lists the same rows."""

from __future__ import annotations

import pytest

from hpc_llm.job.failures import RankExit, RankFailure
from hpc_llm.job.supervisor.classify import blamed_node
from hpc_llm.job.supervisor.history import active_blame, excluded_by_history
from hpc_llm.job.supervisor.lost import lost_cause
from hpc_llm.job.supervisor.policy import decide
from hpc_llm.job.supervisor.stop import Settings, Stop
from hpc_llm.rundir.record import Attempt

H = 3600.0
T0 = 1_000_000.0


def att(
    i: int,
    cause=None,
    state="failed",
    resumed=0,
    ckpt=None,
    stopped=None,
    suspects=(),
    action=None,
    at=None,
    trained=None,
):
    """Attempt ``i`` of a run, one hour each unless ``at`` says when it ended; ``trained``: when
    its first batch was done (None: before any)."""
    end = at if at is not None else T0 + (i + 1) * H
    return Attempt(
        first_batch_at=trained,
        job_id="7",
        restart=i,
        started_at=end - H,
        state=state,
        ended_at=end,
        cause=cause,
        resumed_at_batch=resumed,
        last_batch=resumed + 10,
        checkpoint_batch=ckpt,
        stopped_at_batch=stopped,
        suspects=list(suspects),
        action=action,
    )


def cur(history, **kw):
    """The current attempt, resumed where the history left off."""
    resumed = max((a.checkpoint_batch or a.stopped_at_batch or a.resumed_at_batch for a in history), default=0)
    kw.setdefault("resumed", resumed)
    kw.setdefault("state", "running")
    kw.setdefault("at", None)
    a = att(len(history), **kw)
    a.ended_at = None
    return a


def unreachable(a: Attempt, *nodes: str) -> Attempt:
    """``a``, a ``network`` stop whose batch host could not reach ``nodes``."""
    a.unreachable = list(nodes)
    return a


def slow(a: Attempt, node: str, action: str, at: float) -> Attempt:
    """``a`` with a straggler verdict on ``node`` (hpc_llm.job.supervisor.stragglers), ``action`` taken."""
    a.stragglers.append({"node": node, "ratio": 3.0, "busy_s": {node: 0.3, "n1": 0.1}, "action": action, "at": at})
    return a


def fail(rank=0, node="n1", type_="RuntimeError", message="boom", batch=5, time=0.0):
    return RankFailure(rank, node, type_, message, batch, time)


NOW = T0 + 100 * H
S = Settings(nodes=2)
#: a 3-node run that may go on with 2 (resources.min_nodes)
S3 = Settings(nodes=3, min_nodes=2)

# Messages as the installed stack writes them (no GPU needed for the strings; checked with
# `strings` on torch 2.7.0's libtorch_cuda.so / libc10_cuda.so, CUDA 12's libcudart.so and in
# botocore 1.44's exceptions.py):
#: ProcessGroupNCCL's watchdog: "Watchdog caught collective operation timeout: " WorkNCCL(...) " ran for "
NCCL_TIMEOUT = (
    "[Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=71, OpType=ALLREDUCE, "
    "NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600010 milliseconds before timing out."
)
#: c10's "CUDA error: " + cudaGetErrorString: a device-side assert (an index out of range in the data)
DEVICE_ASSERT = (
    "CUDA error: device-side assert triggered\nCUDA kernel errors might be asynchronously reported at some other "
    "API call, so the stacktrace below might be incorrect."
)
#: the same on an ECC error (libcudart: "uncorrectable ECC error encountered")
ECC = "CUDA error: uncorrectable ECC error encountered"
#: botocore's ClientError.MSG_TEMPLATE with retry info, as S3 throttles
S3_SLOWDOWN = (
    "An error occurred (SlowDown) when calling the GetObject operation (reached max retries: 4): "
    "Please reduce your request rate."
)


#: a peer's report after a node died: the gloo error of a rank that lost its peer
PEER_GONE = "[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:7231"


def row(
    name, history, current, stop, settings, action, cause, *, suspects=(), exclude=(), state=None, delay=0.0, swap=()
):
    """One row of the table: what the decision must be, all of it (action, cause, the nodes
    blamed, the nodes left out, the attempt's recorded state, the wait before a restart, the
    nodes a swap replaces by spares)."""
    expected = (action, cause, suspects, exclude, state, delay, swap)
    return pytest.param(history, current, stop, settings, expected, id=name)


ECC_ON_N1 = {"returncode": 1, "failures": (fail(node="n1", message=ECC, batch=40),)}
KILLED_ON_N1 = {"returncode": 137, "rank_exits": (RankExit(0, "n1", -9, "killed by SIGKILL"),)}

ROWS = [
    row("completed", [], {"state": "completed"}, {"returncode": 0}, S, "done", "completed", state="completed"),
    row(
        "completed, then the time-limit signal kills the exiting ranks: still done",
        [],
        {"state": "completed"},
        {"returncode": 1, "stop_cause": "time_limit", "rank_exits": (RankExit(0, "n1", -12, "killed by SIGUSR2"),)},
        S,
        "done",
        "completed",
        state="completed",
    ),
    row(
        "no recovery: the exit code is all",
        [],
        {},
        {"returncode": 3},
        Settings(recover=False),
        "fail",
        "failure",
        state="failed",
    ),
    row(
        "time limit, saved",
        [],
        {"state": "stopped", "stopped": 50},
        {"returncode": 0, "stop_cause": "time_limit"},
        S,
        "requeue",
        "time_limit",
        state="stopped",
    ),
    row(
        "preemption, saved",
        [],
        {"state": "stopped", "stopped": 50},
        {"returncode": 0, "stop_cause": "preemption"},
        S,
        "requeue",
        "preemption",
        state="stopped",
    ),
    row(
        "2: the time limit overtakes the save: a time limit, nobody blamed",
        [],
        {},
        {
            "returncode": 143,
            "stop_cause": "time_limit",
            "sigterm_at": NOW,
            "end_time": NOW,
            "rank_exits": (
                RankExit(0, "n1", -9, "killed by SIGKILL", killed=True),
                RankExit(8, "n2", -9, "killed by SIGKILL", killed=True),
            ),
        },
        S,
        "requeue",
        "time_limit",
        state="failed",
    ),
    row(
        "3: SIGTERM at a shortened time limit, no signal forwarded: a time limit, not a cancel",
        [],
        {},
        {"returncode": 143, "sigterm_at": NOW - 2, "end_time": NOW},
        S,
        "requeue",
        "time_limit",
        state="failed",
    ),
    row(
        "a SIGTERM long before the end: cancelled",
        [],
        {},
        {"returncode": 143, "sigterm_at": NOW - 600, "end_time": NOW},
        S,
        "fail",
        "cancelled",
        state="failed",
    ),
    row(
        "Slurm requeues after NODE_FAIL: leave the attempt to the next start",
        [],
        {},
        {"returncode": 143, "sigterm_at": NOW, "slurm_requeueing": "NODE_FAIL"},
        S,
        "slurm_requeues",
        "lost",
        state="running",
    ),
    row(
        "preempted after the warning was spent (SIGTERM to the steps)",
        [],
        {},
        {"returncode": 137, "preempting": True},
        S,
        "requeue",
        "preemption",
        state="failed",
    ),
    row(
        "a preemption just after the time-limit warning went out: a preemption, killed unsaved",
        [],
        {},
        {"returncode": 143, "stop_cause": "time_limit", "preempting": True},
        S,
        "requeue",
        "preemption",
        state="failed",
    ),
    row(
        "a time limit the ranks saved for, while a preemption's grace time runs: the time limit",
        [],
        {"state": "stopped", "stopped": 40},
        {"returncode": 0, "stop_cause": "time_limit", "preempting": True},
        S,
        "requeue",
        "time_limit",
        state="stopped",
    ),
    row(
        "10: a preemption in the post-train stage is a preemption",
        [],
        {"ckpt": 60},
        {"returncode": 1, "stop_cause": "preemption", "rank_exits": (RankExit(0, "n1", -9, "killed by SIGKILL"),)},
        S,
        "requeue",
        "preemption",
        state="failed",
    ),
    row(
        "user error before the first batch",
        [],
        {},
        {"returncode": 1, "failures": (fail(type_="KeyError", message="'text'", batch=0),)},
        S,
        "fail",
        "user_error",
        state="failed",
    ),
    row(
        "recorded user error / preflight_failed",
        [],
        {"state": "failed", "cause": "preflight_failed"},
        {"returncode": 1},
        S,
        "fail",
        "preflight_failed",
        state="failed",
    ),
    row(
        "a failed preflight check on a node: requeued without it at once",
        [],
        {"state": "failed", "cause": "preflight", "suspects": ("n2",)},
        {"returncode": 1},
        S,
        "requeue",
        "preflight",
        suspects=("n2",),
        exclude=("n2",),
        state="failed",
    ),
    row(
        "4: a rank exits 1 with an ECC error on n1; n2's ranks are bystanders: n1 suspect, kept",
        [],
        {},
        {
            **ECC_ON_N1,
            "rank_exits": (
                RankExit(3, "n1", 1, "exited with 1"),
                RankExit(8, "n2", -9, "killed by SIGKILL", killed=True),
            ),
        },
        S,
        "restart",
        "failure",
        suspects=("n1",),
        state="failed",
    ),
    row(
        "4: the same node fails again at another batch: excluded, requeued",
        [att(0, "failure", suspects=("n1",), ckpt=30, at=NOW - 2 * H)],
        {},
        {
            "returncode": 1,
            "failures": (fail(node="n1", message=ECC, batch=70),),
            "rank_exits": (RankExit(8, "n2", -9, "killed by SIGKILL", killed=True),),
        },
        S,
        "requeue",
        "failure",
        suspects=("n1",),
        exclude=("n1",),
        state="failed",
    ),
    row(
        "4: an ECC error at the batch where another node had one: two faulty GPUs, not the user's code",
        [att(0, "failure", suspects=("n1",), ckpt=30, at=NOW - 2 * H)],
        {},
        {
            "returncode": 1,
            "failures": (fail(node="n2", message=ECC, batch=40),),
            "earlier": (fail(node="n1", message=ECC, batch=40),),
        },
        S,
        "restart",
        "failure",
        suspects=("n2",),
        state="failed",
    ),
    row(
        "a rank killed by a signal, bystanders terminated: the killed one's node",
        [],
        {},
        {
            "returncode": 137,
            "rank_exits": (
                RankExit(9, "n2", -9, "killed by SIGKILL"),
                RankExit(0, "n1", -9, "killed by SIGKILL", killed=True),
            ),
        },
        S,
        "restart",
        "failure",
        suspects=("n2",),
        state="failed",
    ),
    row(
        "9: a device-side assert is ambiguous the first time: restart once",
        [],
        {"resumed": 10},
        {"returncode": 1, "failures": (fail(node="n1", message=DEVICE_ASSERT, batch=40),)},
        S,
        "restart",
        "failure",
        suspects=("n1",),
        state="failed",
    ),
    row(
        "9: the same assert at the same batch on another node: the user's",
        [att(0, "failure", suspects=("n1",))],
        {},
        {
            "returncode": 1,
            "failures": (fail(node="n2", message=DEVICE_ASSERT, batch=40),),
            "earlier": (fail(node="n1", message=DEVICE_ASSERT, batch=40),),
        },
        S,
        "fail",
        "user_error",
        state="failed",
    ),
    row(
        "9: a transient object-store error at the first batch: retried in place after 30 s, nobody blamed",
        [],
        {},
        {"returncode": 1, "failures": (fail(type_="ClientError", message=S3_SLOWDOWN, batch=0),)},
        S,
        "restart",
        "transient",
        state="failed",
        delay=30.0,
    ),
    row(
        "the third transient error in a row waits 120 s",
        [att(0, "transient"), att(1, "transient")],
        {},
        {"returncode": 1, "failures": (fail(type_="ClientError", message=S3_SLOWDOWN, batch=0),)},
        S,
        "restart",
        "transient",
        state="failed",
        delay=120.0,
    ),
    row(
        "an NCCL watchdog timeout: the machine's",
        [],
        {},
        {"returncode": 1, "failures": (fail(node="n2", type_="DistBackendError", message=NCCL_TIMEOUT),)},
        S,
        "restart",
        "failure",
        suspects=("n2",),
        state="failed",
    ),
    row(
        "the throughput watchdog stopped and saved: requeued as its own cause",
        [],
        {"state": "stopped", "stopped": 30, "cause": "watchdog"},
        {"returncode": 0},
        S,
        "requeue",
        "watchdog",
        state="stopped",
    ),
    row(
        "a manual stop signal counts against the preemption budget",
        [],
        {"state": "stopped", "stopped": 3},
        {"returncode": 0, "stop_cause": "signal"},
        Settings(nodes=2, max_preemptions=0),
        "fail",
        "signal",
        state="stopped",
    ),
    row(
        "a hang names the silent rank's node, which stays in (one blame)",
        [],
        {},
        {"returncode": 137, "hang": ("rank 5 on n2 silent", ("n2",))},
        S,
        "restart",
        "hang",
        suspects=("n2",),
        state="failed",
    ),
    row(
        "a stuck collective names nobody",
        [],
        {},
        {"returncode": 137, "hang": ("no batch trained for more than 12s after batch 40", ())},
        S,
        "restart",
        "hang",
        state="failed",
    ),
    row(
        "6: a start-up hang is a failure with its phase, requeued",
        [],
        {},
        {"returncode": 137, "startup": "imports"},
        S,
        "requeue",
        "startup",
        state="failed",
    ),
    row(
        "srun reports a node failure: excluded at once",
        [],
        {},
        {"returncode": 1, "failed_nodes": ("n3",)},
        S,
        "requeue",
        "node_failure",
        suspects=("n3",),
        exclude=("n3",),
        state="failed",
    ),
    row(
        "a dead node (silent agent, probe unanswered): the node, excluded at once, never its peers",
        [],
        {},
        {
            "returncode": 137,
            "dead_nodes": (("n2", "silent for 3.1 s; its probe went unanswered for 1.5 s"),),
            "failures": (fail(rank=0, node="n1", type_="DistNetworkError", message=PEER_GONE, batch=12),),
            "rank_exits": (RankExit(0, "n1", 1, "exited with 1"),),
        },
        S,
        "requeue",
        "node_failure",
        suspects=("n2",),
        exclude=("n2",),
        state="failed",
    ),
    row(
        "a dead node while a hang was named: a node failure, never a hang, the bystander never blamed",
        [],
        {},
        {
            "returncode": 137,
            "dead_nodes": (("n2", "its connection dropped; its probe port refused"),),
            "hang": ("rank(s) 0,1 on n1,n2 silent for more than 20s (frozen?)", ("n1", "n2")),
        },
        S,
        "requeue",
        "node_failure",
        suspects=("n2",),
        exclude=("n2",),
        state="failed",
    ),
    row(
        "the fabric: the batch host cut off (every other agent lost, slurmctld silent): it blames itself, "
        "writes no verdict, stands down",
        [],
        {},
        {
            "returncode": 137,
            "dead_nodes": (("n2", "silent for 3.1 s; no answer from the host"), ("n3", "silent for 3.2 s")),
            "batch_host": "n1",
            "remote_nodes": 2,
            "remote_heard": 0,
            "slurmctld_answers": False,
        },
        S,
        "stand_down",
        "lost",
        suspects=("n1",),
        state="running",
    ),
    row(
        "every other agent lost, slurmctld answers and (waited for) finds that node not responding too: "
        "the observer is not cut off, the node is dead",
        [],
        {},
        {
            "returncode": 137,
            "dead_nodes": (("n2", "silent for 3.1 s; no answer from the host"),),
            "batch_host": "n1",
            "remote_nodes": 1,
            "remote_heard": 0,
            "slurmctld_answers": True,
            "slurm_gone": ("n2",),
        },
        S,
        "requeue",
        "node_failure",
        suspects=("n2",),
        exclude=("n2",),
        state="failed",
    ),
    row(
        "the one other node silent, slurmctld finds it responding after SlurmdTimeout and a ping: a link "
        "between them (either end); nobody blamed, new agents here after a backoff",
        [],
        {},
        {
            "returncode": 137,
            "dead_nodes": (("n2", "silent for 3.1 s; no answer from the host"),),
            "batch_host": "n1",
            "remote_nodes": 1,
            "remote_heard": 0,
            "slurmctld_answers": True,
            "slurm_gone": (),
        },
        S,
        "restart",
        "network",
        state="failed",
        delay=10.0,
    ),
    row(
        "the same node unreachable again at the next stop, without progress between: blamed now",
        [unreachable(att(0, cause="network"), "n2")],
        {},
        {
            "returncode": 137,
            "dead_nodes": (("n2", "silent for 3.1 s; no answer from the host"),),
            "batch_host": "n1",
            "remote_nodes": 1,
            "remote_heard": 0,
            "slurmctld_answers": True,
            "slurm_gone": (),
        },
        S,
        "restart",
        "network",
        suspects=("n2",),
        state="failed",
    ),
    row(
        "srun could not start the agent on a node (its slurmd did not answer the batch host): a link, "
        "nobody blamed, a backoff",
        [],
        {},
        {
            "returncode": 1,
            "agent_errors": (("*", "the agent step ended before every agent was up (srun exited 137)"),),
            "launch_failed": ("n2",),
        },
        S,
        "restart",
        "network",
        state="failed",
        delay=10.0,
    ),
    row(
        "slurmctld silent past the supervisor's patience: the ranks stopped before Slurm could requeue "
        "the job elsewhere; the supervisor stands down",
        [],
        {},
        {"returncode": 137, "ctld_lost": "slurmctld has not answered for 6 s", "batch_host": "n1"},
        S,
        "stand_down",
        "lost",
        suspects=("n1",),
        state="running",
    ),
    row(
        "... and it answered again with this allocation running: nobody blamed, new ranks here",
        [],
        {},
        {
            "returncode": 137,
            "ctld_lost": "slurmctld has not answered for 6 s",
            "ctld_answered": True,
            "batch_host": "n1",
        },
        S,
        "restart",
        "network",
        state="failed",
        delay=10.0,
    ),
    row(
        "Slurm took nodes out of the job and no spare is left: fewer usable nodes than the run needs; a new allocation",
        [],
        {},
        {"returncode": 0, "too_few": "the allocation holds 1 usable node(s) and the run needs 2"},
        S,
        "requeue",
        "lost",
        state="failed",
    ),
    row(
        "every other agent lost at once, slurmctld answers and, after SlurmdTimeout and a ping, finds them all "
        "responding: a partition; "
        "the batch host blames itself and requeues without it (not a swap: it reaches no agent)",
        [],
        {},
        {
            "returncode": 137,
            "dead_nodes": (("n2", "silent for 3.1 s; no answer from the host"), ("n3", "silent for 3.2 s")),
            "batch_host": "n1",
            "remote_nodes": 2,
            "remote_heard": 0,
            "slurmctld_answers": True,
            "slurm_gone": (),
            "spares": ("n4",),
        },
        S,
        "requeue",
        "node_failure",
        suspects=("n1",),
        exclude=("n1",),
        state="failed",
    ),
    row(
        "every other agent lost at once, slurmctld answers and finds one of them gone: that node, not the one "
        "it still finds responding",
        [],
        {},
        {
            "returncode": 137,
            "dead_nodes": (("n2", "silent for 3.1 s; no answer from the host"), ("n3", "silent for 3.2 s")),
            "batch_host": "n1",
            "remote_nodes": 2,
            "remote_heard": 0,
            "slurmctld_answers": True,
            "slurm_gone": ("n2",),
        },
        S,
        "requeue",
        "node_failure",
        suspects=("n2",),
        exclude=("n2",),
        state="failed",
    ),
    row(
        "one node lost while another is still heard, slurmctld silent: that node, not the observer",
        [],
        {},
        {
            "returncode": 137,
            "dead_nodes": (("n2", "silent for 3.1 s; no answer from the host"),),
            "batch_host": "n1",
            "remote_nodes": 2,
            "remote_heard": 1,
            "slurmctld_answers": False,
        },
        S,
        "requeue",
        "node_failure",
        suspects=("n2",),
        exclude=("n2",),
        state="failed",
    ),
    row(
        "an agent gone on a live node (its probe refused): a new agent there, the node a suspect only",
        [],
        {},
        {"returncode": 137, "agents_died": (("n2", "its probe port refused (ECONNREFUSED): the host answers"),)},
        S,
        "restart",
        "failure",
        suspects=("n2",),
        state="failed",
    ),
    row(
        "an agent gone on the same live node again: now the node's, left out",
        [att(0, "failure", suspects=("n2",), at=NOW - 2 * H)],
        {},
        {"returncode": 137, "agents_died": (("n2", "its probe port refused (ECONNREFUSED): the host answers"),)},
        S,
        "requeue",
        "failure",
        suspects=("n2",),
        exclude=("n2",),
        state="failed",
    ),
    row(
        "a node dies while the ranks save for a preemption: the preemption, nobody blamed",
        [],
        {"state": "stopped", "stopped": 40},
        {"returncode": 0, "stop_cause": "preemption", "dead_nodes": (("n2", "silent"),)},
        S,
        "requeue",
        "preemption",
        state="stopped",
    ),
    row(
        "hpc_llm's agent ended of an error of its own: a cold restart, the node not blamed",
        [],
        {},
        {"returncode": 137, "agent_errors": (("n2", "agent error: KeyError: 'gen'"),)},
        S,
        "restart",
        "failure",
        state="failed",
    ),
    row(
        "a checkpoint save stalls on the store: retried in place after 30 s, nobody blamed",
        [],
        {},
        {"returncode": 137, "storage_stall": "rank 0 has been in its checkpoint upload for 900s"},
        S,
        "restart",
        "transient",
        state="failed",
        delay=30.0,
    ),
    row(
        "an agent that stalled past its lease (its node froze, then came back): a hang on that node",
        [],
        {},
        {"returncode": 137, "hang": ("the agent on n2 stalled for 6.2s (frozen?)", ("n2",))},
        S,
        "restart",
        "hang",
        suspects=("n2",),
        state="failed",
    ),
    row(
        "off Slurm a requeue is not possible",
        [],
        {"state": "stopped", "stopped": 5},
        {"returncode": 0, "stop_cause": "preemption", "on_slurm": False},
        S,
        "fail",
        "preemption",
        state="stopped",
    ),
    row(
        "1: the 6th failure of a long run, each after a new checkpoint, is recovered",
        [att(i, "failure", ckpt=100 * (i + 1), resumed=100 * i) for i in range(5)],
        {},
        KILLED_ON_N1,
        S,
        "restart",
        "failure",
        suspects=("n1",),
        state="failed",
    ),
    row(
        "the 6th failure in a row without a new checkpoint ends the run",
        [att(i, "failure") for i in range(5)],
        {},
        KILLED_ON_N1,
        Settings(nodes=2, max_failures_per_day=None),
        "fail",
        "failure",
        suspects=("n1",),
        state="failed",
    ),
    row(
        "resubmitting a failed run resets the count",
        [*(att(i, "failure") for i in range(5)), att(5, "failure", action="fail")],
        {},
        KILLED_ON_N1,
        S,
        "restart",
        "failure",
        suspects=("n1",),
        state="failed",
    ),
    row(
        "the rate cap: 4 failures within 24 h, each with progress, cap 3",
        [att(i, "failure", ckpt=100 * (i + 1), resumed=100 * i, at=NOW - 3 * H + i * H) for i in range(3)],
        {},
        KILLED_ON_N1,
        Settings(nodes=2, max_failures_per_day=3),
        "fail",
        "failure",
        suspects=("n1",),
        state="failed",
    ),
    row(
        "the governor: preemptions that never save end the run after N attempts",
        [att(i, "preemption") for i in range(9)],
        {},
        {"returncode": 137, "preempting": True},
        S,
        "fail",
        "preemption",
        state="failed",
    ),
    row(
        "time limits that save are progress: the governor does not count them",
        [att(i, "time_limit", state="stopped", stopped=100 * (i + 1), resumed=100 * i) for i in range(20)],
        {"state": "stopped", "stopped": 2100},
        {"returncode": 0, "stop_cause": "time_limit"},
        S,
        "requeue",
        "time_limit",
        state="stopped",
    ),
    row(
        "a node left out earlier stays out on a time-limit requeue, nobody newly blamed",
        [att(0, "node_failure", suspects=("n3",), at=NOW - H)],
        {"state": "stopped", "stopped": 40},
        {"returncode": 0, "stop_cause": "time_limit"},
        S,
        "requeue",
        "time_limit",
        exclude=("n3",),
        state="stopped",
    ),
    # -- a spare's first generation: its first collectives are its all-reduce check -----------------
    row(
        "spare joined: a connection error before the first batch blames the spare, not the old node reporting it",
        [att(0, "node_failure", suspects=("n2",), action="swap", at=NOW - 60)],
        {},
        {"returncode": 1, "failures": (fail(node="n1", message=PEER_GONE, batch=0),), "joined": ("n3",)},
        S,
        "restart",
        "failure",
        suspects=("n3",),
        exclude=("n2",),
        state="failed",
    ),
    row(
        "spare joined: the start-up stuck in the rendezvous blames the spare and restarts in place",
        [],
        {},
        {"returncode": 137, "startup": "rendezvous", "joined": ("n3",)},
        S,
        "restart",
        "failure",
        suspects=("n3",),
        state="failed",
    ),
    row(
        "spare joined, twice: left out for the next spare in the same job",
        [att(0, "failure", suspects=("n3",), at=NOW - 60)],
        {},
        {"returncode": 137, "startup": "rendezvous", "joined": ("n3",), "spares": ("n4",)},
        S,
        "swap",
        "failure",
        suspects=("n3",),
        exclude=("n3",),
        state="failed",
        swap=("n3",),
    ),
    row(
        "spare joined: an exception raised on the spare before the first batch is the spare's, not a user error",
        [],
        {},
        {
            "returncode": 1,
            "failures": (fail(node="n3", message="No such file or directory: 'x'", batch=0),),
            "joined": ("n3",),
        },
        S,
        "restart",
        "failure",
        suspects=("n3",),
        state="failed",
    ),
    row(
        "spare joined: the same exception raised on an old node before the first batch stays a user error",
        [],
        {},
        {
            "returncode": 1,
            "failures": (fail(node="n1", message="No such file or directory: 'x'", batch=0),),
            "joined": ("n3",),
        },
        S,
        "fail",
        "user_error",
        state="failed",
    ),
    row(
        "spare joined and trained: a later failure is judged as any other (its node, one point)",
        [],
        {"trained": NOW - 30},
        {"returncode": 1, "failures": (fail(node="n1", message=ECC, batch=7),), "joined": ("n3",)},
        S,
        "restart",
        "failure",
        suspects=("n1",),
        state="failed",
    ),
    # -- fewer nodes (resources.min_nodes): the run goes on in the same job on the nodes left ------
    row(
        "min_nodes: a dead node, no spare, 3 nodes and min_nodes=2: the run goes on with 2 in the same job",
        [],
        {},
        {"returncode": 137, "dead_nodes": (("n2", "silent"),), "trained_nodes": 3, "shrinkable": True},
        S3,
        "shrink",
        "node_failure",
        suspects=("n2",),
        exclude=("n2",),
        state="failed",
        swap=("n2",),
    ),
    row(
        "min_nodes: two dead nodes, one spare: the spare takes one place, the run goes on with 2",
        [],
        {},
        {
            "returncode": 137,
            "dead_nodes": (("n1", "silent"), ("n2", "silent")),
            "spares": ("n4",),
            "trained_nodes": 3,
            "shrinkable": True,
        },
        S3,
        "shrink",
        "node_failure",
        suspects=("n1", "n2"),
        exclude=("n1", "n2"),
        state="failed",
        swap=("n1", "n2"),
    ),
    row(
        "min_nodes: not below it: two dead nodes of 3 with min_nodes=2 are requeued, both excluded",
        [],
        {},
        {"returncode": 137, "dead_nodes": (("n1", "silent"), ("n2", "silent")), "trained_nodes": 3, "shrinkable": True},
        S3,
        "requeue",
        "node_failure",
        suspects=("n1", "n2"),
        exclude=("n1", "n2"),
        state="failed",
    ),
    row(
        "min_nodes: a job that dies with its node (no --no-kill) is requeued without it",
        [],
        {},
        {"returncode": 137, "dead_nodes": (("n2", "silent"),), "trained_nodes": 3, "shrinkable": False},
        S3,
        "requeue",
        "node_failure",
        suspects=("n2",),
        exclude=("n2",),
        state="failed",
    ),
    row(
        "min_nodes: a first GPU error blames its node once and restarts on the same nodes: no shrink",
        [],
        {},
        {**ECC_ON_N1, "trained_nodes": 3, "shrinkable": True},
        S3,
        "restart",
        "failure",
        suspects=("n1",),
        state="failed",
    ),
    row(
        "min_nodes: unset, no spare: a dead node is requeued as before",
        [],
        {},
        {"returncode": 137, "dead_nodes": (("n2", "silent"),), "trained_nodes": 3, "shrinkable": True},
        Settings(nodes=3),
        "requeue",
        "node_failure",
        suspects=("n2",),
        exclude=("n2",),
        state="failed",
    ),
    # -- spares (resources.spare_nodes): a left-out node is replaced in the same job ---------------
    row(
        "spare: a dead node is swapped for a warm spare in the same job, no requeue",
        [],
        {},
        {"returncode": 137, "dead_nodes": (("n2", "silent for 3.1 s; its probe went unanswered"),), "spares": ("n3",)},
        S,
        "swap",
        "node_failure",
        suspects=("n2",),
        exclude=("n2",),
        state="failed",
        swap=("n2",),
    ),
    row(
        "spare: a node Slurm reports failed is swapped for a spare",
        [],
        {},
        {"returncode": 1, "failed_nodes": ("n2",), "spares": ("n3",)},
        S,
        "swap",
        "node_failure",
        suspects=("n2",),
        exclude=("n2",),
        state="failed",
        swap=("n2",),
    ),
    row(
        "spare: a GPU error on the same node a second time: the node is swapped for the spare",
        [att(0, "failure", suspects=("n1",), at=NOW - H)],
        {},
        {**ECC_ON_N1, "spares": ("n3",), "earlier": (fail(node="n1", message=ECC, batch=20),)},
        S,
        "swap",
        "failure",
        suspects=("n1",),
        exclude=("n1",),
        state="failed",
        swap=("n1",),
    ),
    row(
        "spare: a first GPU error restarts in place on the same nodes; the spare stays a spare",
        [],
        {},
        {**ECC_ON_N1, "spares": ("n3",)},
        S,
        "restart",
        "failure",
        suspects=("n1",),
        state="failed",
    ),
    row(
        "spare: no spare left: requeued by hpc_llm with the dead node excluded",
        [att(0, "node_failure", suspects=("n3",), at=NOW - H)],
        {},
        {"returncode": 137, "dead_nodes": (("n2", "silent"),), "spares": ("n3",)},
        S,
        "requeue",
        "node_failure",
        suspects=("n2",),
        exclude=("n2", "n3"),
        state="failed",
    ),
    row(
        "spare: two dead nodes and one spare: requeued with both excluded",
        [],
        {},
        {"returncode": 137, "dead_nodes": (("n1", "silent"), ("n2", "silent")), "spares": ("n3",)},
        S,
        "requeue",
        "node_failure",
        suspects=("n1", "n2"),
        exclude=("n1", "n2"),
        state="failed",
    ),
    row(
        "spare: a time limit is a requeue, spares or not",
        [],
        {"state": "stopped", "stopped": 40},
        {"returncode": 0, "stop_cause": "time_limit", "spares": ("n3",)},
        S,
        "requeue",
        "time_limit",
        state="stopped",
    ),
    row(
        "spare: fault.restart_in_place=false requeues, spares or not",
        [],
        {},
        {"returncode": 137, "dead_nodes": (("n2", "silent"),), "spares": ("n3",)},
        Settings(nodes=2, restart_in_place=False),
        "requeue",
        "node_failure",
        suspects=("n2",),
        exclude=("n2",),
        state="failed",
    ),
    row(
        "the supervisor's own stall outlasted its agents: every node looks dead, none is blamed",
        [],
        {},
        {
            "returncode": 137,
            "dead_nodes": (("n1", "its connection dropped"), ("n2", "its connection dropped")),
            "self_stall": "the supervisor's own loop stalled for 20.0 s",
            "spares": ("n3",),
        },
        S,
        "restart",
        "hang",
        state="failed",
    ),
    row(
        "drain: a node being drained saved from and swapped for the spare: no blame, no requeue",
        [],
        {"state": "stopped", "stopped": 40},
        {"returncode": 0, "stop_cause": "drain", "draining": ("n2",), "spares": ("n3",)},
        S,
        "swap",
        "drain",
        state="stopped",
        swap=("n2",),
    ),
    row(
        "drain: no budget is spent on it, whatever failures came before",
        [att(i, "failure") for i in range(5)],
        {"state": "stopped", "stopped": 40},
        {"returncode": 0, "stop_cause": "drain", "draining": ("n2",), "spares": ("n3",)},
        Settings(nodes=2, max_failures_per_day=None),
        "swap",
        "drain",
        state="stopped",
        swap=("n2",),
    ),
    row(
        "drain: the spare went meanwhile: resumed here, the drain waits for the job",
        [],
        {"state": "stopped", "stopped": 40},
        {"returncode": 0, "stop_cause": "drain", "draining": ("n2",), "spares": ()},
        S,
        "restart",
        "drain",
        state="stopped",
    ),
    row(
        "drain: a rank failed before it saved: judged as a failure, its node blamed",
        [],
        {},
        {**ECC_ON_N1, "stop_cause": "drain", "draining": ("n2",), "spares": ("n3",)},
        S,
        "restart",
        "failure",
        suspects=("n1",),
        state="failed",
    ),
    row(
        "straggler: a slow node saved from and swapped for the spare: one blame point, no requeue",
        [],
        {"state": "stopped", "stopped": 40},
        {"returncode": 0, "stop_cause": "straggler", "stragglers": ("n2",), "spares": ("n3",)},
        S,
        "swap",
        "straggler",
        suspects=("n2",),
        state="stopped",
        swap=("n2",),
    ),
    row(
        "straggler: the spare went meanwhile: resumed here",
        [],
        {"state": "stopped", "stopped": 40},
        {"returncode": 0, "stop_cause": "straggler", "stragglers": ("n2",), "spares": ()},
        S,
        "restart",
        "straggler",
        suspects=("n2",),
        state="stopped",
    ),
    row(
        "straggler exclude: the time limit's requeue leaves the slow node out",
        [slow(att(0, "failure", action="restart"), "n2", "exclude", NOW - H)],
        {"state": "stopped", "stopped": 40},
        {"returncode": 0, "stop_cause": "time_limit"},
        S,
        "requeue",
        "time_limit",
        exclude=("n2",),
        state="stopped",
    ),
    row(
        "straggler exclude: a verdict older than forgive_after_s leaves nobody out",
        [slow(att(0, "failure", action="restart"), "n2", "exclude", NOW - 25 * H)],
        {"state": "stopped", "stopped": 40},
        {"returncode": 0, "stop_cause": "time_limit"},
        S,
        "requeue",
        "time_limit",
        state="stopped",
    ),
    row(
        "straggler warn: a verdict recorded with warn leaves nobody out",
        [slow(att(0, "failure", action="restart"), "n2", "warn", NOW - H)],
        {"state": "stopped", "stopped": 40},
        {"returncode": 0, "stop_cause": "time_limit"},
        S,
        "requeue",
        "time_limit",
        state="stopped",
    ),
    row(
        "spare: a swap spends the failure budget like any failure",
        [att(i, "failure") for i in range(5)],
        {},
        {"returncode": 137, "dead_nodes": (("n2", "silent"),), "spares": ("n3",)},
        Settings(nodes=2, max_failures_per_day=None),
        "fail",
        "node_failure",
        suspects=("n2",),
        exclude=("n2",),
        state="failed",
    ),
]


@pytest.mark.parametrize("history,current,stop,settings,expected", ROWS)
def test_decision_table(history, current, stop, settings, expected):
    """Every row checks the whole decision: action, cause, the nodes blamed and the nodes left
    out (a row that blamed a bystander, or left a healthy node out, fails), the state recorded."""
    action, cause, suspects, exclude, state, delay, swap = expected
    stop = dict(stop)
    earlier = stop.pop("earlier", ())
    d = decide(history, cur(history, **current), Stop(now=NOW, **stop), settings, earlier)
    assert (d.action, d.cause) == (action, cause), d.reason
    assert (d.suspects, d.exclude) == (suspects, exclude), d.reason
    assert d.state == state and d.delay_s == delay, d
    assert d.swap_out == swap, d


def test_budgets_are_counted_per_cause():
    """A run's stops through decide() one after another: each cause spends its own budget.
    Preemptions (and stops sent by hand) have fault.max_preemptions, time limits
    fault.max_timeouts; neither is a failure, so neither spends fault.max_failures; failures
    in a row spend max_failures, and a saved stop in between that made progress resets them."""
    s = Settings(nodes=2, max_preemptions=2, max_timeouts=3, max_failures=2, max_failures_per_day=None)
    history: list[Attempt] = []
    batch = 0

    def stop_with(kind: str) -> str:
        nonlocal batch
        if kind == "failure":
            current = cur(history)
            # each on a node of its own: a node blamed twice would be left out (a requeue)
            node = f"n{len(history) + 1}"
            facts = Stop(
                now=NOW + len(history), returncode=137, rank_exits=(RankExit(0, node, -9, "killed by SIGKILL"),)
            )
        else:
            batch += 10
            current = cur(history, state="stopped", stopped=batch)
            facts = Stop(now=NOW + len(history), returncode=0, stop_cause=kind)
        d = decide(history, current, facts, s)
        current.cause, current.action, current.state = d.cause, d.action, d.state
        current.suspects, current.ended_at = list(d.suspects), NOW + len(history)
        history.append(current)
        return d.action

    # two preemptions and three time limits pass; failures in between count on their own
    assert [stop_with(k) for k in ("preemption", "failure", "time_limit", "preemption", "time_limit")] == [
        "requeue",
        "restart",
        "requeue",
        "requeue",
        "requeue",
    ]
    assert stop_with("failure") == "restart"  # the saves since reset the failure count: 1 in a row
    assert stop_with("failure") == "restart"  # 2 in a row: the budget is 2
    assert stop_with("failure") == "fail"  # the third in a row without a checkpoint ends the run
    history.clear()
    assert [stop_with("time_limit") for _ in range(3)] == ["requeue"] * 3
    assert stop_with("time_limit") == "fail"  # fault.max_timeouts=3
    history.clear()
    assert [stop_with("preemption") for _ in range(2)] == ["requeue"] * 2
    assert stop_with("signal") == "fail"  # a stop sent by hand spends the preemption budget


def test_blame_lands_on_the_rank_that_failed_first_not_the_bystanders():
    stop = Stop(
        returncode=1,
        now=NOW,
        rank_exits=(RankExit(3, "n1", 1, "exited with 1"), RankExit(8, "n2", -9, "killed by SIGKILL", killed=True)),
    )
    assert blamed_node(stop) == "n1"  # not n2, the first line killed by a signal (a bystander)
    d = decide([], cur([]), stop, S)
    assert d.suspects == ("n1",) and d.exclude == ()
    ecc = Stop(returncode=1, now=NOW, failures=(fail(node="n1", message=ECC, batch=70),))
    again = decide([att(0, "failure", suspects=("n1",), ckpt=30, at=NOW - 2 * H)], cur([], resumed=30), ecc, S)
    assert again.action == "requeue" and again.exclude == ("n1",)


def test_blame_expires_after_clean_hours():
    history = [att(0, "failure", suspects=("n1",), at=NOW - 30 * H)]
    assert active_blame(history, NOW, 24 * H) == {}
    assert active_blame(history, NOW, 48 * H) == {"n1": 1}
    stop = Stop(returncode=1, now=NOW, failures=(fail(node="n1", message=ECC, batch=90),))
    d = decide(history, cur(history, resumed=50), stop, S)
    assert d.action == "restart" and d.exclude == ()  # forgiven: a first blame again
    twice = [att(0, "failure", suspects=("n1",), at=NOW - 40 * H), att(1, "failure", suspects=("n1",), at=NOW - 30 * H)]
    assert excluded_by_history(twice, NOW - 29 * H, S.forgive_after_s) == {"n1"}
    assert excluded_by_history(twice, NOW, S.forgive_after_s) == set()  # 30 clean hours: forgiven


def test_a_node_failure_stays_excluded_while_its_blame_lasts():
    history = [att(0, "node_failure", suspects=("n3",), at=NOW - H)]
    stop = Stop(returncode=0, now=NOW, stop_cause="time_limit")
    d = decide(history, cur(history, state="stopped", stopped=40), stop, S)
    assert d.exclude == ("n3",)
    later = Stop(returncode=0, now=NOW + 2 * 24 * H, stop_cause="time_limit")
    assert decide(history, cur(history, state="stopped", stopped=40), later, S).exclude == ()


def test_preempted_lost_attempts_stay_preemptions():
    assert lost_cause("PREEMPTED") == "preemption"
    assert lost_cause("NODE_FAIL") == "node_failure"
    assert lost_cause("TIMEOUT") == "time_limit"
    assert lost_cause(None) == "lost"


def test_a_flaky_node_comes_back_on_probation_and_is_left_out_longer_each_time():
    def blamed(*hours_ago):
        return [att(i, "failure", suspects=("n7",), at=NOW - h * H) for i, h in enumerate(hours_ago)]

    assert excluded_by_history(blamed(40, 30), NOW - 10 * H, S.forgive_after_s) == {"n7"}  # 24 h after the second blame
    assert excluded_by_history(blamed(40, 30), NOW, S.forgive_after_s) == set()  # back, on probation
    # one failure on probation leaves it out at once, for 48 h
    assert excluded_by_history(blamed(40, 30, 1), NOW, S.forgive_after_s) == {"n7"}
    assert excluded_by_history(blamed(40, 30, 1), NOW + 40 * H, S.forgive_after_s) == {"n7"}
    assert excluded_by_history(blamed(40, 30, 1), NOW + 50 * H, S.forgive_after_s) == set()


def test_transient_storage_errors_are_retried_in_place_with_backoff():
    stop = Stop(returncode=1, now=NOW, failures=(fail(type_="ClientError", message=S3_SLOWDOWN, batch=12),))
    first = decide([], cur([], resumed=10), stop, S)
    assert (first.action, first.suspects, first.delay_s) == ("restart", (), 30.0)
    history = [att(i, "transient", resumed=10, at=NOW - (3 - i) * 60) for i in range(3)]
    again = decide(history, cur(history, resumed=10), stop, S)
    assert (again.action, again.delay_s) == ("restart", 240.0)
