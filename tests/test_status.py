"""status, wait and logs tell the truth on the login node (issue #25): a run's own record
(results.json and its attempts) is final where it says so, Slurm is asked only for what is
live, and a Slurm that cannot be asked is said in one line, never taken for an answer.

Run dirs are left as a real Slurm run leaves them, by the job's own writers
(:class:`~hpc_llm.rundir.record.RunRecord` for rank 0, ``update_results`` for the
supervisor's requeue, :class:`~hpc_llm.rundir.layout.RunDir` for the logs), and registered in a
ledger of the test's own (``HPC_LLM_HOME``). No Slurm cluster is needed, and a dev cluster that
happens to be up changes nothing: ``squeue``, ``scontrol`` and ``sacct`` are scripts first on
PATH (with a ``SLURM_CONF`` that exists, as on a login node) that fail the way real Slurm
fails when its controller is down. The real ``hpc-llm`` runs in a subprocess, without a TTY.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from hpc_llm.config.plan import JobPlan
from hpc_llm.results import ledger
from hpc_llm.results.status_table import COLUMNS
from hpc_llm.rundir.layout import RunDir
from hpc_llm.rundir.record import RunRecord, read_results, update_results, write_progress
from tests.conftest import PY, explain, run_cli

#: what real Slurm's clients print when slurmctld does not answer
UNREACHABLE = "slurm_load_jobs error: Unable to contact slurm controller (connect failure)"
TOTAL = 2500


def fake_slurm(folder: Path, asked: Path, scontrol: str | None = None) -> Path:
    """``squeue``, ``scontrol``, ``sacct`` that note each call in ``asked`` and fail as Slurm does
    with its controller down; ``scontrol``: what it answers instead (a controller that is up)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("squeue", "scontrol", "sacct"):
        answer = (
            f"cat <<'EOF'\n{scontrol}\nEOF\nexit 0"
            if name == "scontrol" and scontrol is not None
            else f'echo "{UNREACHABLE}" >&2\nexit 1'
        )
        script = folder / name
        script.write_text(f'#!/bin/sh\necho "{name} $*" >> "{asked}"\n{answer}\n')
        script.chmod(0o755)
    return folder


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A ledger of this test's own."""
    path = tmp_path / "hpc_llm_home"
    monkeypatch.setenv("HPC_LLM_HOME", str(path))
    return path


@pytest.fixture
def asked(tmp_path: Path) -> Path:
    """Where the fake Slurm clients note every call."""
    return tmp_path / "slurm-calls.txt"


@pytest.fixture
def env(tmp_path: Path, home: Path, asked: Path) -> dict[str, str]:
    """A login node whose Slurm controller is down (see the module's docstring)."""
    conf = tmp_path / "slurm.conf"
    conf.write_text("# this login node's Slurm config; its controller does not answer\n")
    out = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "HPC_LLM_", "HYDRA_"))}
    out.update(
        PATH=f"{fake_slurm(tmp_path / 'slurm-down', asked)}{os.pathsep}{os.environ['PATH']}",
        SLURM_CONF=str(conf),
        HPC_LLM_HOME=str(home),
        PYTHONUNBUFFERED="1",
    )
    return out


def plan(run_dir: Path) -> JobPlan:
    return JobPlan("mpt_tiny", 1, 2, 0, 1, 2, "cpu", "ddp", 3600, str(run_dir))


def trained(run_dir: Path, job_id: str, stops: list[str], *, final: bool = True) -> Path:
    """A run as Slurm and the job leave it: one attempt per allocation of job ``job_id``, each
    stopped by a cause of ``stops`` and requeued by the supervisor; then (``final``) a last
    attempt that completes. Rank 0's progress file and the ranks' logs are there too."""
    step = TOTAL // (len(stops) + 1)
    for restart, cause in enumerate(stops):
        record = RunRecord.open(
            run_dir, plan(run_dir), {}, job_id=job_id, restart=restart, started_at=time.time(), nodes=["n1"]
        )
        record.note(resumed_at_batch=restart * step)
        record.stopped({}, batch=(restart + 1) * step, cause=cause)
        update_results(run_dir, record.attempts, "requeued", {"error": None})
    if final:
        record = RunRecord.open(
            run_dir, plan(run_dir), {}, job_id=job_id, restart=len(stops), started_at=time.time(), nodes=["n1"]
        )
        record.note(resumed_at_batch=len(stops) * step)
        record.completed({"train_loss": 2.5}, batch=TOTAL)
    batch = TOTAL if final else len(stops) * step
    progress = {"phase": "train", "batch": batch, "total_batches": TOTAL, "loss": 2.5, "time": time.time()}
    write_progress(run_dir, progress)
    rd = RunDir(run_dir)
    rd.logs.mkdir(parents=True, exist_ok=True)
    for rank in range(2):
        rd.rank_log(rank).write_text(f"rank{rank} of job {job_id}: batch {batch}\n")
    rd.batch_log(job_id).write_text(f"supervisor of job {job_id}\n")
    return run_dir


def register(run_dir: Path, job_id: str, state: str) -> ledger.Run:
    """The ledger entry a Slurm submission made, then left at ``state`` (what it last saw)."""
    run = ledger.record(
        str(run_dir), str(run_dir.parent), int(run_dir.name), "mpt_tiny", "slurm", [], [job_id], "SUBMITTED"
    )
    return ledger.update(run, state=state) if state != "SUBMITTED" else run


def cells(stdout: str, job_id: str) -> dict[str, str]:
    """The status table's row of a job, by column."""
    [line] = [ln for ln in stdout.splitlines() if f" {job_id} " in ln]
    values = [c.strip() for c in re.split(r"[│|┃]", line)[1:-1]]
    return dict(zip(COLUMNS, values, strict=True))


def test_status_shows_the_records_state_and_restarts_and_says_slurm_is_unreachable(tmp_path, env, asked):
    """The user's `hpc-llm status 52`: RUNNING, 0 restarts over a completed record with two
    time-limit restarts; and a run COMPLETED with 0 restarts whose record had 5."""
    sweep = tmp_path / "runs" / "mpt_tiny" / "sweep"
    stale = register(trained(sweep / "0", "4052", ["time_limit", "time_limit"]), "4052", "RUNNING")
    early = register(trained(sweep / "1", "4053", ["preemption"] * 5), "4053", "COMPLETED")
    assert read_results(stale.run_dir)["restarts"] == 2 and read_results(early.run_dir)["restarts"] == 5

    shown = run_cli(["status", str(stale.id)], env, timeout=60)
    assert shown.returncode == 0, explain(shown)
    lines = shown.stdout.splitlines()
    assert lines[0] == (
        f"Slurm unreachable; last seen never (squeue: {UNREACHABLE}): "
        "final states and restarts are the runs' own records, live ones as last seen"
    ), explain(shown)
    assert f"run {stale.id}: COMPLETED, 2 restart(s) (time_limit 2), job(s) 4052" in lines, explain(shown)
    assert "RUNNING" not in shown.stdout, explain(shown)
    assert "squeue" in asked.read_text()  # Slurm was asked, and its failure is what was said
    # the attempts the run recorded (sacct was not asked again after squeue failed)
    table = shown.stdout[shown.stdout.index("attempts of run") :]
    assert [c for c in ("time_limit", "completed") if c in table] == ["time_limit", "completed"]
    assert "sacct" not in asked.read_text()

    every = run_cli(["status", "--all"], env, timeout=60)
    assert every.returncode == 0, explain(every)
    assert cells(every.stdout, "4052")["state"] == "COMPLETED" and cells(every.stdout, "4052")["restarts"] == "2"
    assert cells(every.stdout, "4053")["state"] == "COMPLETED" and cells(every.stdout, "4053")["restarts"] == "5"
    # the record's final word is in the ledger now: nothing is live, Slurm need not be asked
    assert "Slurm unreachable" not in every.stdout, explain(every)
    assert {(r.state, r.restarts) for r in ledger.runs()} == {("COMPLETED", 2), ("COMPLETED", 5)}


def test_a_live_run_without_slurm_stays_as_last_seen_and_says_when_that_was(tmp_path, env, asked):
    """A record still in flight (requeued) is not final: once Slurm stops answering, the state
    Slurm last gave stands, with the record's restarts, under a line saying when that was."""
    in_flight = trained(tmp_path / "runs" / "x" / "0", "4060", ["time_limit", "time_limit"], final=False)
    assert read_results(in_flight)["status"] == "requeued" and read_results(in_flight)["restarts"] == 1
    run = register(in_flight, "4060", "SUBMITTED")
    # earlier, the controller answered (a stand-in squeue that knows the job)
    up = tmp_path / "slurm-up"
    up.mkdir()
    (up / "squeue").write_text('#!/bin/sh\necho "4060|PENDING"\n')
    (up / "squeue").chmod(0o755)
    before = time.time()
    answered = run_cli(["status", "--all"], dict(env, PATH=f"{up}{os.pathsep}{env['PATH']}"), timeout=60)
    after = time.time()
    assert answered.returncode == 0 and "Slurm unreachable" not in answered.stdout, explain(answered)
    assert cells(answered.stdout, "4060")["state"] == "PENDING", explain(answered)

    shown = run_cli(["status", "--all"], env, timeout=60)
    assert shown.returncode == 0, explain(shown)
    seen = {time.strftime("%Y-%m-%d %H:%M", time.localtime(t)) for t in (before, after)}
    first = shown.stdout.splitlines()[0]
    assert any(first.startswith(f"Slurm unreachable; last seen {t} (squeue: {UNREACHABLE})") for t in seen), first
    row = cells(shown.stdout, "4060")
    assert row["state"] == "PENDING" and row["restarts"] == "1", explain(shown)
    assert ledger.find(str(run.id)).state == "PENDING"


def test_wait_ends_on_a_final_record_without_slurm_and_prints_without_a_tty(tmp_path, env):
    """`hpc-llm wait` once looped `... batch 2500/2500 ... SUBMITTED` forever (and printed
    nothing without a TTY) although results.json was final."""
    run = register(trained(tmp_path / "runs" / "x" / "0", "4047", ["time_limit", "time_limit"]), "4047", "SUBMITTED")
    start = time.monotonic()
    proc = run_cli(["wait", run.run_dir, "--poll", "0.2"], env, timeout=60)
    assert proc.returncode == 0, explain(proc)
    assert time.monotonic() - start < 30, "wait took its time over a run that had ended"
    assert proc.stdout.strip().splitlines()[-1] == f"{run.run_dir}: 1 COMPLETED", explain(proc)
    [line] = [ln for ln in proc.stderr.splitlines() if f"run {run.id} " in ln]
    assert f"batch {TOTAL}/{TOTAL}" in line and "COMPLETED, 2 restart(s)" in line, explain(proc)
    assert "SUBMITTED" not in proc.stderr


def test_wait_on_records_alone_says_so_once_and_ends_when_they_are_final(tmp_path, env):
    """No Slurm and a run still in flight: wait says in one line it can only wait on the record,
    prints its progress without a TTY, and ends once the record is final."""
    run_dir = trained(tmp_path / "runs" / "x" / "0", "4048", ["time_limit", "time_limit"], final=False)
    run = register(run_dir, "4048", "RUNNING")
    err = tmp_path / "wait.err"
    with err.open("w") as stderr:
        proc = subprocess.Popen(
            [PY, "-c", "from hpc_llm.cli import main; main()", "wait", str(run.id), "--poll", "0.2"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
        )
        try:
            deadline = time.monotonic() + 60
            while "Slurm unreachable" not in err.read_text():
                assert proc.poll() is None, f"wait ended on a record still in flight: {err.read_text()}"
                assert time.monotonic() < deadline, f"wait never said Slurm was unreachable: {err.read_text()}"
                time.sleep(0.1)
            time.sleep(1.0)  # a few more polls: still waiting
            assert proc.poll() is None, err.read_text()
            # the requeued job starts again and completes
            record = RunRecord.open(run_dir, plan(run_dir), {}, job_id="4048", restart=2, started_at=time.time())
            record.completed({"train_loss": 2.4}, batch=TOTAL)
            out, _ = proc.communicate(timeout=60)
        finally:
            proc.kill()
    said = err.read_text()
    assert proc.returncode == 0 and out.strip() == f"{run.id}: 1 COMPLETED", said
    [line] = [ln for ln in said.splitlines() if "Slurm unreachable" in ln]
    assert line.startswith("Slurm unreachable; last seen never") and "waiting on the runs' own records" in line
    assert f"run {run.id} " in said and "RUNNING, 1 restart(s)" in said and "COMPLETED, 2 restart(s)" in said


def test_logs_of_a_run_dir_the_ledger_never_saw(tmp_path, env):
    run_dir = trained(tmp_path / "elsewhere" / "0", "4070", [])
    assert ledger.runs() == []
    for rank in (0, 1):
        proc = run_cli(["logs", str(run_dir), "--rank", str(rank)], env, timeout=60)
        assert proc.returncode == 0, explain(proc)
        assert proc.stdout == RunDir(run_dir).rank_log(rank).read_text()
    missing = run_cli(["logs", str(run_dir), "--rank", "5"], env, timeout=60)
    assert missing.returncode == 1 and str(RunDir(run_dir).rank_log(5)) in missing.stderr, explain(missing)


def test_logs_follow_of_a_finished_run_ends_without_slurm(tmp_path, env):
    """`logs -f` follows until the run is over: its record is final, so it is, with or without
    Slurm (the ledger still says RUNNING)."""
    run = register(trained(tmp_path / "runs" / "x" / "0", "4073", ["time_limit"]), "4073", "RUNNING")
    proc = run_cli(["logs", "4073", "-f"], env, timeout=60)
    assert proc.returncode == 0, explain(proc)
    assert proc.stdout == RunDir(run.run_dir).rank_log(0).read_text()


def test_logs_of_a_job_id_the_ledger_never_saw_without_slurm_is_one_line(tmp_path, env):
    proc = run_cli(["logs", "4071"], env, timeout=60)
    assert proc.returncode == 2, explain(proc)
    [line] = proc.stderr.strip().splitlines()
    assert line.startswith("hpc_llm: error: job 4071 is not in the ledger") and UNREACHABLE in line, line
    assert line.endswith("give its run dir instead: hpc-llm logs <run dir>"), line


def show_job(job_id: str, std_out: Path, work_dir: Path, array: tuple[str, str] | None = None) -> str:
    """What `scontrol show job` prints of a job (Slurm 22.05, abridged)."""
    task = f"ArrayJobId={array[0]} ArrayTaskId={array[1]} ArrayTaskThrottle=2\n   " if array else ""
    return (
        f"JobId={job_id} JobName=hpc_llm-mpt_tiny\n"
        f"   {task}UserId=me(1000) GroupId=me(1000) MCS_label=N/A\n"
        "   JobState=COMPLETED Reason=None Dependency=(null)\n"
        "   Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0\n"
        f"   Command=(null)\n   WorkDir={work_dir}\n   StdErr={std_out}\n   StdIn=/dev/null\n   StdOut={std_out}\n"
    )


@pytest.mark.parametrize("array", [False, True], ids=["job", "array task"])
def test_logs_of_a_job_id_slurm_knows_and_the_ledger_never_saw(tmp_path, env, asked, array):
    """scontrol (a stand-in here, answering as a controller that is up) says where the job's
    batch log is: a single job's lies in its run dir, an array task's in its sweep dir."""
    sweep = tmp_path / "runs with spaces" / "sweep"
    if array:
        trained(sweep / "0", "7000_0", [])
        run_dir = trained(sweep / "1", "7000_1", [])
        answer = show_job("7002", RunDir(sweep).array_logs / "slurm-7000_1.out", tmp_path, ("7000", "1"))
        job = "7002"
    else:
        run_dir = trained(sweep / "0", "4072", [])
        answer = show_job("4072", RunDir(run_dir).batch_log("4072"), tmp_path)
        job = "4072"
    up = dict(env, PATH=f"{fake_slurm(tmp_path / 'slurm-up', asked, scontrol=answer)}{os.pathsep}{env['PATH']}")
    proc = run_cli(["logs", job], up, timeout=60)
    assert proc.returncode == 0, explain(proc)
    assert proc.stdout == RunDir(run_dir).rank_log(0).read_text()
    assert f"scontrol show job {job}" in asked.read_text()


def test_a_failed_record_is_not_final_while_slurm_holds_the_job_and_a_held_job_shows_as_held(tmp_path, env, asked):
    """The fabric issue's case: the batch host's supervisor, cut off, wrote "failed" while Slurm
    requeued the job, and the job then sat held (PENDING, launch_failed_requeued_held). `hpc-llm
    status` shows what Slurm holds, HELD with Slurm's reason, never FAILED; once the job runs
    again it shows RUNNING; and once it left the queue without completing, the record's word."""
    run_dir = tmp_path / "runs" / "mpt_tiny" / "sweep" / "0"
    trained(run_dir, "4061", ["time_limit"], final=False)
    record = RunRecord.open(run_dir, plan(run_dir), {}, job_id="4061", restart=1, started_at=time.time())
    record.failed("scontrol requeue 4061 failed: Unable to contact slurm controller", {}, batch=1250)
    assert read_results(run_dir)["status"] == "failed"
    run = register(run_dir, "4061", "RUNNING")
    squeue = tmp_path / "slurm-down" / "squeue"  # this controller answers squeue now
    answer = tmp_path / "squeue-answer"
    squeue.write_text(f'#!/bin/sh\necho "squeue $*" >> "{asked}"\ncat "{answer}"\n')

    answer.write_text("4061|PENDING|launch_failed_requeued_held\n")
    shown = run_cli(["status", str(run.id)], env, timeout=60)
    assert shown.returncode == 0, explain(shown)
    assert f"run {run.id}: HELD" in shown.stdout and "launch_failed_requeued_held" in shown.stdout, explain(shown)
    assert "FAILED" not in shown.stdout and "scontrol release 4061" in shown.stdout, explain(shown)
    assert "-o %i|%T|%r" in asked.read_text()

    answer.write_text("4061|RUNNING|None\n")
    shown = run_cli(["status", str(run.id)], env, timeout=60)
    assert f"run {run.id}: RUNNING" in shown.stdout and "FAILED" not in shown.stdout, explain(shown)

    answer.write_text("")  # left the queue, its accounting down: the record's "failed" is the word
    shown = run_cli(["status", str(run.id)], env, timeout=60)
    assert f"run {run.id}: FAILED" in shown.stdout, explain(shown)


def test_the_last_line_of_a_failed_run_names_what_ended_it_not_its_first_attempt(tmp_path):
    """A run that failed after several attempts: the first died of one error, the last of a full
    disk; the run's record names the last. The submit's last line (hydra.launcher.wait=true)
    says what the record says, with the last attempt's rank and node."""
    import json

    from hpc_llm.results.failure import final_failure, first_failure

    run_dir = tmp_path / "run"
    rd = RunDir(run_dir)
    rd.failure_reports.mkdir(parents=True)
    first = {"rank": 0, "node": "n1", "type": "RuntimeError", "message": "[enforce fail at inline_container.cc:659]"}
    full = {"rank": 1, "node": "n2", "type": "OSError", "message": "[Errno 28] No space left on device"}
    rd.failure_report("7.0.0", 0).write_text(json.dumps({**first, "batch": 10, "time": 100.0}))
    rd.failure_report("7.1.0", 1).write_text(json.dumps({**full, "batch": 20, "time": 200.0}))
    rd.failure_report("7.1.0", 0).write_text(json.dumps({**first, "node": "n1", "batch": 20, "time": 201.0}))
    assert first_failure(run_dir).error.startswith("RuntimeError")  # what the launcher used to print
    assert (final_failure(run_dir).error, final_failure(run_dir).where()) == (
        "OSError: [Errno 28] No space left on device",
        " (rank 1 on n2)",
    )
    record = RunRecord.open(run_dir, plan(run_dir), {}, job_id="7", restart=2, started_at=time.time())
    verdict = "fault.max_failures=1 reached; last stop: OSError: [Errno 28] No space left on device (rank 1 on n2)"
    record.failed(verdict, {}, batch=20)
    said = final_failure(run_dir)
    assert said.error == verdict and said.node == "n2"
