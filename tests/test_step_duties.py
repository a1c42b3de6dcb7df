"""StepDuties, the trainer contract's per-step duties (hpc_llm/job/rank/step_duties.py), in
this process: two "ranks" are one process here, so the all-reduce is the value itself.

The dev-cluster side (every rank stops at the same step, the requeued job resumes there) is
tests/test_trainer_contract.py; this holds what a stop owes a trainer that saves
asynchronously, which on the cluster showed only under load.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from hpc_llm.job.rank import preemption
from hpc_llm.job.rank.context import JobContext
from hpc_llm.job.rank.step_duties import StepDuties


def duties(tmp_path: Path) -> StepDuties:
    ctx = JobContext(plan=None, dist=None, run_dir=tmp_path, node_dir=tmp_path)  # type: ignore[arg-type]
    return StepDuties(ctx, total_steps=100, tokens_per_step=64)


def reduce_of(value: int):  # one process: the max over ranks is the value
    return lambda: value


class AsyncSaver:
    """A save that returns at once and writes its metadata last, a while later (as DCP's)."""

    def __init__(self, folder: Path, write_s: float) -> None:
        self.folder, self.write_s = folder, write_s
        self.calls: list[int] = []
        self.in_flight: threading.Thread | None = None

    def save(self, step: int) -> None:
        self.calls.append(step)

        def write() -> None:
            time.sleep(self.write_s)
            (self.folder / f"step-{step}").mkdir()
            (self.folder / f"step-{step}" / ".metadata").write_text("done")

        self.in_flight = threading.Thread(target=write)
        self.in_flight.start()

    def wait(self) -> None:
        if self.in_flight is not None:
            self.in_flight.join()


@pytest.fixture
def stop_asked(monkeypatch):
    monkeypatch.setattr(preemption, "_received", {})
    return lambda: preemption.request_stop("SIGUSR2")


def test_a_stop_on_a_step_whose_save_is_in_flight_waits_for_it_and_saves_nothing_twice(tmp_path, stop_asked):
    d, saver = duties(tmp_path), AsyncSaver(tmp_path, write_s=0.5)
    d.started(0)
    for step in range(1, 5):
        d.step_ended(step, saver.save, reduce_of, saver.wait)
    stop_asked()  # during step 5: its own reduce says so; step 5's end reads step 4's (no)
    saver.save(5)
    d.saved(5)
    d.step_ended(5, saver.save, reduce_of, saver.wait)
    saver.save(6)  # not periodic here: the test's saver saves every step it is asked to
    d.saved(6)
    with pytest.raises(preemption.Preempted) as stopped:
        d.step_ended(6, saver.save, reduce_of, saver.wait)
    assert stopped.value.batch == 6 and stopped.value.signal_name == "SIGUSR2"
    # the stop's step was saved by the loop: not again, and complete before the rank leaves
    assert saver.calls == [5, 6]
    assert (tmp_path / "step-6" / ".metadata").exists()


def test_a_stop_between_saves_saves_its_step_before_the_rank_leaves(tmp_path, stop_asked):
    d, saver = duties(tmp_path), AsyncSaver(tmp_path, write_s=0.2)
    d.started(10)
    stop_asked()
    d.step_ended(11, saver.save, reduce_of, saver.wait)
    with pytest.raises(preemption.Preempted) as stopped:
        d.step_ended(12, saver.save, reduce_of, saver.wait)
    assert stopped.value.batch == 12 and saver.calls == [12]
    assert (tmp_path / "step-12" / ".metadata").exists()
    assert d.trained_tokens(12) == 2 * 64


def test_without_a_stop_no_step_waits_on_a_save(tmp_path, stop_asked):
    d = duties(tmp_path)
    d.started(0)
    waited: list[int] = []
    for step in range(1, 20):
        d.step_ended(step, lambda s: pytest.fail(f"saved {s} with no stop"), reduce_of, lambda: waited.append(1))
    assert waited == [] and d.ctx.metrics["throughput/tokens_per_sec"] > 0


def test_mfu_is_measured_over_the_throughput_window_when_the_trainer_knows_flops_and_peak(tmp_path, stop_asked):
    from hpc_llm.job.env import DistEnv

    dist = DistEnv(0, 0, 4, 4, 0, 1, "localhost", 29500)
    ctx = JobContext(plan=None, dist=dist, run_dir=tmp_path, node_dir=tmp_path)  # type: ignore[arg-type]
    d = StepDuties(ctx, total_steps=100, tokens_per_step=4096, flops_per_token=6e9, peak_flops=1e15)
    bare = StepDuties(JobContext(plan=None, dist=dist, run_dir=tmp_path, node_dir=tmp_path), 100, 4096)  # type: ignore[arg-type]
    d.started(0)
    bare.started(0)
    for step in range(1, 6):
        time.sleep(0.01)
        d.step_ended(step, lambda s: None, reduce_of)
        bare.step_ended(step, lambda s: None, reduce_of)
    tps = ctx.metrics["throughput/tokens_per_sec"]
    # the global tokens/s over 4 devices, each against its own peak
    assert ctx.metrics["throughput/device/mfu"] == pytest.approx(tps * 6e9 / (4 * 1e15))
    assert "throughput/device/mfu" not in bare.ctx.metrics


def test_the_throughput_watchdog_watches_any_trainers_steps_and_its_requeue_stops_every_rank(tmp_path, stop_asked):
    """watchdog.enabled with another trainer than LLM Foundry (whose Composer callback runs it):
    steps slowed tenfold for ``patience`` steps are one event in the record, and with action
    requeue the stop flag, so every rank saves at the same step and the stop says why."""
    from omegaconf import OmegaConf

    from hpc_llm.job.env import DistEnv

    cfg = OmegaConf.create(
        {"watchdog": {"enabled": True, "window": 4, "fraction": 0.5, "patience": 2, "action": "requeue"}}
    )
    dist = DistEnv(0, 0, 2, 2, 0, 1, "localhost", 29500)
    ctx = JobContext(plan=None, dist=dist, run_dir=tmp_path, node_dir=tmp_path, cfg=cfg)  # type: ignore[arg-type]
    d, saved = StepDuties(ctx, total_steps=100, tokens_per_step=64), []
    d.started(0)
    with pytest.raises(preemption.Preempted) as stopped:
        for step in range(1, 20):
            time.sleep(0.2 if 7 <= step <= 8 else 0.02)
            d.step_ended(step, saved.append, reduce_of)
    [event] = ctx.watchdog_events
    assert event["batch"] == 8 and event["action"] == "requeue" and event["ratio"] < 0.5, event
    # asked during step 8's end; its all-reduce is read at step 9's: every rank stops there
    assert stopped.value.batch == 9 and stopped.value.signal_name == "watchdog" and saved == [9]
