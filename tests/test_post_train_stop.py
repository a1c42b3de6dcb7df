"""A run stopped after its last batch still says what it trained (issue #43).

A preemption or time limit that lands in the post-train stage (held-out eval, HF export,
inference check: minutes for a large model) finds no batch boundary to stop at: the ranks
are killed after the grace time, and the attempt never reaches a close of rank 0's. The
next attempt resumes at max_duration, trains nothing, runs the post-train stage and
completes. The training of the attempt that was killed (its loss history, tokens/s, MFU) must
outlive it: rank 0 keeps it as training ends (hpc_llm.rundir.record: RunRecord.trained), and
the completed record reads it from there. Before, it was written only at a close, and the
run completed with ``train_loss: null``.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from hpc_llm.config.plan import JobPlan
from hpc_llm.job.supervisor import policy
from hpc_llm.job.supervisor.stop import Decision, Settings, Stop
from hpc_llm.rundir.record import Attempts, RunRecord, read_results, update_results

#: the loss of 60 batches, as rank 0's results logger keeps it: [batch, loss]
HISTORY = [[b, 10.0 - b / 100] for b in range(1, 61)]
#: what the SpeedMonitor measured while the attempt trained (mfu: a GPU run's)
TPS, MFU = 1234.5, 0.41
#: the supervisor's booking of a decision: the status it writes (hpc_llm.job.supervisor.act: act)
STATUS = {"requeue": "requeued", "restart": "restarting", "swap": "restarting"}


def _plan(run_dir: Path) -> JobPlan:
    return JobPlan("mpt_tiny", 2, 1, 0, 1, 2, "cpu", "ddp", 3600, str(run_dir))


def _stop(cause: str) -> Stop:
    """The facts the supervisor gathers when the step ends with the ranks killed in the
    post-train stage (rank 0 wrote no close): a stop signal it forwarded (the ranks had no
    batch boundary left to stop at, so Slurm's SIGTERM after the grace time ended them), or a
    node whose agent stopped answering."""
    now = time.time()
    if cause == "node_failure":
        return Stop(returncode=1, now=now, dead_nodes=(("n2", "its agent stopped answering"),))
    return Stop(returncode=143, now=now, stop_cause=cause, sigterm_at=now - 1)


def _book(run_dir: Path, d: Decision) -> dict:
    """What the supervisor writes of its decision (hpc_llm.job.supervisor.act: act, restart, requeue_job):
    the attempt's end, then results.json through update_results."""
    attempts = Attempts.load(run_dir)
    a = attempts.current
    a.state, a.cause, a.action = d.state, d.cause, d.action
    a.ended_at = a.decided_at = time.time()
    if a.state != "stopped":
        a.error = d.reason
    a.suspects = sorted(set(d.suspects))
    attempts.save()
    return update_results(run_dir, attempts, STATUS[d.action], {"error": d.reason})


def _train_then_stop(run_dir: Path, cause: str) -> tuple[Decision, dict]:
    """Attempt 1 trains batches 1-60, saves at 60 and is killed in the post-train stage; the
    supervisor decides and books it. Its decision and the record it wrote."""
    first = RunRecord.open(
        run_dir, _plan(run_dir), {}, job_id="7", restart=0, started_at=time.time(), nodes=["n1", "n2"]
    )
    first.note(resumed_at_batch=0, last_batch=0)  # fit_start
    # training ends (hpc_llm.job.rank.task: note_training_end): the final checkpoint, and what it trained
    first.note(last_batch=60, checkpoint_batch=60, train_s=42.0)
    first.trained({"train_loss_history": HISTORY, "train_loss": HISTORY[-1][1], "tokens_per_sec": TPS, "mfu": MFU})
    # ... the post-train stage runs; the stop lands there and the ranks are killed: no close
    attempts = Attempts.load(run_dir)
    d = policy.decide(attempts.items[:-1], attempts.current, _stop(cause), Settings(nodes=2))
    return d, _book(run_dir, d)


def _post_train_only(run_dir: Path, d: Decision) -> dict:
    """The next attempt (the next allocation, or the next step in this one) resumes from the
    checkpoint at max_duration, trains nothing, runs the post-train stage and completes, with
    the figures such an attempt measures: no loss, no throughput (hpc_llm.job.rank.measure)."""
    restart, step = (0, 1) if d.action in ("restart", "swap") else (1, 0)
    nxt = RunRecord.open(
        run_dir,
        _plan(run_dir),
        {},
        job_id="7",
        restart=restart,
        generation=step,
        started_at=time.time(),
        nodes=["n1", "n3"],
    )
    # note_training_end of an attempt whose fit found training done
    nxt.note(last_batch=60, resumed_at_batch=60, checkpoint_batch=60)
    nxt.trained({"tokens_per_sec": None, "mfu": None})
    figures = {"batches_done": 60, "tokens_done": 60 * 8 * 128, "tokens_per_sec": None, "mfu": None}
    return nxt.completed({**figures, "eval": {"loss": 3.0}, "conversion_ok": True, "inference_ok": True}, batch=60)


def _kept_the_training(r: dict) -> None:
    assert r["status"] == "completed" and r["batches_done"] == 60
    assert r["train_loss"] == pytest.approx(9.4) and r["train_loss_first"] == pytest.approx(9.99)
    assert r["train_loss_history"] == HISTORY
    assert r["tokens_per_sec"] == pytest.approx(TPS) and r["mfu"] == pytest.approx(MFU)


@pytest.mark.parametrize("cause", ["time_limit", "preemption", "node_failure"])
def test_a_stop_in_the_post_train_stage_keeps_the_runs_training(tmp_path, cause):
    """Each stop that kills the ranks in the post-train stage, as the supervisor books it, then
    an attempt that only runs the post-train stage: the completed record has the loss, its
    history, the first loss, tokens/s and MFU of the attempt that trained (it said null)."""
    d, booked = _train_then_stop(tmp_path, cause)
    # rank 0 recorded no stop (the ranks were killed): the policy's "before the save finished"
    assert d.cause == cause and d.action in STATUS and d.state != "stopped", d
    # the supervisor's record of the stop already says what was trained
    assert booked["train_loss"] == pytest.approx(9.4) and booked["train_loss_history"] == HISTORY
    assert booked["tokens_per_sec"] == pytest.approx(TPS)
    r = _post_train_only(tmp_path, d)
    _kept_the_training(r)
    assert read_results(tmp_path) == json.loads(json.dumps(r))
    first, last = r["attempts"]
    assert (first["cause"], first["last_batch"], last["resumed_at_batch"]) == (cause, 60, 60)


def test_a_second_stop_in_the_post_train_stage_keeps_it_too(tmp_path):
    """Preempted in the post-train stage twice in a row (the second attempt trained nothing
    either): the run's training is still the first attempt's when the third completes."""
    d, _ = _train_then_stop(tmp_path, "preemption")
    again = RunRecord.open(tmp_path, _plan(tmp_path), {}, job_id="7", restart=1, started_at=time.time())
    again.note(last_batch=60, resumed_at_batch=60, checkpoint_batch=60)
    again.trained({"tokens_per_sec": None, "mfu": None})
    attempts = Attempts.load(tmp_path)
    d = policy.decide(attempts.items[:-1], attempts.current, _stop("preemption"), Settings(nodes=2))
    _book(tmp_path, d)
    r = _post_train_only(tmp_path, d)
    _kept_the_training(r)
    assert r["restarts_by_cause"] == {"preemption": 2}


def test_a_kill_mid_training_keeps_the_history_up_to_the_checkpoint_it_resumes_from(tmp_path):
    """A stop before the save finished (or a dead node) mid-training: the next attempt resumes
    from the last periodic checkpoint, and the history up to it (kept at that checkpoint) is the
    run's; the batches after it are trained again and replace the lost ones."""
    first = RunRecord.open(tmp_path, _plan(tmp_path), {}, job_id="7", restart=0, started_at=time.time())
    first.note(resumed_at_batch=0, last_batch=0)
    # the checkpoint at 35 (hpc_llm.job.rank.preemption_callback: batch_start of 36 notes it)
    first.note(checkpoint_batch=35, last_batch=35)
    first.trained({"train_loss_history": HISTORY[:35], "tokens_per_sec": TPS})
    attempts = Attempts.load(tmp_path)
    d = policy.decide(attempts.items[:-1], attempts.current, _stop("preemption"), Settings(nodes=2))
    _book(tmp_path, d)
    nxt = RunRecord.open(tmp_path, _plan(tmp_path), {}, job_id="7", restart=1, started_at=time.time())
    nxt.note(resumed_at_batch=35, last_batch=35)
    replayed = [[b, 5.0] for b in range(36, 61)]
    r = nxt.completed({"train_loss_history": replayed, "tokens_per_sec": 999.0}, batch=60)
    assert r["train_loss_history"] == HISTORY[:35] + replayed
    assert r["train_loss_first"] == pytest.approx(9.99) and r["train_loss"] == 5.0
    assert r["tokens_per_sec"] == 999.0  # the attempt that trained last measured it


def test_an_attempt_that_trained_no_batch_measures_no_throughput(tmp_path):
    """Composer's timestamp after a resume counts the whole run's tokens: over the load time of
    an attempt that trained nothing they are no throughput. None, so the record keeps the run's."""
    from hpc_llm.job.env import DistEnv
    from hpc_llm.job.rank.context import JobContext
    from hpc_llm.job.rank.measure import kept_figures, throughput

    ctx = JobContext(_plan(tmp_path), DistEnv(0, 0, 2, 1, 0, 2, "n1", 29500), tmp_path, tmp_path)
    assert throughput(ctx, tokens=61440, train_s=3.0) == {"tokens_per_sec": None, "mfu": None}
    ctx.loss_history.extend([(59, 4.5), (60, 4.4)])
    ctx.metrics["throughput/tokens_per_sec"] = TPS
    assert throughput(ctx, tokens=61440, train_s=3.0)["tokens_per_sec"] == TPS
    kept = kept_figures(ctx)
    assert kept["train_loss_history"] == [(59, 4.5), (60, 4.4)] and kept["tokens_per_sec"] == TPS


# -- on the dev cluster ----------------------------------------------------------------------


@pytest.mark.slurm
@pytest.mark.train
def test_a_run_preempted_in_the_post_train_stage_completes_with_the_uninterrupted_runs_loss(
    slurm_env, test_site, tmp_path, pytestconfig
):
    """The issue's scenario: mpt_tiny on 2 nodes x 1 rank, 60 batches, preempted while the
    post-train stage runs. The test plugin's evaluator holds the stage on the first attempt
    that reaches it (``post_s``: far longer than the partition's 20 s grace time, so the
    preemption surely lands there, however slow the machine) and marks its start; the
    preemption is sent once that mark exists. The next attempt resumes at batch 60, runs the
    post-train stage (held no longer) and completes with the uninterrupted run's loss, every
    batch trained. (It replaces test_faults' 1-node version, which checked no loss.)"""
    from tests.conftest import run_cli, with_site
    from tests.jobs import attempts, finished, job_nodes, preempt, read_json, story, submit, wait_for
    from tests.test_faults import SHORT, reference, same_loss

    ref = reference(SHORT, slurm_env, pytestconfig)  # the session's uninterrupted run of SHORT
    env = with_site(dict(slurm_env, HPC_LLM_RUNS=str(tmp_path / "runs")), test_site)
    args = [*SHORT, "hydra.launcher.exclusive=true", "eval.evaluators=[crash]"]
    args += ["+eval.options.crash.at_batch=1000000", "+eval.options.crash.post_s=3600"]
    job_id, run_dir = submit(args, env, tmp_path)
    try:
        wait_for(lambda: (run_dir / "crash_post_started").exists(), 400, "the post-train stage to start")
        # what the attempt measured as training ended (ResultsLogger's fit_end wrote it)
        seen = read_json(run_dir / ".hpc_llm" / "progress.json") or {}
        assert seen.get("phase") == "post-train" and seen.get("batch") == 60, seen
        preempt(job_nodes(job_id, env), env)
        r = finished(run_dir, 600)
    finally:
        subprocess.run(["scancel", job_id], env=env, capture_output=True)
    same_loss(r, ref)
    first, *_, last = r["attempts"]
    assert (first["cause"], first["action"], first["last_batch"]) == ("preemption", "requeue", 60), story(run_dir)
    # killed in the post-train stage, not stopped at a batch boundary: rank 0 recorded no stop
    assert first["state"] != "stopped" and "save finished" in first["error"], first
    assert last["resumed_at_batch"] == 60 and len(attempts(run_dir)) == len(r["attempts"])
    assert r["eval"]["crash_post_first_attempt"] is False  # the post-train stage ran again, in full
    assert set(r["restarts_by_cause"]) == {"preemption"}, r["restarts_by_cause"]
    assert r["train_loss_first"] == pytest.approx(ref["train_loss_first"], rel=1e-5)
    assert [b for b, _ in r["train_loss_history"]] == list(range(1, 61))
    # the attempt that trained measured the throughput; the one that resumed at 60 measured none
    assert seen.get("tokens_per_sec") and r["tokens_per_sec"] == pytest.approx(seen["tokens_per_sec"])
    # hpc-llm report on the two runs: the same final loss
    both = tmp_path / "both"
    for name, res in (("uninterrupted", ref), ("preempted", r)):
        (both / name).mkdir(parents=True)
        (both / name / "results.json").write_text(json.dumps(res))
    shown = run_cli(["report", str(both), "--format", "json"], env)
    assert shown.returncode == 0, shown.stderr
    losses = [row["Train loss"] for group in json.loads(shown.stdout) for row in group["rows"]]
    assert len(losses) == 2 and losses[0] is not None and losses[0] == losses[1], losses
