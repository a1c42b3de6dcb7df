"""Every Slurm parser of hpc_llm over real outputs of Slurm 22.05 and 24.11, without a cluster.

The outputs were captured from the two dev clusters by ``tests/fixtures/slurm/capture.py``
(tests/fixtures/slurm/README.md): the same jobs, the same faults, on each version. Where the
versions differ, the test says what each printed (docs/design/verified/slurm.md, "Slurm 24.11
beside 22.05, verified").
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import pytest

from hpc_llm.job import failures
from hpc_llm.slurm import accounting, allocation, parse, query, requeue

FIXTURES = Path(__file__).parent / "fixtures" / "slurm"
VERSIONS = ["22.05", "24.11"]

pytestmark = pytest.mark.parametrize("version", VERSIONS)


def text(version: str, name: str) -> str:
    return (FIXTURES / version / name).read_text()


def sections(version: str, name: str) -> dict[str, str]:
    """A fixture of several outputs, each under a ``### <name>`` line."""
    found: dict[str, list[str]] = {}
    current: list[str] = []
    for line in text(version, name).splitlines():
        if line.startswith("### "):
            current = found.setdefault(line[4:].strip(), [])
        else:
            current.append(line)
    return {k: "\n".join(v) + "\n" for k, v in found.items()}


@cache
def jobs(version: str) -> dict[str, str]:
    """Which captured job played which part (``capture.py``'s roles -> job ids)."""
    return json.loads(text(version, "jobs.json"))


def one_line(version: str, name: str) -> dict[str, str]:
    return parse.show_job(sections(version, "scontrol_show_job_o.txt")[name])


def test_the_version_and_what_it_changes_at_the_end_of_a_job(version):
    parsed = parse.version(text(version, "version.txt"))
    assert parsed == tuple(int(x) for x in version.split("."))
    # only 24.05+ requeues a job that ends after its preemption's grace-time signal
    assert (parsed >= requeue.GRACE_PREEMPT_REQUEUES_SINCE) == (version == "24.11")


def test_a_job_requeued_around_a_dead_node_is_held_on_the_slurm_that_races_the_clean_up(version):
    """The dev cluster's SlurmdTimeout=10 and cred_expire=10: held 13 + 10 s, on 22.05 only."""
    conf = parse.show_config(text(version, "scontrol_show_config.txt"))
    assert (conf["SlurmdTimeout"], conf["AuthInfo"]) == ("10 sec", "cred_expire=10")
    assert requeue.hold_after_dead_node(conf) == 23
    assert requeue.hold_after_dead_node({}) == 400 + 120  # Slurm's defaults
    parsed = parse.version(text(version, "version.txt"))
    assert (parsed < requeue.REQUEUE_DELAY_SINCE) == (version == "22.05")


def test_scontrol_show_job_of_a_running_and_a_pending_job(version):
    running = one_line(version, "running")
    assert (running["JobState"], running["Restarts"], running["NodeList"]) == ("RUNNING", "0", "n[1-2]")
    start, end = parse.slurm_time(running["StartTime"]), parse.slurm_time(running["EndTime"])
    assert start and end and end - start == 600  # -t 10, SLURM_TIME_FORMAT=%s
    assert not allocation.preempting(running) and allocation.requeueing(running, 0) is None
    assert running["Partition"] == "low" and running["ExcNodeList"] == "(null)"
    assert allocation.hostnames(running["ExcNodeList"]) == []
    pending = one_line(version, "pending")
    assert (pending["JobState"], pending["Reason"]) == ("PENDING", "BeginTime")
    assert parse.slurm_time(pending["EndTime"]) is None  # Unknown
    # the multi-line form, as `hpc-llm logs` reads it: paths fill their line
    multi = parse.show_job(sections(version, "scontrol_show_job.txt")["running"])
    assert multi["JobId"] == jobs(version)["preempted"] and multi["JobState"] == "RUNNING"
    assert multi["StdOut"].endswith("/capture/preempted.out") and multi["Command"].endswith("/capture/preempted.sh")
    assert multi["WorkDir"].startswith("/") and multi["Requeue"] == "1"
    # 22.05 prints TRES=, 24.11 ReqTRES= and AllocTRES= (nothing of hpc_llm reads them)
    tres = {"22.05": {"TRES"}, "24.11": {"ReqTRES", "AllocTRES"}}[version]
    assert tres <= set(multi) and not ({"TRES", "ReqTRES", "AllocTRES"} - tres) & set(multi)


def test_scontrol_show_job_in_a_preemptions_grace_time_and_after_it(version):
    grace = one_line(version, "preempting")
    assert grace["JobState"] == "RUNNING" and allocation.preempting(grace)
    # the end moves to the preemption plus the partition's GraceTime (20 s)
    assert parse.slurm_time(grace["EndTime"]) - parse.slurm_time(grace["PreemptTime"]) == 20
    requeued = one_line(version, "requeued_after_preemption")
    assert (requeued["JobState"], requeued["Reason"], requeued["Restarts"]) == ("PENDING", "BeginTime", "1")
    assert not allocation.preempting(requeued) and allocation.requeueing(requeued, 0) is True
    by_hand = one_line(version, "requeued_by_scontrol")
    assert by_hand["Restarts"] == "2" and allocation.requeueing(by_hand, 1) is True


def test_scontrol_show_job_of_a_node_failure(version):
    """The first state after RUNNING, polled every 0.2 s once n2 died, and the requeued job."""
    first = one_line(version, "node_fail")
    assert first["Restarts"] == "1" and allocation.requeueing(first, 0) is True
    if version == "22.05":
        assert (first["JobState"], first["NodeList"]) == ("PENDING", "")
    else:  # still completing on the survivor, the dead node named
        assert (first["JobState"], first["NodeList"], first["FailedNode"]) == ("COMPLETING", "n1", "n2")
    requeued = one_line(version, "node_fail_requeued")
    assert (requeued["JobState"], requeued["Restarts"]) == ("PENDING", "1")
    # a job without a time limit (the partitions' MaxTime=INFINITE) reads UNLIMITED, EndTime
    # Unknown, until the backfill scheduler plans it: then a year (both versions, backfill.c
    # YEAR_MINUTES; seen both ways on 22.05)
    start, end = parse.slurm_time(requeued["StartTime"]), parse.slurm_time(requeued["EndTime"])
    assert (requeued["TimeLimit"], end) == ("UNLIMITED", None) or (
        requeued["TimeLimit"] == "365-00:00:00" and end - start == 365 * 86400
    )


def test_a_cancel_is_not_a_requeue(version):
    assert allocation.requeueing({"JobState": "CANCELLED", "Restarts": "0"}, 0) is False


@cache
def sacct(version: str) -> dict[str, list[accounting.AttemptRow]]:
    return accounting.parse(text(version, "sacct_X_D_P.txt"))


def states(version: str, role: str) -> list[str]:
    return [r.state for r in sacct(version)[jobs(version)[role]]]


def test_sacct_of_jobs_that_ended_in_one_attempt(version):
    assert states(version, "failed") == ["FAILED"] and sacct(version)[jobs(version)["failed"]][0].exit_code == "3:0"
    assert states(version, "killed_rank") == ["FAILED"] and states(version, "exit_code") == ["FAILED"]
    assert states(version, "timeout") == ["TIMEOUT"]
    [cancelled] = sacct(version)[jobs(version)["cancelled"]]
    assert cancelled.state == "CANCELLED" and cancelled.nodelist == "None assigned" and cancelled.gpus == 0
    # a job cancelled while pending: 22.05 gives it the cancel as its start, and keeps its reason
    if version == "22.05":
        assert cancelled.start == cancelled.end and cancelled.reason == "BeginTime"
    else:
        assert cancelled.start is None and cancelled.reason == "None" and cancelled.queue_wait_s is None
    for rows in sacct(version).values():
        assert all(r.end is not None and r.submit is not None for r in rows)


def test_sacct_of_a_preempted_and_requeued_job(version):
    """Preempted (it ignored the signal: slurmctld requeued it at the end of the grace time),
    requeued by hand (`scontrol requeue`), then a third attempt that exits 0."""
    rows = sacct(version)[jobs(version)["preempted"]]
    if version == "22.05":
        assert [r.state for r in rows] == ["PREEMPTED", "REQUEUED", "COMPLETED"]
    else:
        # 24.05+: the grace-time flag of the preemption was still set when the third attempt
        # ended, so that end was booked PREEMPTED and requeued once more (hpc_llm.slurm.requeue,
        # GRACE_PREEMPT_REQUEUES_SINCE)
        assert [r.state for r in rows] == ["PREEMPTED", "REQUEUED", "PREEMPTED", "COMPLETED"]
    assert [r.reason for r in rows] == ["None"] + ["BeginTime"] * (len(rows) - 1)
    assert all(r.nodelist == "n[1-2]" and r.gpus == 16 and r.cpus == 32 for r in rows)
    hours, unit = accounting.resource_hours(rows)
    assert unit == "GPU-hours" and hours == pytest.approx(sum(16 * r.elapsed_s for r in rows) / 3600)
    assert rows[0].verdict == "Slurm: PREEMPTED, exit code 0:0"
    assert all(a.end <= b.submit for a, b in zip(rows, rows[1:], strict=False))


def test_sacct_of_a_node_failure_and_of_a_requeue_on_the_time_limit_signal(version):
    rows = sacct(version)[jobs(version)["node_fail"]]
    assert [r.state for r in rows] == ["NODE_FAIL", "COMPLETED"] and rows[0].nodelist == "n[1-2]"
    # the failed attempt's exit code: 0:0 on 22.05, 1:0 on 24.11
    assert rows[0].exit_code == {"22.05": "0:0", "24.11": "1:0"}[version]
    assert states(version, "signal_rearm") == ["REQUEUED", "COMPLETED"]


def test_sacct_of_an_array(version):
    array = jobs(version)["array"]
    first, second = sacct(version)[f"{array}_0"], sacct(version)[f"{array}_1"]
    assert [r.state for r in first + second] == ["COMPLETED", "COMPLETED"]
    assert second[0].reason == "JobArrayTaskLimit"  # %1: it waited for task 0
    # each task also under its own numeric id, its SLURM_JOB_ID (the last task's is the array's)
    assert sacct(version)[array] == second
    assert len({k for k, v in sacct(version).items() if v == first}) == 2


def test_srun_error_lines(version):
    """The agent step's srun names the nodes Slurm found failed, and only those (its task lines
    are agents', not ranks': the agents report how the ranks ended)."""
    srun = sections(version, "srun_errors.txt")
    assert failures.failed_nodes(srun["killed_rank"].splitlines()) == []
    assert failures.failed_nodes(srun["exit_code"].splitlines()) == []
    assert failures.failed_nodes(srun["node_fail"].splitlines()) == ["n2"]


def test_sbatch_test_only(version):
    out = {k: v.split("\n", 1) for k, v in sections(version, "sbatch_test_only.txt").items()}

    def reason(case: str) -> str | None:
        code, stderr = out[case]
        return parse.test_only_reason(int(code.removeprefix("exit ")), stderr)

    assert reason("accepted") is None and "to start at" in out["accepted"][1]
    assert reason("too_many_gpus") == "allocation failure: Requested node configuration is not available"
    assert reason("too_much_memory") == "allocation failure: Requested node configuration is not available"
    assert reason("too_many_nodes") == "allocation failure: Node count specification invalid"


def test_scontrol_show_config_has_what_the_doctor_reads(version):
    config = parse.show_config(text(version, "scontrol_show_config.txt"))
    assert config[parse.VERSION_KEY].startswith(version + ".")
    assert config["PreemptType"] == "preempt/partition_prio" and config["PreemptMode"] == "REQUEUE"
    assert config["SlurmctldParameters"] == "preempt_send_user_signal" and config["AuthInfo"] == "cred_expire=10"
    assert config["JobContainerType"] == "job_container/tmpfs" and config["JobRequeue"] == "1"
    assert (config["SlurmdTimeout"], config["KillWait"], config["MinJobAge"]) == ("10 sec", "10 sec", "300 sec")
    assert config["AccountingStorageType"] == "accounting_storage/slurmdbd" and config["GresTypes"] == "gpu"
    assert config["PriorityType"] == "priority/basic"  # 24.11's default is multifactor: the dev cluster sets it
    # TaskPlugin=task/none is taken by both; 24.11 shows it as no plugin
    assert config["TaskPlugin"] == {"22.05": "task/none", "24.11": "(null)"}[version]
    # new in 24.11: a cap on automatic requeues (22.05 has the same cap, 5, compiled in)
    assert config.get("MaxBatchRequeue") == {"22.05": None, "24.11": "5"}[version]


def test_partitions_nodes_and_queue(version):
    parts = parse.show_partitions(text(version, "scontrol_show_partition.txt"))
    low = parts["low"]
    assert (low["GraceTime"], low["PreemptMode"], low["PriorityTier"]) == ("20", "REQUEUE", "1")
    assert (parts["high"]["PreemptMode"], parts["high"]["PriorityTier"]) == ("OFF", "2")
    assert query.time_limit_s(low["MaxTime"]) is None
    sinfo = parse.partitions(text(version, "sinfo_partitions.txt"))
    assert sinfo["low"] == parse.Partition("low", 3, 16, True, "up") and not sinfo["high"].default
    nodes = parse.nodes(text(version, "sinfo_nodes.txt"))
    assert len(nodes) == 6 and {(n.gpu_count, n.cpus, n.state) for n in nodes} == {(8, 16, "idle")}
    assoc = parse.associations(text(version, "sacctmgr_assoc.txt"), "")
    assert (assoc.accounts, assoc.qos, assoc.default_qos) == (("root",), ("normal",), None)
    queue = parse.queue(text(version, "squeue.txt"))
    assert queue == {jobs(version)["preempted"]: "RUNNING", jobs(version)["cancelled"]: "PENDING"}
    up = sections(version, "sinfo_node_states.txt")
    assert parse.up(parse.node_states(up["all_up"])) == ["n1", "n2", "n3"]
    # n2 dead (down*); on 24.11 n1 still completing the dead node's job (comp): up all the same
    assert parse.up(parse.node_states(up["n2_dead"])) == ["n1", "n3"]
    assert ("n1 comp" in up["n2_dead"]) == (version == "24.11")


def test_the_time_limit_signal_is_sent_again_after_a_requeue(version):
    """A 2-minute job with --signal=B:USR2@100 requeues itself on the signal: the next attempt
    gets the signal again (what a run that meets many time limits needs). Due 20 s after the
    start, it came after 6-23 s: slurmctld checks for due signals every few seconds, and may
    send one early (docs/design/control-plane.md, "Agents, detection and restarts")."""
    log = text(version, "signal_rearm.txt").splitlines()
    started = {ln.split()[1]: int(ln.split()[-1]) for ln in log if " started " in ln}
    signalled = {ln.split()[1]: int(ln.split()[-1]) for ln in log if " got USR2 " in ln}
    assert set(started) == set(signalled) == {"0", "1"}
    assert all(0 <= signalled[a] - started[a] <= 60 for a in started)


#: ``scontrol show node -o`` lines as 22.05 printed them on the multi-host dev cluster (trimmed
#: of the fields between), a node alive and allocated, one whose pings were missed, one DOWN
SHOW_NODES = """\
NodeName=n2 Arch=x86_64 CoresPerSocket=1  CPUAlloc=1 NodeAddr=10.20.224.3 NodeHostName=n2 Port=5345 Version=22.05.8 State=MIXED ThreadsPerCore=1 Partitions=low,high
NodeName=n3 Arch=x86_64 CoresPerSocket=1  CPUAlloc=1 NodeAddr=10.20.224.4 NodeHostName=n3 Port=5346 Version=22.05.8 State=MIXED+NOT_RESPONDING ThreadsPerCore=1 Partitions=low,high
NodeName=n4 Arch=x86_64 CoresPerSocket=1  CPUAlloc=0 NodeAddr=10.20.224.5 NodeHostName=n4 Port=5347 Version=22.05.8 State=DOWN+NOT_RESPONDING ThreadsPerCore=1 Partitions=low,high
"""  # noqa: E501


def test_the_nodes_slurmctld_finds_gone_a_partition_from_dead_nodes(version):
    """The supervisor's question when it lost every other agent while slurmctld answers it."""
    assert parse.gone_nodes(SHOW_NODES) == ["n3", "n4"]
    assert parse.gone_nodes(SHOW_NODES.splitlines()[0]) == []
