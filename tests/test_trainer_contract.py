"""The trainer contract's conformance suite (docs/reference/trainers.md, "The contract").

The same tests for every trainer: LLM Foundry (the default), torchtitan (its own venv,
torch 2.14) and a stub third trainer (tests/plugins/hpc-llm-stub-trainer: a bigram model in
plain torch, registered through the ``hpc_llm`` entry point group like any package's).

* locally, two ranks: every batch recorded, the loss falling, a checkpoint, the record's fields;
* on the dev cluster: a stop (a preemption) saves, the job requeues, and the run resumes at the
  step it stopped at and ends with the uninterrupted run's loss (torchtitan's checkpoints in the
  dev S3 server);
* on the dev cluster: a rank killed is forked again by its agent in the same allocation, and
  the run ends with the uninterrupted run's loss.

LLM Foundry's dev-cluster cases are tests of their own (tests/test_foundry_yaml.py's
``test_a_preempted_yaml_run_resumes_exactly``, tests/test_faults.py's
``test_a_killed_rank_restarts_in_place_with_the_same_loss``): they are not run twice.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tests.conftest import ROOT, explain, results_of, run_app, with_site
from tests.jobs import attempts, finished, submit
from tests.test_faults import preempted_run, rank_at, reference, same_loss

TITAN_PYTHON = ROOT / ".venv-torchtitan" / "bin" / "python"

#: each trainer's tiny run (the tiny corpus, a checkpoint every 5 batches)
RUNS = {
    "llmfoundry": ["+experiment=mpt_tiny", "eval=none"],
    "torchtitan": ["+experiment=llama3_tiny"],
    "stub": ["trainer.name=stub", "eval=none"],
}
#: what holds a step to a tenth of a second (a test must catch the run mid-training)
PACED = {
    "llmfoundry": ["++train.callbacks.hpc_llm_test_pace.batch_s=0.1"],
    "torchtitan": [],  # ~0.15 s a step on one CPU rank already
    "stub": ["+trainer.options.step_s=0.1"],
}


def env_for(app_env: dict[str, str], site: Path, runs: Path) -> dict[str, str]:
    return with_site(dict(app_env, HPC_LLM_RUNS=str(runs), HPC_LLM_TORCHTITAN_PYTHON=str(TITAN_PYTHON)), site)


@pytest.mark.train
@pytest.mark.parametrize("trainer", sorted(RUNS))
def test_a_trainer_records_every_batch_its_loss_and_its_checkpoint(trainer, app_env, test_site, tmp_path):
    env = env_for(app_env, test_site, tmp_path / "runs")
    args = [*RUNS[trainer], "train.max_duration=20ba", "checkpoint.interval=10ba"]
    proc = run_app(args, env, cwd=tmp_path)
    assert proc.returncode == 0, explain(proc)
    [r] = results_of(tmp_path / "runs")
    assert r["status"] == "completed" and r["world_size"] == 2 and r["batches_done"] == 20, r.get("error")
    # progress every batch: the loss of each of the 20 batches, in order
    assert [b for b, _loss in r["train_loss_history"]] == list(range(1, 21))
    assert r["train_loss"] < r["train_loss_history"][0][1]
    assert r["tokens_per_sec"] > 0 and r["train_s"] > 0
    run_dir = Path(r["run_dir"])
    assert (run_dir / "train_config.yaml").stat().st_size > 0
    # the checkpoint of the last batch is in the run's checkpoint folder
    saved = sorted(p.name for p in (run_dir / "checkpoints").iterdir() if not p.name.startswith("."))
    assert any("20" in name for name in saved), saved
    [attempt] = r["attempts"]
    assert attempt["state"] == "completed" and attempt["last_batch"] == 20 and attempt["resumed_at_batch"] == 0


CLUSTER = ["hydra/launcher=slurm", "checkpoint.interval=5ba", "fault.hang_floor_s=20", "fault.hang_timeout_s=60"]
#: whole nodes: the preemption (a high-partition job on the run's nodes) hits this run alone
TWO_WHOLE_NODES = ["resources.nodes=2", "resources.tasks_per_node=1", "hydra.launcher.exclusive=true"]
TWO_NODES = ["resources.nodes=2", "resources.tasks_per_node=1"]


def on_the_cluster(trainer: str, shape: list[str], batches: int, slurm_env, site, tmp_path, pytestconfig):
    """(env, the run's args, its uninterrupted reference's results) of ``trainer``'s tiny run."""
    env = env_for(slurm_env, site, tmp_path / "runs")
    args = [*RUNS[trainer], *CLUSTER, *shape, f"train.max_duration={batches}ba"]
    return env, args, reference(args, env, pytestconfig)


@pytest.mark.slurm
@pytest.mark.long  # with its reference run, ~2 min under load: started first, beside the short ones
@pytest.mark.parametrize("trainer", ["stub", "torchtitan"])
def test_a_stop_saves_requeues_and_resumes_at_the_same_step_with_the_same_loss(
    trainer, slurm_env, test_site, tmp_path, pytestconfig, request
):
    env, args, ref = on_the_cluster(trainer, TWO_WHOLE_NODES, 200, slurm_env, test_site, tmp_path, pytestconfig)
    store: list[str] = []
    if trainer == "torchtitan":
        # its checkpoints in the dev S3 server (DCP through s3fs), its reference's in a folder:
        # the same loss either way
        s3 = request.getfixturevalue("s3")
        env = dict(env, **s3.env())
        store = ["checkpoint=uri", f"checkpoint.location={s3.uri('contract-' + tmp_path.name)}"]
    _job_id, r = preempted_run([*args, *store, *PACED[trainer]], env, tmp_path, test_site)
    same_loss(r, ref)
    if store:
        assert r["checkpoint"].startswith(s3.uri("contract-")) and r["checkpoint"].endswith("/step-200")
    first, second = r["attempts"][:2]
    assert (first["state"], first["cause"], first["signal"]) == ("stopped", "preemption", "SIGUSR2"), r["attempts"]
    assert 0 < first["stopped_at_batch"] < 200 and second["resumed_at_batch"] == first["stopped_at_batch"]
    assert r["batches_lost"] == 0 and r["restarts_by_cause"] == {"preemption": 1}


@pytest.mark.slurm
@pytest.mark.parametrize("trainer", ["stub", "torchtitan"])
def test_a_killed_rank_is_forked_again_by_its_agent_with_the_same_loss(
    trainer, slurm_env, test_site, tmp_path, pytestconfig
):
    env, args, ref = on_the_cluster(trainer, TWO_NODES, 100, slurm_env, test_site, tmp_path, pytestconfig)
    job_id, run_dir = submit([*args, *PACED[trainer]], env, tmp_path)
    victim = rank_at(run_dir, 1, 8)
    os.kill(victim["pid"], signal.SIGKILL)
    r = finished(run_dir, 300)
    same_loss(r, ref)
    first, second = r["attempts"][:2]
    assert (first["cause"], first["action"]) == ("failure", "restart"), r["attempts"]
    assert (second["job_id"], second["restart"], second["generation"]) == (job_id, 0, 1)
    assert second["resumed_at_batch"] > 0 and second["resumed_at_batch"] % 5 == 0
    # the same warm agents: each node's agent warmed once and forked the second generation
    logs = Path(run_dir) / "logs"
    assert [p.read_text().count("warm in") for p in sorted(logs.glob("agent*.0.log"))] == [1, 1]
    assert attempts(run_dir)[1]["forked_at"] - attempts(run_dir)[0]["detected_at"] < 10
