"""Experiment trackers through Composer's loggers: a real MLflow tracking server on
localhost (mlflow comes with LLM Foundry) and W&B in offline mode (no network here)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import explain, results_of, run_app, with_site
from tests.jobs import ALONE, attempts, beat, finished, job_nodes, paced, preempt, submit, wait_for

MLFLOW = str(Path(sys.executable).with_name("mlflow"))
TINY = ["+experiment=mpt_tiny", "eval=none", "resources.tasks_per_node=1"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    """``mlflow server`` with a file store (mlflow 2.22's SQL store does not import with the
    SQLAlchemy 2.1 LLM Foundry's stack brings), stopped after the module."""
    root = tmp_path_factory.mktemp("mlflow")
    port = _free_port()
    proc = subprocess.Popen(
        [
            MLFLOW,
            "server",
            "--backend-store-uri",
            str(root / "runs"),
            "--default-artifact-root",
            str(root / "artifacts"),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
        ],
        stdout=(root / "server.log").open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    uri = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while True:
        try:
            if urllib.request.urlopen(f"{uri}/health", timeout=2).read() == b"OK":
                break
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("mlflow server did not start:\n" + (root / "server.log").read_text()[-3000:])
        time.sleep(0.5)
    yield uri
    import os
    import signal

    os.killpg(proc.pid, signal.SIGTERM)
    proc.wait(timeout=30)


def mlflow_runs(uri: str, experiment: str) -> list:
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    assert exp is not None, f"no MLflow experiment {experiment!r}"
    return client.search_runs([exp.experiment_id])


def loss_steps(uri: str, run_id: str) -> list[int]:
    from mlflow import MlflowClient

    return [m.step for m in MlflowClient(uri).get_metric_history(run_id, "loss/train/total")]


@pytest.mark.train
def test_a_run_logs_to_one_mlflow_run_named_after_it(mlflow_server, app_env, runs_dir, tmp_path):
    proc = run_app(
        [*TINY, "train.max_duration=6ba", "logger=mlflow", f"logger.tracking_uri={mlflow_server}"],
        app_env,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, explain(proc)
    [r] = results_of(runs_dir)
    run_dir = Path(r["run_dir"])
    [run] = mlflow_runs(mlflow_server, f"mpt_tiny-{run_dir.parent.name}")  # a sweep is one experiment
    name = f"mpt_tiny-{run_dir.parent.name}-{run_dir.name}"
    assert run.info.run_name == name and run.info.status == "FINISHED"
    tags = run.data.tags
    assert tags["hpc_llm.run"] == name and tags["hpc_llm.nodes"] == "1" and tags["hpc_llm.attempt"] == "1"
    assert tags["hpc_llm.git_commit"] == r["provenance"]["git"]["commit"]
    assert loss_steps(mlflow_server, run.info.run_id) == list(range(6))


@pytest.mark.slurm
def test_a_preempted_run_is_one_mlflow_run_with_a_continuous_history(mlflow_server, slurm_env, test_site, tmp_path):
    env = with_site(dict(slurm_env, HPC_LLM_RUNS=str(tmp_path / "runs")), test_site)
    job_id, run_dir = submit(
        [
            *ALONE,
            "train.max_duration=150ba",
            "logger=mlflow",
            f"logger.tracking_uri={mlflow_server}",
            *paced(0.1),  # still training when the preemption lands, on any machine
        ],
        env,
        tmp_path,
    )
    wait_for(lambda: beat(run_dir, 0).get("batch", -1) >= 20, 240, "rank 0 to pass batch 20")
    preempt(job_nodes(job_id, env), env)
    r = finished(run_dir, 400)
    assert r["status"] == "completed" and r["restarts_by_cause"] == {"preemption": 1}
    first, second = attempts(run_dir)
    stop = first["stopped_at_batch"]
    assert 20 <= stop < 150 and second["resumed_at_batch"] == stop
    [run] = mlflow_runs(mlflow_server, f"mpt_tiny-{run_dir.parent.name}")  # ONE run for both attempts
    steps = loss_steps(mlflow_server, run.info.run_id)
    assert sorted(set(steps)) == list(range(150))  # continuous: every batch, none missing
    assert len(steps) - 150 <= 1  # at most the batch the stop came at, logged again on resume
    assert run.data.tags["hpc_llm.attempt"] == "2" and job_id in run.data.tags["hpc_llm.slurm_job_ids"]
    assert run.info.status == "FINISHED"


def _wandb_history(run_dir: Path) -> list[int]:
    """The _step of every training-loss row in an offline W&B run, read with wandb's own reader."""
    from wandb.proto import wandb_internal_pb2
    from wandb.sdk.internal import datastore

    [path] = run_dir.glob("*.wandb")
    ds = datastore.DataStore()
    ds.open_for_scan(str(path))
    steps = []
    while True:
        data = ds.scan_data()
        if data is None:
            break
        rec = wandb_internal_pb2.Record()
        rec.ParseFromString(data)
        if rec.WhichOneof("record_type") == "history":
            row = {item.key or "/".join(item.nested_key): item.value_json for item in rec.history.item}
            if "loss/train/total" in row:
                steps.append(int(row["_step"]))
    return steps


@pytest.mark.train
def test_a_resumed_run_keeps_its_wandb_run_offline(app_env, tmp_path):
    """W&B offline: a run resumed from its checkpoint (a second invocation into the same run
    dir, as a requeue does) logs to the same W&B run id, its steps going on where they stopped."""
    env = dict(app_env, WANDB_MODE="offline", WANDB_DIR=str(tmp_path / "wandb"), WANDB_SILENT="true")
    (tmp_path / "wandb").mkdir()
    sweep = tmp_path / "sweep"
    common = [*TINY, "logger=wandb", f"hydra.sweep.dir={sweep}", "checkpoint.interval=4ba"]
    first = run_app([*common, "train.max_duration=4ba"], env, cwd=tmp_path)
    assert first.returncode == 0, explain(first)
    second = run_app([*common, "train.max_duration=8ba", "checkpoint.autoresume=true"], env, cwd=tmp_path)
    assert second.returncode == 0, explain(second)
    runs = sorted((tmp_path / "wandb" / "wandb").glob("offline-run-*"))
    assert len(runs) == 2
    ids = {p.name.split("-", 3)[3] for p in runs}  # offline-run-<date>_<time>-<id>
    assert ids == {"mpt_tiny-sweep-0"}  # the id derived from the run name, both times
    assert [_wandb_history(p) for p in runs] == [[0, 1, 2, 3], [4, 5, 6, 7]]


@pytest.mark.parametrize(
    "overrides,message",
    [
        (["logger=mlflow"], "logger=mlflow needs a tracking server: set logger.tracking_uri or MLFLOW_TRACKING_URI"),
        (["logger=wandb", "logger.mode=sometimes"], "logger.mode='sometimes' is not a W&B mode; allowed: online"),
    ],
)
def test_bad_tracker_input_is_one_line(overrides, message, app_env, runs_dir, tmp_path):
    env = {k: v for k, v in app_env.items() if k not in ("MLFLOW_TRACKING_URI", "WANDB_MODE")}
    proc = run_app(["+experiment=mpt_tiny", *overrides], env, cwd=tmp_path, timeout=120)
    assert proc.returncode == 2, explain(proc)
    [line] = proc.stderr.strip().splitlines()
    assert message in line
    assert not runs_dir.exists()
