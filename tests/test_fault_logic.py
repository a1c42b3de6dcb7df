"""The supervisor's decisions without a cluster: classification, hang watching, budgets, goodput.

The end-to-end behaviour (real Slurm, real training, real kills) is in
tests/test_faults.py; these pin the arithmetic and the rules.
"""

from __future__ import annotations

import os
import time

import pytest

from hpc_llm import world
from hpc_llm.job import failures, heartbeat, messages
from hpc_llm.job.failures import RankExit
from hpc_llm.job.supervisor import hang_watch, main
from hpc_llm.job.supervisor.classify import classify_failure
from hpc_llm.job.supervisor.options import Policy
from hpc_llm.job.supervisor.stop import Stop
from hpc_llm.job.supervisor.watch import GenerationRun
from hpc_llm.rundir.record import Attempt, Attempts
from hpc_llm.slurm import parse


def failure(rank=0, type_="RuntimeError", message="boom", batch=7, node="n1", t=None):
    return failures.RankFailure(rank, node, type_, message, batch, t or time.time())


def in_process(tmp_path, monkeypatch, *, nodes=1, per_node=1, env=None, **policy_kw):
    """A Supervisor in this process (so a test can patch what it asks Slurm) over real agents
    off Slurm (tests/local_srun.py), whose forked ranks train until the stop signal
    (tests/agent_tasks.py: they exit 0 on it after a save); ``env``: more of its environment."""
    from tests import agent_tasks
    from tests.test_agents import agents_command, agents_env, payload

    for k in [k for k in os.environ if k.startswith(("SLURM_", "HPC_LLM_"))]:
        monkeypatch.delenv(k)
    run_dir, out = tmp_path / "run", tmp_path / "out"
    out.mkdir()
    logs = run_dir / "logs"
    job = payload(
        run_dir, agent_tasks.train, tmp_path / "conf", nodes=nodes, out=str(out), batches=100000, batch_s=0.05
    )
    logs.mkdir(parents=True, exist_ok=True)
    for k, v in {**agents_env(logs), **(env or {})}.items():
        monkeypatch.setenv(k, v)
    policy = Policy(
        run_dir=run_dir,
        nodes=nodes,
        tasks_per_node=per_node,
        heartbeat_s=0.2,
        node_timeout_s=1,
        probe_timeout_s=0.5,
        hang_floor_s=5,
        **policy_kw,
    )
    return main.Supervisor(policy, agents_command(job, nodes))


def generation_signalled(sup, after_s=1.5):
    """One generation with Slurm's stop signal (USR2) arriving ``after_s`` in; the supervisor's
    handlers are put back as they were afterwards, and its agents ended."""
    import signal as sig
    import threading

    saved = {s: sig.getsignal(s) for s in (sig.SIGUSR2, sig.SIGTERM)}  # the supervisor takes these over
    sup._install_handlers()
    threading.Timer(after_s, lambda: sig.raise_signal(sig.SIGUSR2)).start()
    try:
        return GenerationRun(sup).run()
    finally:
        for s, handler in saved.items():
            sig.signal(s, handler)
        sup.agents.close()


def one_generation(sup):
    try:
        return GenerationRun(sup).run()
    finally:
        sup.agents.close()


#: rank 1 on n2 killed by the OOM killer; the supervisor then killed rank 0 on n1 (a bystander)
KILLED = (
    RankExit(1, "n2", -9, "killed by SIGKILL", killed=False, at=1.0),
    RankExit(0, "n1", -9, "killed by SIGKILL", killed=True, at=2.0),
)


def test_a_rank_killed_by_a_signal_or_lost_with_its_node_wrote_no_report():
    assert KILLED[0].by_signal and RankExit(0, "n1", None, "lost with the node").by_signal
    assert not RankExit(0, "n1", 1, "exited with 1").by_signal
    assert str(KILLED[0]) == "rank 1 on n2: killed by SIGKILL"


def classify(fs, exits=(), nodes=(), resumed_at_batch=0, earlier=()):
    stop = Stop(returncode=1, now=time.time(), failures=tuple(fs), rank_exits=tuple(exits), failed_nodes=tuple(nodes))
    current = Attempt("1", 0, 0.0, resumed_at_batch=resumed_at_batch)
    return classify_failure(stop, current, list(earlier))


def test_a_killed_rank_is_an_infrastructure_failure_blaming_its_node():
    # the survivors saw their peer vanish: gloo/NCCL errors, not a user error, and not their node
    peers = [failure(rank=0, message="[../gloo/transport/tcp/pair.cc:534] Connection closed by peer", node="n1")]
    cause, reason, node = classify(peers, KILLED)
    assert (cause, node) == ("failure", "n2")
    assert "rank 1 on n2: killed by SIGKILL" in reason


@pytest.mark.parametrize(
    "message",
    [
        "NCCL error in: ProcessGroupNCCL.cpp:1553, unhandled system error",
        "[/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 30000ms for recv",
    ],
)
def test_nccl_and_collective_timeouts_are_the_machines_fault(message):
    f = failure(type_="DistBackendError", message=message)
    assert f.infrastructure
    cause, _reason, node = classify([f])
    assert cause == "failure" and node == "n1"


@pytest.mark.parametrize(
    "message",
    [
        "Gloo connectFullMesh failed with [/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:144] no error",
        "Gloo connectFullMesh failed with [/pytorch/third_party/gloo/gloo/transport/tcp/pair.h:301] Connect timeout",
        "[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:525] Read error [127.0.0.1]:33668: EOF",
    ],
)
def test_gloo_transport_errors_before_the_first_batch_are_the_machines_fault(message):
    """torch raises gloo's transport errors as RuntimeError, at the rendezvous before any batch:
    not the user's code (seen on the dev cluster: a run failed for good as a "user error")."""
    f = failure(type_="RuntimeError", message=message, batch=-1)
    assert f.infrastructure
    cause, _reason, node = classify([f])
    assert cause == "failure" and node == "n1"


def test_an_exception_before_the_first_batch_is_a_user_error():
    cause, reason, _ = classify([failure(type_="KeyError", message="'optimizer'", batch=-1)])
    assert cause == "user_error" and "before the first batch" in reason and "KeyError" in reason
    # after a resume from batch 40, failing before training one more batch is the same thing
    assert classify([failure(batch=40)], resumed_at_batch=40)[0] == "user_error"


def test_the_same_exception_at_the_same_batch_twice_is_a_user_error():
    cause, reason, _ = classify([failure(batch=7)])
    assert cause == "failure" and "retrying once" in reason
    cause, reason, _ = classify([failure(batch=7)], resumed_at_batch=5, earlier=[failure(batch=7)])
    assert cause == "user_error" and "during batch 8 again" in reason
    assert classify([failure(batch=9)], resumed_at_batch=5, earlier=[failure(batch=7, node="n2")])[0] == "failure"


def test_a_node_failure_reported_by_slurm_blames_that_node():
    nodes = failures.failed_nodes(["srun: error: Node failure on n3"])
    cause, _reason, node = classify([], (), nodes)
    assert (cause, node) == ("node_failure", "n3")


def test_failure_reports_round_trip(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "12")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    monkeypatch.setenv("HPC_LLM_GENERATION", "2")
    try:
        raise ValueError("bad\nvalue")
    except ValueError as exc:
        failures.report(tmp_path, exc, rank=3, node="n2", batch=11)
    [f] = failures.read(tmp_path, "12.1.2")
    assert (f.rank, f.node, f.type, f.message, f.batch) == (3, "n2", "ValueError", "bad value", 11)
    assert "ValueError" in f.traceback
    assert failures.read(tmp_path, "12.1.3") == []


def beat(rank, seq, batch, node="n1", phase="train"):
    return heartbeat.Beat(rank, seq, batch, node, 100 + rank, phase)


def watch(**kw):
    return hang_watch.HangWatch(**{"floor_s": 5.0, "factor": 10.0, "timeout_s": 600.0, "silence_s": 20.0, **kw})


def test_hang_watch_names_a_silent_rank():
    w = watch()
    t = 1000.0
    assert w.check({0: beat(0, 1, 5), 1: beat(1, 1, 5, node="n2")}, t) is None
    for i in range(2, 8):  # rank 0 keeps beating and training, rank 1 is frozen
        t += 5
        hang = w.check({0: beat(0, i, 5 + i), 1: beat(1, 1, 5, node="n2")}, t)
    assert hang is not None and hang.cause == "hang"
    assert hang.nodes == ("n2",) and "rank(s) 1 on n2 silent for more than 20s" in hang.reason


def test_a_stall_is_a_hang_after_k_times_the_run_s_median_step_and_never_before_the_floor():
    """The limit is the run's own pace: 10 x the median step (1 s a batch: 10 s), never less than
    the floor; before three steps are measured, the timeout (no pace to judge by yet)."""
    w = watch(floor_s=5.0)
    t = 1000.0
    for b in range(1, 8):  # a batch a second, every rank alive and training
        t += 1.0
        assert w.check({0: beat(0, b, b), 1: beat(1, b, b)}, t) is None
    assert w.median_step_s == pytest.approx(1.0) and w.train_limit_s() == pytest.approx(10.0)
    stuck_since = t
    for i in range(8, 40):  # alive (seq moves), stuck at batch 7
        t += 1.0
        hang = w.check({0: beat(0, i, 7), 1: beat(1, i, 7)}, t)
        if hang:
            break
    assert hang is not None and hang.cause == "hang" and hang.nodes == ()
    assert "no batch trained for more than 10s (10 x the median step of 1.00s)" in hang.reason
    assert 10 < t - stuck_since <= 11
    fast = watch(floor_s=5.0)  # a 0.1 s step: 10 x is 1 s, the floor says 5
    for b in range(1, 8):
        fast.check({0: beat(0, b, b)}, 1000 + b * 0.1)
    assert fast.train_limit_s() == 5.0
    first = watch()  # no pace yet (the first batch of a start): the timeout
    first.check({0: beat(0, 1, 0)}, 1000)
    assert first.train_limit_s() == 600.0 and first.check({0: beat(0, 2, 0)}, 1500) is None


def test_no_batch_is_due_outside_training_and_a_storage_stall_blames_nobody():
    w = watch()
    t = 1000.0
    for b in range(1, 8):
        t += 1.0
        w.check({0: beat(0, b, b)}, t)
    # a save that took 3 s: the longest seen; the next may take 10 x that before it is a stall
    for i in range(3):
        t += 1.0
        assert w.check({0: beat(0, 10 + i, 7, phase="save")}, t) is None
    t += 1.0
    w.check({0: beat(0, 20, 8)}, t)
    assert w.phase_limit_s("save") == pytest.approx(30.0)
    for i in range(40):
        t += 1.0
        stall = w.check({0: beat(0, 30 + i, 8, phase="save")}, t)
        if stall:
            break
    assert stall is not None and stall.cause == "storage" and stall.nodes == ()
    assert "checkpoint save for 3" in stall.reason and "no node is blamed" in stall.reason
    assert 30 < t - 1011 <= 32
    post = watch()
    for i in range(1, 10):  # after training (HF export, inference): no batch is due
        assert post.check({0: beat(0, i, 40, phase="post"), 1: beat(1, i, 40, phase="post")}, 1000 + 60 * i) is None


def test_goodput_counts_kept_training_over_allocated_node_time(tmp_path):
    a1 = Attempt(
        "1",
        0,
        started_at=10.0,
        alloc_started_at=0.0,
        nodes=["n1", "n2"],
        resumed_at_batch=0,
        last_batch=100,
        train_s=50.0,
        state="stopped",
        ended_at=60.0,
        cause="time_limit",
    )
    a2 = Attempt(
        "1",
        1,
        started_at=100.0,
        alloc_started_at=90.0,
        nodes=["n1", "n2"],
        resumed_at_batch=80,
        last_batch=200,
        train_s=60.0,
        state="completed",
        ended_at=170.0,
        cause="completed",
    )
    s = Attempts(tmp_path / "a.json", [a1, a2]).summary()
    # attempt 1 trained 100 batches in 50 s, 20 of them recomputed: 40 s kept; attempt 2 kept all 60 s
    assert s["productive_node_s"] == pytest.approx((40 + 60) * 2)
    assert s["allocated_node_s"] == pytest.approx((60 - 0) * 2 + (170 - 90) * 2)
    assert s["goodput"] == pytest.approx(200 / 280, abs=1e-4)
    assert s["batches_recomputed"] == {"time_limit": 20} and s["batches_lost"] == 20
    assert s["restarts"] == 1 and s["restarts_by_cause"] == {"time_limit": 1}
    assert [a["queue_wait_s"] for a in s["attempts"]] == [0.0, 30.0]
    assert s["total_wallclock_s"] == 170.0


def test_a_node_given_back_after_a_swap_is_paid_for_only_until_then(tmp_path):
    """2 training nodes and a spare (3 allocated): at 40 s n2 is swapped out and given back; the
    job then holds 2 nodes to its end at 100 s. Allocated: 3 x 40 + 2 x 60, not 3 x 100; the
    spare is held for the first 40 s only; the 60 node-seconds saved are in results.json."""
    from hpc_llm.rundir.record import Attempt, Attempts

    first = Attempt("7", 0, started_at=0.0, alloc_started_at=0.0, nodes=["n1", "n2"], alloc_nodes=3)
    first.state, first.ended_at, first.decided_at, first.cause = "stopped", 39.0, 40.0, "straggler"
    first.left_out, first.given_back = ["n2"], ["n2"]
    second = Attempt("7", 0, started_at=41.0, alloc_started_at=0.0, generation=1, nodes=["n1", "n3"])
    second.state, second.ended_at, second.cause = "completed", 100.0, "completed"
    s = Attempts(tmp_path / "a.json", [first, second]).summary()
    assert s["given_back_node_s"] == pytest.approx(60.0) and s["given_back_nodes"] == ["n2"]
    assert s["allocated_node_s"] == pytest.approx(3 * 40 + 2 * 60)
    assert s["spare_node_s"] == pytest.approx(40.0)


def test_an_attempt_that_only_ran_the_post_train_stage_keeps_the_runs_loss(tmp_path):
    """Stopped after its last batch (a time limit at batch 220 of 220), the run's next attempt
    resumes at max_duration, trains nothing and completes: results.json keeps the loss, the
    throughput and the history of the attempts that trained (it said train_loss: null)."""
    from hpc_llm.config.plan import JobPlan
    from hpc_llm.rundir.record import RunRecord, read_results

    plan = JobPlan("mpt_tiny", 1, 1, 0, 1, 1, "cpu", "ddp", 3600, str(tmp_path))
    first = RunRecord.open(tmp_path, plan, {}, job_id="7", restart=0, started_at=time.time())
    history = [[b, 10.0 - b / 100] for b in range(1, 221)]
    first.stopped({"train_loss": history[-1][1], "train_loss_history": history}, batch=220, cause="time_limit")
    done = RunRecord.open(tmp_path, plan, {}, job_id="7", restart=1, started_at=time.time())
    done.note(resumed_at_batch=220)
    r = done.completed({"batches_done": 220, "tokens_per_sec": None, "eval": {"loss": 1.0}}, batch=220)
    assert r["train_loss"] == pytest.approx(7.8) and r["train_loss_first"] == pytest.approx(9.99)
    assert len(r["train_loss_history"]) == 220 and read_results(tmp_path)["train_loss"] == pytest.approx(7.8)


def test_the_loss_history_spans_attempts_and_replayed_batches_replace_the_lost_ones(tmp_path):
    from hpc_llm.config.plan import JobPlan
    from hpc_llm.rundir.record import RunRecord

    plan = JobPlan("mpt_tiny", 1, 1, 0, 1, 1, "cpu", "ddp", 3600, str(tmp_path))
    first = RunRecord.open(tmp_path, plan, {}, job_id="7", restart=0, started_at=time.time())
    first.failed("boom", {"train_loss_history": [[b, 1.0] for b in range(1, 38)]}, batch=37, status="interrupted")
    again = RunRecord.open(tmp_path, plan, {}, job_id="7", restart=0, started_at=time.time(), generation=1)
    again.note(resumed_at_batch=30)  # the checkpoint at 30: batches 31-37 are trained again
    r = again.completed({"train_loss_history": [[b, 2.0] for b in range(31, 61)]}, batch=60)
    assert [b for b, _ in r["train_loss_history"]] == list(range(1, 61))
    assert {v for b, v in r["train_loss_history"] if b > 30} == {2.0} and r["train_loss"] == 2.0


def test_only_usr2_is_a_stop_signal():
    from hpc_llm.errors import ConfigError
    from hpc_llm.launch.sbatch.spec import stop_signal

    assert stop_signal("SIGUSR2") == "USR2"
    for name, why in (
        ("USR1", "NCCL uses SIGUSR1"),
        ("TERM", "srun answers SIGTERM by killing the step"),
        ("INT", "only prints a status"),
        ("USR9", "would not pass it"),
    ):
        with pytest.raises(ConfigError, match=why) as err:
            stop_signal(name)
        assert "allowed: USR2" in str(err.value)


def test_the_supervisor_forwards_the_stop_signal_it_received(tmp_path, monkeypatch):
    """One generation of real forked ranks: the signal is recorded by name and reaches every rank
    through its agent; they save and exit 0."""
    sup = in_process(tmp_path, monkeypatch, nodes=2, per_node=2, stop_signal="USR2", signal_lead_s=60, recover=False)
    end = generation_signalled(sup)
    assert end.stop == "SIGUSR2" and end.returncode == 0 and end.rank_exits == []
    assert sorted(p.name for p in (tmp_path / "out").glob("stopped.*")) == [f"stopped.g0.r{r}" for r in range(4)]


def test_the_supervisor_stops_the_ranks_at_the_lead_when_slurms_signal_never_comes(tmp_path, monkeypatch):
    """slurmctld may send the --signal warning before the batch step exists (it checks every
    30 s, up to that much early), and then it is lost: at the stop lead the supervisor stops the
    ranks itself, as for the time-limit signal. Real forked ranks, no signal sent."""
    sup = in_process(tmp_path, monkeypatch, stop_signal="USR2", signal_lead_s=30, stop_lead_s=10)
    sup.timing.lead_s = 10
    sup.timing.end = time.time() + 14  # the time limit in 14 s: the lead is reached in 4
    started = time.monotonic()
    end = one_generation(sup)
    assert end.stop == "SIGUSR2" and end.stop_cause == "time_limit" and end.returncode == 0
    assert 3.5 < time.monotonic() - started < 12
    # and not while more than the lead is left
    sup.timing.end = time.time() + 3600
    assert not sup.timing.time_is_up()


@pytest.mark.stack  # Composer, in this process
def test_a_save_the_attempt_did_not_finish_is_set_aside_and_composer_resumes_beside_the_rest(tmp_path):
    """The dev cluster's node death left ep0-ba25 written and ``latest`` still on ba20: the
    resumed run (from ba20) died in Composer's own check. The newer save is moved, not lost."""
    from composer.core import Timestamp
    from composer.utils.file_helpers import ensure_folder_has_no_conflicting_files

    from hpc_llm.builtin.checkpoint import set_aside_unfinished

    folder = tmp_path / "checkpoints"
    folder.mkdir()
    for b in (5, 10, 15, 20, 25):
        (folder / f"ep0-ba{b}-rank0.pt").write_bytes(b"x" * b)
    (folder / "latest-rank0.pt").symlink_to("ep0-ba20-rank0.pt")
    resumed = Timestamp(epoch=0, batch=20)
    template = "ep{epoch}-ba{batch}-rank{rank}.pt"
    with pytest.raises(FileExistsError, match="may conflict with a future checkpoint"):
        ensure_folder_has_no_conflicting_files(str(folder), template, resumed)
    moved = set_aside_unfinished(folder)
    assert [p.relative_to(folder).as_posix() for p in moved] == ["unfinished/ep0-ba25-rank0.pt"]
    assert moved[0].read_bytes() == b"x" * 25
    ensure_folder_has_no_conflicting_files(str(folder), template, resumed)  # no longer raises
    assert set_aside_unfinished(folder) == []  # every rank calls it: the second finds nothing
    # a sharded save (a folder per checkpoint) with no finished one at all: all of it is set aside
    sharded = tmp_path / "sharded"
    (sharded / "ep0-ba10").mkdir(parents=True)
    (sharded / "ep0-ba10" / "__0_0.distcp").write_bytes(b"s")
    assert [p.name for p in set_aside_unfinished(sharded)] == ["ep0-ba10"]
    assert (sharded / "unfinished" / "ep0-ba10" / "__0_0.distcp").is_file()


def _save(path, batch, complete=True):
    """A checkpoint file as torch.save writes it (a zip); a cut-off one lacks the zip's end record."""
    import io
    import zipfile

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("archive/data.pkl", b"x" * 100 + str(batch).encode())
    data = buf.getvalue()
    path.write_bytes(data if complete else data[: len(data) // 2])


def test_keep_last_k_holds_over_the_runs_life_and_unfinished_keeps_its_newest(tmp_path):
    from hpc_llm.builtin.checkpoint import prune, set_aside_unfinished

    folder = tmp_path / "checkpoints"
    folder.mkdir()
    # three attempts with keep=2, each leaving its own two saves (Composer forgets earlier processes')
    for b in (10, 20, 30, 40, 50, 60):
        _save(folder / f"ep0-ba{b}-rank0.pt", b)
    (folder / "latest-rank0.pt").symlink_to("ep0-ba60-rank0.pt")
    for n in range(3):
        (folder / "unfinished").mkdir(exist_ok=True)
        old = folder / "unfinished" / f"ep0-ba{n}-rank0.pt"
        old.write_bytes(b"partial")
        os.utime(old, (1000 + n, 1000 + n))
    removed = prune(folder, keep=2)
    assert sorted(p.name for p in folder.glob("ep*")) == ["ep0-ba50-rank0.pt", "ep0-ba60-rank0.pt"]
    assert [p.name for p in (folder / "unfinished").iterdir()] == ["ep0-ba2-rank0.pt"]
    assert len(removed) == 6
    _save(folder / "ep0-ba70-rank0.pt", 70, complete=False)  # the next attempt died mid-save
    assert [p.name for p in set_aside_unfinished(folder)] == ["ep0-ba70-rank0.pt"]
    assert [p.name for p in prune(folder, keep=2)] == ["ep0-ba2-rank0.pt"]  # unfinished/: the newest stays
    assert [p.name for p in (folder / "unfinished").iterdir()] == ["ep0-ba70-rank0.pt"]
    assert os.readlink(folder / "latest-rank0.pt") == "ep0-ba60-rank0.pt"


def test_a_missing_latest_link_resumes_from_the_newest_finished_save_and_moves_nothing(tmp_path):
    from hpc_llm.builtin.checkpoint import restore_latest, set_aside_unfinished

    folder = tmp_path / "checkpoints"
    folder.mkdir()
    for b in (10, 20):
        _save(folder / f"ep0-ba{b}-rank0.pt", b)
    _save(folder / "ep0-ba30-rank0.pt", 30, complete=False)  # cut off by the death
    # Composer removed the link and died before linking ep0-ba20 anew
    link = restore_latest(folder)
    assert link is not None and os.readlink(link) == "ep0-ba20-rank0.pt"
    assert [p.name for p in set_aside_unfinished(folder)] == ["ep0-ba30-rank0.pt"]  # only the cut-off one
    assert sorted(p.name for p in folder.glob("ep*")) == ["ep0-ba10-rank0.pt", "ep0-ba20-rank0.pt"]
    # sharded saves: a folder is finished once it has .metadata
    sharded = tmp_path / "sharded"
    for b, done in ((10, True), (20, False)):
        (sharded / f"ep0-ba{b}").mkdir(parents=True)
        (sharded / f"ep0-ba{b}" / "__0_0.distcp").write_bytes(b"s")
        if done:
            (sharded / f"ep0-ba{b}" / ".metadata").write_bytes(b"m")
    link = restore_latest(sharded)
    assert link is not None and link.name == "latest-sharded-rank0" and os.readlink(link) == "ep0-ba10"


def test_a_start_up_that_never_reaches_training_is_named_by_its_phase():
    w = watch()

    def beat(rank, phase, node="n1"):
        return heartbeat.Beat(rank=rank, seq=1, batch=-1, node=node, pid=1, phase=phase)

    assert w.startup_stuck({}, 10, 2, 60) is None  # within the deadline
    assert w.startup_stuck({0: beat(0, "data")}, 61, 2, 60) == "the ranks' start (1 of 2 ranks never beat)"
    stuck = w.startup_stuck({0: beat(0, "build"), 1: beat(1, "start", "n2")}, 61, 2, 60)
    assert stuck == "imports (rank 1 on n2)"
    assert w.startup_stuck({0: beat(0, "build")}, 61, 1, None) is None  # no limit
    w.check({0: heartbeat.Beat(0, 2, 0, "n1", 1, heartbeat.TRAINING)}, 62)
    assert w.startup_stuck({0: beat(0, "build")}, 10_000, 1, 60) is None  # it trained: not start-up


def test_an_attempt_resumed_at_max_duration_goes_on_to_the_post_train_stage():
    """Composer refuses to fit a trainer already at max_duration; a run whose last batch was
    trained before a preemption hit its post-train stage must not fail on that."""
    from types import SimpleNamespace

    from composer import Trainer
    from composer.core import Time, Timestamp

    from hpc_llm.job.rank.foundry_train import training_done_goes_on

    original = Trainer.fit
    calls = []
    done = SimpleNamespace(state=SimpleNamespace(max_duration=Time(60, "ba"), timestamp=Timestamp(batch=60)))
    more = SimpleNamespace(state=SimpleNamespace(max_duration=Time(60, "ba"), timestamp=Timestamp(batch=40)))

    def stand_in(self, *a, **kw):  # stands in for training
        calls.append(self)

    Trainer.fit = stand_in
    try:
        with training_done_goes_on():
            assert Trainer.fit(done) is None and calls == []  # nothing trained again
            Trainer.fit(more)
            assert calls == [more]  # 20 batches to go: trained
        assert Trainer.fit is stand_in  # put back as it was
    finally:
        Trainer.fit = original


def test_a_filesystem_short_of_two_saves_is_a_warning_before_enospc(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from hpc_llm.job.rank import disk

    save = tmp_path / "ep0-ba20-rank0.pt"
    save.write_bytes(b"x" * 1000)
    monkeypatch.setattr(disk.os, "statvfs", lambda path: SimpleNamespace(f_bavail=1999, f_frsize=1))
    warning = disk.room_warning(save)
    assert warning is not None and "less than 2 saves" in warning and "ENOSPC" in warning
    monkeypatch.setattr(disk.os, "statvfs", lambda path: SimpleNamespace(f_bavail=2000, f_frsize=1))
    assert disk.room_warning(save) is None


def test_a_time_limit_shortened_mid_step_is_read_again_and_the_ranks_stop_at_the_new_lead(tmp_path, monkeypatch):
    """An admin's ``scontrol update TimeLimit=`` moves the end: the supervisor reads the end time
    again while the generation runs, and stops the ranks the lead before the new end, as a time
    limit (before: the end read at start was kept, the job was killed unsaved and recorded cancelled)."""
    from hpc_llm.job.supervisor import timing

    sup = in_process(tmp_path, monkeypatch, stop_signal="USR2", signal_lead_s=30, stop_lead_s=10)
    sup.timing.lead_s = 10
    sup.job.job_id = "7"
    sup.timing.end = time.time() + 3600  # what the start saw
    shortened = time.time() + 15
    monkeypatch.setattr(timing, "END_REFRESH_S", 0.5)
    sup.timing.ask = lambda: {"EndTime": str(int(shortened))}  # scontrol, SLURM_TIME_FORMAT=%s
    started = time.monotonic()
    end = one_generation(sup)
    assert end.stop == "SIGUSR2" and end.stop_cause == "time_limit" and end.returncode == 0
    assert time.monotonic() - started < 30  # not at the hour the start saw
    assert sup.timing.end == float(int(shortened))


def test_a_preemption_signal_is_passed_on_before_slurmctld_is_asked(tmp_path, monkeypatch):
    """A slow slurmctld must not hold the signal path: far from the end time the stop goes to the
    ranks first, and scontrol is asked afterwards only to record why it came."""
    sup = in_process(tmp_path, monkeypatch, stop_signal="USR2", signal_lead_s=60, recover=False)
    sup.timing.end = time.time() + 3600
    order = []
    real_send = sup.agents.fleet.send

    def send(node, msg):
        if isinstance(msg, messages.Signal):
            order.append("forward")
        real_send(node, msg)

    monkeypatch.setattr(sup.agents.fleet, "send", send)
    sup.timing.ask = lambda: order.append("ask") or {"PreemptTime": "1795534158"}
    end = generation_signalled(sup)
    assert order[:2] == ["forward", "ask"], order
    assert end.stop == "SIGUSR2" and end.stop_cause == "preemption" and end.returncode == 0


def test_a_requeued_job_is_sized_to_what_its_partition_holds(monkeypatch):
    """fit_partition's arithmetic and update_pending's one scontrol call (the real update is run
    on the dev cluster by tests/test_spares.py): shrink to what is up outside the excluded, never
    below what the run needs; grow back to the submitted size once nodes are up again; leave a
    job that fits alone; ask again while slurmctld does not see the requeued job pending yet."""
    import subprocess

    from hpc_llm.slurm import requeue

    up: list[str] = []
    calls: list[list[str]] = []
    answers: list[tuple[int, str]] = []

    def run(
        args: list[str], timeout: float = 60, env: object = None, tries: int = 3
    ) -> subprocess.CompletedProcess[str]:
        calls.append(args)
        code, err = answers.pop(0) if answers else (0, "")
        return subprocess.CompletedProcess(args, code, "", err)

    monkeypatch.setattr(requeue, "partition_up", lambda partition, known_up=(): sorted({*up, *known_up}) or None)
    monkeypatch.setattr(requeue, "run", run)
    monkeypatch.setattr(world, "sleep", lambda s: None)

    def fit(asked, full, needed, excluded, partition):
        return requeue.fit_partition(requeue.Size(asked, full, needed, partition, tuple(excluded)))

    up[:] = ["n1", "n2", "n3"]
    assert fit(3, 3, 1, [], "low") is None  # fits
    assert fit(3, 3, 1, ["n3"], "low") == (
        2,
        "only 2 node(s) of partition low are up outside the excluded: the job now asks for 2 (1 spare(s) instead of 2)",
    )
    grown = fit(2, 3, 1, [], "low")  # shrunk before, the nodes back
    assert grown and grown[0] == 3 and "up again: the job asks for 3" in grown[1]
    assert (fit(3, 3, 2, ["n2", "n3"], "low") or (0, ""))[0] == 2  # never below what the run needs
    assert fit(3, 3, 3, ["n3"], "low") is None  # no spares to give up
    # a run that may go on with fewer nodes (resources.min_nodes=2 of 3, no spares): asks for
    # what is up, down to min_nodes, and for its 3 again once they are up
    few = requeue.fit_partition(requeue.Size(3, 3, 2, "low", ("n3",), nodes=3))
    assert few == (
        2,
        "only 2 node(s) of partition low are up outside the excluded: the job now asks for 2: the run goes on "
        "with 2 of its 3 node(s) (resources.min_nodes=2)",
    ), few
    back = requeue.fit_partition(requeue.Size(2, 3, 2, "low", (), nodes=3))
    assert back and back[0] == 3 and "up again: the job asks for 3 (all its 3 node(s) again)" in back[1], back
    # a node the run found dead that sinfo still calls up is not counted (seed 4828)
    up[:] = ["n1", "n2", "n3", "n4"]
    lost = requeue.fit_partition(requeue.Size(4, 4, 3, "low", (), nodes=3, doubtful=("n4",)))
    assert lost and lost[0] == 3, lost
    assert requeue.fit_partition(requeue.Size(4, 4, 3, "low", (), nodes=3)) is None
    # the caller's own node is up whatever sinfo says (seed 3056: it called it not responding)
    up[:] = ["n1", "n3"]
    mine = requeue.fit_partition(requeue.Size(3, 3, 1, "low", ("n1",), nodes=1, known_up=("n2",)))
    assert mine and mine[0] == 2, mine
    alone = requeue.fit_partition(requeue.Size(3, 3, 1, "low", ("n1",), nodes=1))
    assert alone and alone[0] == 1, alone
    up[:] = []
    assert fit(3, 3, 1, ["n3"], "low") is None  # sinfo could not tell: leave it
    assert calls == []  # deciding asks nothing of scontrol

    assert requeue.update_pending("7", exclude=["n1"], nodes=2, per_node=8) is None
    assert calls == [["scontrol", "update", "JobId=7", "ExcNodeList=n1", "NumNodes=2", "NumTasks=16"]]
    calls.clear()
    assert requeue.update_pending("7") is None and calls == []  # nothing to change
    answers[:] = [(1, "Job is no longer pending execution"), (1, "Job is no longer pending execution"), (0, "")]
    assert (
        requeue.update_pending("7", nodes=3) is None
        and len(calls) == 3
        and calls[-1][3:] == ["NumNodes=3", "NumTasks=3"]
    )
    calls.clear()
    answers[:] = [(1, "Access/permission denied")]
    assert requeue.update_pending("7", exclude=["n2"]) == "Access/permission denied" and len(calls) == 1


def test_the_agent_step_is_sized_to_the_allocation_and_leaves_out_lost_nodes():
    """The script's srun asks for the submit-time count; a shrunk requeue or a lost node needs fewer."""
    from hpc_llm.job.supervisor.agent_step import for_nodes, rendered_nodes

    rendered = [
        "srun",
        "--unbuffered",
        "--nodes=3",
        "--ntasks=3",
        "--ntasks-per-node=1",
        "python",
        "-m",
        "x",
        "--nodes=9",
    ]
    assert for_nodes(rendered, ["n1", "n2", "n3"]) == rendered  # as submitted
    assert for_nodes(rendered, ["n1", "n2"]) == [*rendered[:2], "--nodes=2", "--ntasks=2", *rendered[4:]]
    # a lost node: excluded from the new step, counted out; the program's own --nodes=9 untouched
    assert for_nodes(rendered, ["n1", "n2", "n3"], {"n2", "n7"}) == [
        "srun",
        "--exclude=n2",
        "--unbuffered",
        "--nodes=2",
        "--ntasks=2",
        *rendered[4:],
    ]
    wrapped = ["/usr/bin/srun", "--nodes=2", "--ntasks=2", "apptainer", "exec", "img", "python"]
    assert for_nodes(wrapped, ["n1"]) == ["/usr/bin/srun", "--nodes=1", "--ntasks=1", *wrapped[3:]]
    assert for_nodes(["python", "-m", "x", "--nodes=2"], ["n1"]) == ["python", "-m", "x", "--nodes=2"]  # no srun
    assert for_nodes(rendered, []) == rendered  # the allocation unknown: as rendered
    # a supervisor that took over runs in a task of the old agent step, which holds the CPUs
    assert for_nodes(rendered, ["n1", "n2", "n3"], {"n1"}, overlap=True)[:3] == ["srun", "--overlap", "--exclude=n1"]
    assert rendered_nodes(rendered) == 3 and rendered_nodes(wrapped) == 2 and rendered_nodes(["python"]) is None


def test_the_next_layout_keeps_node_ranks_and_puts_a_spare_in_a_lost_nodes_place():
    """Spares (resources.spare_nodes): a restart in place stays on its nodes whatever agent
    warmed first; a node gone (left out, dead) has its node rank taken by the first spare in
    allocation order; the first generation takes the first warm nodes."""
    from hpc_llm.job.supervisor.agents import next_layout

    assert next_layout([], ["n1", "n2", "n3"], 2) == ["n1", "n2"]
    assert next_layout(["n2", "n3"], ["n1", "n2", "n3"], 2) == ["n2", "n3"]  # not n1, n2
    assert next_layout(["n1", "n2", "n3"], ["n1", "n3", "n4", "n5"], 3) == ["n1", "n4", "n3"]
    assert next_layout(["n2", "n3"], ["n1", "n3"], 2) == ["n1", "n3"]
    # fewer nodes (resources.min_nodes): the nodes left keep their order, rank 0 first
    assert next_layout(["n3", "n1", "n2"], ["n1", "n2"], 2) == ["n1", "n2"]
    assert next_layout(["n1", "n2", "n3"], ["n1", "n3", "n4"], 2) == ["n1", "n3"]


@pytest.mark.parametrize(
    ("state", "gone"),
    [
        ("ALLOCATED", False),
        ("MIXED+DRAIN", False),  # draining for maintenance: alive
        ("IDLE+COMPLETING", False),
        ("ALLOCATED+NOT_RESPONDING", True),  # a ping missed: DOWN follows after SlurmdTimeout
        ("DOWN+NOT_RESPONDING", True),
        ("DOWN+DRAIN", True),
        ("down*", True),  # sinfo's spelling
        ("alloc*", True),
    ],
)
def test_a_node_is_gone_for_slurm_when_down_or_not_responding(state, gone):
    """How an agent whose supervisor stopped answering (its batch host frozen, or cut off from
    this node alone) asks Slurm for its verdict before it requeues the job."""
    assert parse.state_gone(state) is gone


def test_an_attempts_file_written_before_generation_was_the_word_reads_the_same():
    """A run resumed across the upgrade: its attempts.json says "step" where it now says "generation"."""
    old = {"job_id": "7", "restart": 1, "started_at": 1.0, "step": 2, "state": "stopped"}
    a = Attempt.from_dict(old)
    assert (a.generation, a.state) == (2, "stopped")
    assert Attempt.from_dict({**old, "generation": 3}).generation == 3


def test_where_each_nodes_slurmd_listens_is_read_from_scontrol_show_node():
    """A node whose agent's probe port refused is alive only if its slurmd still answers (a
    single-host dev cluster's killed node refuses the probe too): its address and port, as
    `scontrol show node -o` prints them on 22.05 (the lines of the dev cluster, cut short)."""
    out = (
        "NodeName=n1 Arch=x86_64 CoresPerSocket=1 Gres=gpu:8 NodeAddr=127.0.0.1 NodeHostName=vm Port=18818 "
        "Version=22.05.8 State=MIXED Partitions=low,high\n"
        "NodeName=n3 Arch=x86_64 NodeAddr=10.213.0.13 NodeHostName=n3 Version=22.05.8 State=IDLE\n"
    )
    assert parse.slurmd_addresses(out) == {"n1": ("127.0.0.1", 18818), "n3": ("10.213.0.13", 6818)}


def test_an_agent_gives_its_supervisor_up_before_slurm_can_call_a_silent_node_down():
    """The agents' patience (how long they wait for a silent supervisor before ending their ranks)
    is at most 0.8 x SlurmdTimeout: a host cut off, then healed after Slurm called it DOWN and
    requeued the job, carries no process of the job (slurmctld drains a node that reports a job
    it placed elsewhere). Never below a lease and two pings; Slurm's default 300 s leaves the
    default patience as it is."""
    from hpc_llm.job import wire

    default = wire.supervisor_silent_s(1.0, 4.5)
    assert default == 13.5
    assert wire.supervisor_silent_s(1.0, 4.5, slurmd_timeout_s=300) == default
    assert wire.supervisor_silent_s(1.0, 4.5, slurmd_timeout_s=10) == 8.0 < 10
    assert wire.supervisor_silent_s(1.0, 4.5, slurmd_timeout_s=5) == 6.5  # a lease and two pings


def test_a_supervisor_whose_epoch_is_gone_or_that_stands_down_writes_nothing(tmp_path, monkeypatch):
    """The run's epoch, for the supervisor: once another process holds the job (the next
    allocation's supervisor claimed it, or an agent took over), its first write is refused and
    nothing is written. One that stands down (its host cut off) writes nothing and waits for
    Slurm's verdict: the job moved on, and it ends. A requeue Slurm made meanwhile, with nobody
    holding the next allocation yet, leaves it the last to know its attempt (recorded), but the
    requeue itself is refused: the job is Slurm's to start again."""
    from hpc_llm.job.supervisor import act
    from hpc_llm.job.supervisor.stop import Decision
    from hpc_llm.rundir import epoch
    from hpc_llm.rundir.outcome import Action, Cause, State
    from hpc_llm.rundir.record import read_results

    sup = in_process(tmp_path, monkeypatch, stop_signal="USR2", signal_lead_s=60)
    try:
        sup.job.job_id, sup.job.ref, sup.job.restart = "7", "7", 0
        assert sup.take_command() is None and sup.holder is not None
        attempts = Attempts.load(sup.run_dir)
        a = sup.this_attempt(attempts)
        attempts.save()
        before = (sup.run_dir / ".hpc_llm" / "attempts.json").read_text()
        requeue = Decision(Action.REQUEUE, Cause.NODE_FAILURE, "node(s) stopped answering: n2", State.FAILED, ("n2",))
        # the requeued job's next allocation started, and its supervisor holds the job
        assert epoch.claim(sup.run_dir, "7", 1, 0, by="n3") is not None
        with pytest.raises(epoch.Stale, match="epoch 1.0.0 holds the job"):
            act.act(sup, attempts, a, requeue)
        assert (sup.run_dir / ".hpc_llm" / "attempts.json").read_text() == before
        assert read_results(sup.run_dir) is None
        (sup.run_dir / ".hpc_llm" / "epoch" / "7.1.0").unlink()
        # cut off: nothing written, and Slurm's verdict (the job requeued) ends the wait
        monkeypatch.setattr(act, "VERDICT_POLL_S", 0.05)
        monkeypatch.setattr(sup, "job_info", lambda **k: {"JobState": "PENDING", "Restarts": "1"})
        stand_down = Decision(Action.STAND_DOWN, Cause.LOST, "cut off", State.RUNNING, ("n1",))
        assert act.act(sup, attempts, a, stand_down) == 0
        assert (sup.run_dir / ".hpc_llm" / "attempts.json").read_text() == before
        # Slurm requeued the job while nobody holds its next allocation: recorded, not requeued again
        monkeypatch.setattr(act.requeue, "requeue", lambda *a, **k: pytest.fail("requeued twice"))
        monkeypatch.setattr(act.requeue, "requeued_by_ending", lambda *a, **k: False)
        monkeypatch.setattr(act.allocation, "partition_up", lambda partition, known_up=(): None)
        monkeypatch.setattr(epoch, "slurm_refusal", lambda job_id, restart: "Slurm requeued the job (restart 1)")
        with pytest.raises(epoch.Stale, match="Slurm requeued the job"):
            act.act(sup, attempts, a, requeue)
        assert read_results(sup.run_dir)["status"] == "requeued"
    finally:
        sup.agents.close()


def test_one_orphaned_agent_takes_command_and_only_where_it_can_start_a_supervisor(tmp_path, monkeypatch):
    """The takeover (hpc_llm.job.agent.takeover, orphan.take_command): the supervisor's command
    line comes from the agent step's environment; command of the allocation is claimed once
    (O_EXCL: the next epoch), the others find it taken; an agent that has seen only an older
    command than the current one does nothing; no takeover without srun, without the
    supervisor's Python, or with too few nodes left."""
    import json
    import shutil

    from hpc_llm.job import wire
    from hpc_llm.job.agent import orphan, takeover
    from hpc_llm.rundir import epoch

    run_dir = tmp_path / "run"
    (run_dir / ".hpc_llm").mkdir(parents=True)
    monkeypatch.setenv(wire.TAKEOVER, json.dumps(["/usr/bin/python3", "-m", "hpc_llm.job.supervisor", "--", "srun"]))
    argv = takeover.command()
    assert argv is not None and argv[0] == "/usr/bin/python3"
    monkeypatch.setenv(wire.TAKEOVER, "not json")
    assert takeover.command() is None
    assert epoch.claim(run_dir, "7", 0, 0, by="n1") is not None  # the first supervisor's

    def orphaned(node: str, knew: str | None) -> orphan.Orphan:
        return orphan.Orphan(node, 1, "7", "7", 0, run_dir, "n1:1", False, 0.0, (2, 3, 1), epoch=knew)

    mine = orphan.take_command(orphaned("n2", "0.0.3"))
    assert mine is not None and mine.epoch.command == (0, 1)  # ours
    assert orphan.take_command(orphaned("n3", "0.0.3")) is None  # too late: n2 holds it
    assert epoch.claimed_by(run_dir, "7", 0, 1) == "n2"
    assert orphan.take_command(orphaned("n4", None)) is None  # a spare that never ran: it knew 0.1 then
    assert epoch.claim(run_dir, "7", 0, 1, by="n3") is None
    # the supervisor n2 started, lost in turn: the next agent takes the next command
    assert orphan.take_command(orphaned("n3", "0.1.4")).epoch.command == (0, 2)
    epoch.install(None)
    real = shutil.which
    monkeypatch.setattr(world, "which", lambda name: f"/usr/bin/{name}" if name in ("srun", "scontrol") else real(name))
    py = shutil.which("python3") or "/usr/bin/python3"
    assert takeover.why_not([py, "-m", "x"], ["n1", "n2", "n3"], "n1", 2) is None
    assert takeover.why_not([py, "-m", "x"], ["n1", "n2"], "n1", 2) == "1 node(s) left and the run needs 2"
    assert "is not here" in takeover.why_not(["/no/such/python", "-m", "x"], ["n1", "n2"], "n1", 1)
    assert takeover.why_not(None, ["n1", "n2"], "n1", 1) == "the supervisor offered no takeover"
    monkeypatch.setattr(world, "which", lambda name: None if name == "srun" else real(name))
    assert "no srun" in takeover.why_not([py, "-m", "x"], ["n1", "n2"], "n1", 1)


def test_a_supervisor_that_took_over_books_the_lost_generation_as_a_swap_and_the_lost_one_stands_aside(
    tmp_path, monkeypatch
):
    """The new supervisor (started by an agent, TAKEN_OVER_FROM=n1, with the command it claimed)
    books its predecessor's last generation: lost, node_failure on n1 alone, a swap with n1 left
    out, with when the agents found it gone and when one took over; it runs the next generation
    number, and leaves n1 out of its agent step (--overlap). The lost supervisor, back (a frozen
    host thawed), finds the newer epoch and writes nothing. Each supervisor's log has its place
    in the attempt's order."""
    import json

    from hpc_llm.job import wire
    from hpc_llm.job.supervisor import lost
    from hpc_llm.rundir import epoch
    from hpc_llm.rundir.layout import RunDir
    from hpc_llm.rundir.outcome import Action, Cause, State

    sup = in_process(tmp_path, monkeypatch, stop_signal="USR2", signal_lead_s=60)
    try:
        sup.job.job_id, sup.job.ref, sup.job.restart = "7", "7", 0
        assert sup.take_command() is None
        attempts = Attempts.load(sup.run_dir)
        a = sup.this_attempt(attempts)
        a.generation, a.nodes = 2, ["n1", "n2"]
        attempts.save()
        rd = RunDir(sup.run_dir)
        seen = {"job_id": "7", "restart": 0, "node": "n1", "how": "not responding to slurmctld", "by": "n2"}
        rd.supervisor_lost.write_text(json.dumps({**seen, "detected_at": 100.0, "taken_over_at": 103.0}))
        assert lost.taken_over(sup.run_dir, sup.job, Attempts.load(sup.run_dir), "n1") == 3
        [booked] = Attempts.load(sup.run_dir).items
        what = (booked.state, booked.cause, booked.action, booked.suspects, booked.left_out)
        assert what == (State.LOST, Cause.NODE_FAILURE, Action.SWAP, ["n1"], ["n1"])
        assert (booked.detected_at, booked.decided_at) == (100.0, 103.0)
        assert "the agent on n2 took its place in the same job" in booked.error
        assert not rd.supervisor_lost.exists()
        # the lost supervisor, thawed: an agent took command, so it writes nothing
        assert sup.stale() is None
        epoch.install(None)
        assert epoch.claim(sup.run_dir, "7", 0, 1, by="n2") is not None
        epoch.install(sup.holder)
        assert "epoch 0.1.0 holds the job" in (sup.stale() or "")
        with pytest.raises(epoch.Stale):
            Attempts.load(sup.run_dir).save()
    finally:
        epoch.install(None)
        sup.agents.close()
    (tmp_path / "again").mkdir()
    env = {wire.TAKEN_OVER_FROM: "n1", epoch.CLAIMED_ENV: "0.1", "SLURM_JOB_ID": "7"}
    sup = in_process(tmp_path / "again", monkeypatch, env=env, stop_signal="USR2", signal_lead_s=60)
    try:
        assert sup.taken_over_from == "n1" and "n1" in sup.agents.left_out and sup.agents.overlap
        epoch.install(None)
        assert epoch.claim(sup.run_dir, "7", 0, 1, by="n2") is not None
        assert sup.take_command() is None and sup.holder.epoch.command == (0, 1)  # adopted, not claimed
    finally:
        epoch.install(None)
        sup.agents.close()
    for name in ("slurm-7.1.out", "slurm-7.0.n2.out", "slurm-7.0.out", "slurm-7.10.out"):
        (rd.logs / name).write_text("x")
    assert [p.name for p in rd.attempt_logs("7")] == [
        "slurm-7.0.out",
        "slurm-7.0.n2.out",
        "slurm-7.1.out",
        "slurm-7.10.out",
    ]


def test_a_node_left_out_goes_back_to_slurm_but_never_the_batch_host(tmp_path, monkeypatch):
    """After a swap the job shrinks (``scontrol update JobId=J NodeList=<kept>``): the left-out
    nodes go back to Slurm, except this supervisor's node and the batch host (a job cannot let
    go of it; Slurm takes a lost batch host out itself). A refusal changes nothing."""
    from hpc_llm.job.supervisor import agents as agents_mod

    sup = in_process(tmp_path, monkeypatch, stop_signal="USR2", signal_lead_s=60)
    try:
        ag = sup.agents
        ag.job.job_id, ag.job.ref, ag.job.nodes, ag.here = "7", "7", ["n1", "n2", "n3", "n4"], "n2"
        info = {"NodeList": "n[1-4]", "BatchHost": "n1"}
        monkeypatch.setattr(agents_mod.allocation, "show_job", lambda job_id: info)
        monkeypatch.setattr(agents_mod.allocation, "hostnames", lambda nl: ["n1", "n2", "n3", "n4"] if nl else [])
        asked: list[list[str]] = []
        answer: list[str | None] = [None]
        monkeypatch.setattr(agents_mod.requeue, "give_back", lambda ref, keep: asked.append(keep) or answer[0])
        assert ag.give_back() == []  # nothing left out
        ag.left_out |= {"n1", "n2", "n4"}
        answer[0] = "Requested operation is presently disabled"
        assert ag.give_back() == [] and ag.job.nodes == ["n1", "n2", "n3", "n4"]
        answer[0] = None
        assert ag.give_back() == ["n4"] and asked[-1] == ["n1", "n2", "n3"] and ag.job.nodes == ["n1", "n2", "n3"]
    finally:
        sup.agents.close()


def test_a_spare_whose_agent_dies_or_never_starts_is_given_up_and_back_and_the_account_says_so(tmp_path, monkeypatch):
    """A spare serves only with a warm agent. One whose agent dies (or never says hello past
    the grace: 120 s, or 3x the slowest start of the others) is left out and given back to
    Slurm; .hpc_llm/spares.json (what `hpc-llm status <run>` shows) counts the spares left."""
    from hpc_llm.job.supervisor import agents as agents_mod
    from hpc_llm.job.supervisor import spares
    from hpc_llm.rundir import spare_record

    assert spares.never_started(["n3", "n4"], {"n1", "n2", "n4"}, 100.0, [10.0]) == []  # in its grace
    assert spares.never_started(["n3", "n4"], {"n1", "n2", "n4"}, 121.0, [10.0]) == ["n3"]
    assert spares.never_started(["n3"], {"n1"}, 121.0, [50.0]) == []  # the others were slow: 150 s
    assert spares.never_started(["n3"], {"n1"}, 151.0, [50.0]) == ["n3"]

    sup = in_process(tmp_path, monkeypatch, stop_signal="USR2", signal_lead_s=60)
    try:
        ag = sup.agents
        ag.job.job_id, ag.job.ref, ag.job.nodes, ag.here = "7", "7", ["n1", "n3", "n4"], "n1"
        ag.layout = ["n1"]  # the run needs 1 node (policy.nodes), and was submitted with 2 spares
        monkeypatch.setattr(ag, "full_size", lambda: 3)
        monkeypatch.setattr(agents_mod.allocation, "show_job", lambda job_id: {"BatchHost": "n1"})
        monkeypatch.setattr(agents_mod.allocation, "hostnames", lambda nl: [])
        monkeypatch.setattr(agents_mod.requeue, "give_back", lambda ref, keep: None)
        ag.note_spares()
        assert spare_record.read(sup.run_dir)["left"] == ["n3", "n4"]
        ag.lose_spare("n3", "its agent never started")
        ag.lose_spare("n1", "not a spare: in the layout")  # ignored
        record = spare_record.read(sup.run_dir)
        assert (record["submitted"], record["left"], record["given_back"]) == (2, ["n4"], ["n3"])
        assert ag.job.nodes == ["n1", "n4"] and "n1" not in ag.left_out
        assert spare_record.describe(record) == (
            "1 of 2 left; lost n3 (its agent never started); given back to Slurm: n3"
        )
    finally:
        sup.agents.close()


def test_a_supervisor_taken_over_keeps_its_batch_script_alive_until_slurm_ends_the_job(tmp_path, monkeypatch):
    """Back before Slurm took its host out of the job (a short cut, a thaw), a supervisor whose
    place an agent took is still the batch script: its end would end the job under the new
    supervisor. So it stands aside while the job runs this allocation with its host in it: until
    Slurm's SIGTERM, or until Slurm takes its host out or requeues the job."""
    import threading

    from hpc_llm.job.supervisor import act

    sup = in_process(tmp_path, monkeypatch, stop_signal="USR2", signal_lead_s=60)
    try:
        sup.job.job_id, sup.job.ref, sup.job.restart = "7", "7", 0
        monkeypatch.setattr(act, "VERDICT_POLL_S", 0.05)
        here = {"JobState": "RUNNING", "Restarts": "0", "NodeList": sup.node}
        monkeypatch.setattr(sup, "job_info", lambda **k: {**here, "NodeList": "n9"})
        t0 = time.monotonic()
        assert act.stand_aside(sup, "an agent took over") == 0  # this host out of the job: at once
        monkeypatch.setattr(sup, "job_info", lambda **k: {**here, "Restarts": "1"})
        assert act.stand_aside(sup, "an agent took over") == 0  # requeued: at once
        assert time.monotonic() - t0 < 5
        monkeypatch.setattr(sup, "job_info", lambda **k: here)
        threading.Timer(1.5, lambda: setattr(sup, "terminated_at", time.time())).start()
        t1 = time.monotonic()
        assert act.stand_aside(sup, "an agent took over") == 0  # the job runs here: until SIGTERM
        assert time.monotonic() - t1 >= 1.4
    finally:
        sup.agents.close()


def test_a_node_not_responding_is_not_up_but_a_drained_one_stays_drained():
    """sinfo's ``*`` flag: ``idle*`` is a node slurmctld cannot ping (DOWN at SlurmdTimeout), which
    takes no job: not up (a requeue sized on it pended for good: the simulator's seed 1308); a
    drained node not responding is still drained."""
    from hpc_llm.slurm import parse

    states = parse.node_states("n1 idle\nn2 idle*\nn3 mix*\nn4 drain*\nn5 down*\nn6 alloc~\n")
    assert parse.up(states) == ["n1", "n6"]
    assert parse.draining(states) == ["n4"]
