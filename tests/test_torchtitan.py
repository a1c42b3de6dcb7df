"""trainer=torchtitan: torchtitan 0.3.0 on torch 2.14.1 in its own venv (.venv-torchtitan,
scripts/setup-torchtitan.sh), run through everything hpc_llm has (docs/reference/trainers.md).

The contract's cases (every batch recorded, a stop saved and resumed to the same loss, a killed
rank forked again by its agent) are in tests/test_trainer_contract.py, for every trainer. Here:
the config a run gets and the script it renders, a bad torchtitan key refused before the queue
by torchtitan's own config classes, a checkpoint whose pickle would run a command refused, and
a sweep of two node counts on the dev cluster with its report.
"""

from __future__ import annotations

import json
import pickle
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT, explain, results_of, run_app, run_cli

TITAN_PYTHON = ROOT / ".venv-torchtitan" / "bin" / "python"
TINY = ["+experiment=llama3_tiny"]


@pytest.fixture
def titan_env(app_env: dict[str, str]) -> dict[str, str]:
    return dict(app_env, HPC_LLM_TORCHTITAN_PYTHON=str(TITAN_PYTHON))


def test_config_prints_the_torchtitan_keys_the_run_gets(titan_env, tmp_path):
    proc = run_cli(
        ["config", *TINY, "train.max_duration=12ba", "+trainer.options.overrides.training.gc_freq=7"], titan_env
    )
    assert proc.returncode == 0, explain(proc)
    shown = yaml.safe_load(proc.stdout)
    assert shown["model"]["name"] == "torchtitan_llama3" and shown["model"]["hidden_size"] == 64
    assert shown["training.steps"] == 12 and shown["training.global_batch_size"] == 8
    assert shown["training.local_batch_size"] == 4 and shown["training.seq_len"] == 128
    assert shown["parallelism.data_parallel_replicate_degree"] == 2
    assert shown["checkpoint.async_mode"] == "async" and shown["checkpoint.folder"] == "<run dir>/checkpoints"
    assert shown["training.gc_freq"] == 7  # an override, last


def test_render_starts_the_torchtitan_venv_on_the_nodes(titan_env, tmp_path):
    proc = run_cli(["render", *TINY, "resources.nodes=2", "resources.tasks_per_node=1"], titan_env, cwd=tmp_path)
    assert proc.returncode == 0, explain(proc)
    script = proc.stdout
    assert f"{TITAN_PYTHON} -u -m hpc_llm.job.supervisor" in script, script
    assert f"{TITAN_PYTHON} -u -m hpc_llm.job.agent" in script, script


def test_a_bad_torchtitan_key_is_refused_before_the_queue_in_one_line(titan_env, runs_dir, tmp_path):
    """Checked by torchtitan's own Trainer.Config in its venv (the check before the queue)."""
    env = dict(titan_env, HPC_LLM_PRECHECK="1")
    proc = run_app([*TINY, "+trainer.options.overrides.training.gc_freqq=3"], env, cwd=tmp_path, timeout=300)
    assert proc.returncode == 2, explain(proc)
    [line] = [ln for ln in proc.stderr.strip().splitlines() if ln.startswith("hpc_llm: error")]
    assert line == (
        "hpc_llm: error: trainer.options.overrides.training.gc_freqq: not a key of torchtitan's "
        "Trainer.Config; did you mean training.gc_freq?"
    ), explain(proc)
    assert "check before the queue: trainer=torchtitan" in proc.stderr
    assert not runs_dir.exists()


class _Touch:
    """A pickle that runs ``touch`` when it is loaded."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self):
        import os

        return (os.system, (f"touch {self.path}",))


#: issue #54's recipe for a step folder whose dataloader state runs a command: a real step made a
#: torch.save file, its ``dataloader.dp_rank_N`` entries replaced, made a DCP folder again
#: (torch 2.14's own converters, in torchtitan's venv)
PLANT_DATALOADER = """
import os, pickle, sys, torch
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save, torch_save_to_dcp
src, dst, marker = sys.argv[1:4]
dcp_to_torch_save(src, dst + ".pt")
state = torch.load(dst + ".pt", weights_only=False)
class Touch:
    def __reduce__(self):
        return (os.system, (f"touch {marker}",))
ranks = [k for k in state["dataloader"] if k.startswith("dp_rank_")]
assert ranks, sorted(state["dataloader"])
for key in ranks:
    state["dataloader"][key] = pickle.dumps(Touch())
torch.save(state, dst + ".pt")
torch_save_to_dcp(dst + ".pt", dst)
os.remove(dst + ".pt")
"""


@pytest.mark.train
def test_a_torchtitan_checkpoint_whose_pickle_runs_a_command_is_refused(titan_env, runs_dir, tmp_path):
    """A resume reads the newest step-N. Issue #54's two escapes, each planted in a copy of a real
    step: a ``.metadata`` naming ``FileSystem.rm_file`` (a dotted name whose ``__module__`` is
    DCP's, which a guard by spelling let delete a file), then a dataloader state whose pickle runs
    ``touch`` (torchtitan unpickled it with ``pickle.loads``). Each resume is refused in one line
    naming the step folder and the global; the file is still there, nothing ran."""
    folder = tmp_path / "ckpt"
    args = [*TINY, "train.max_duration=12ba", "checkpoint.interval=2ba", f"checkpoint.location={folder}"]
    proc = run_app([*TINY, "train.max_duration=4ba", *args[2:]], titan_env, cwd=tmp_path)
    assert proc.returncode == 0, explain(proc)
    # the estimator's model is torchtitan's: the parameters it counts are those torchtitan logs
    [first] = results_of(runs_dir)
    assert first["n_params"] == 196_928 and first["model"] == "Llama-197K"
    assert "size: 196,928 total parameters" in (Path(first["run_dir"]) / "logs" / "rank0.log").read_text()

    from tests.hostile import payloads as hostile

    fake, canary = folder / "step-9", tmp_path / "canary"
    shutil.copytree(folder / "step-4", fake)
    hostile.lay_canary(canary)
    [dotted] = [p for p in hostile.payloads(canary) if p.name == "stack-global-dotted-rm_file"]
    (fake / ".metadata").write_bytes(dotted.data)
    proc = run_app(args, dict(titan_env, HPC_LLM_RUNS=str(tmp_path / "again")), cwd=tmp_path)
    assert proc.returncode != 0 and not hostile.changed(canary), explain(proc)
    [r] = results_of(tmp_path / "again")
    assert r["status"] == "failed"
    assert f"refused to load {fake / '.metadata'}: it names {dotted.refused[0]}," in r["error"], r["error"]
    assert "\n" not in r["error"]

    shutil.rmtree(fake)
    fake, ran = folder / "step-11", tmp_path / "ran"
    planted = subprocess.run(
        [str(TITAN_PYTHON), "-c", PLANT_DATALOADER, str(folder / "step-4"), str(fake), str(ran)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert planted.returncode == 0 and (fake / ".metadata").is_file(), planted.stderr[-3000:]
    proc = run_app(args, dict(titan_env, HPC_LLM_RUNS=str(tmp_path / "third")), cwd=tmp_path)
    assert proc.returncode != 0 and not ran.exists(), explain(proc)
    [r] = results_of(tmp_path / "third")
    assert r["status"] == "failed" and "\n" not in r["error"]
    assert f"refused to load {fake} (its entry dataloader.dp_rank_" in r["error"], r["error"]
    assert "it names posix.system" in r["error"], r["error"]


@pytest.mark.train
def test_an_attempt_that_resumes_at_the_last_step_still_measures_the_held_out_loss(titan_env, runs_dir, tmp_path):
    """A second run on a finished run's checkpoints (as an attempt stopped after the last save
    resumes): it trains nothing, and still records the held-out loss, the first run's exactly
    (the same weights, the same held-out batches), and the save it resumed from."""
    folder = tmp_path / "ckpt"
    args = [*TINY, "train.max_duration=8ba", "checkpoint.interval=4ba", f"checkpoint.location={folder}"]
    proc = run_app(args, titan_env, cwd=tmp_path)
    assert proc.returncode == 0, explain(proc)
    [first] = results_of(runs_dir)
    proc = run_app(args, dict(titan_env, HPC_LLM_RUNS=str(tmp_path / "again")), cwd=tmp_path)
    assert proc.returncode == 0, explain(proc)
    [again] = results_of(tmp_path / "again")
    assert again["status"] == "completed" and again["batches_done"] == 8, again.get("error")
    assert again["attempts"][0]["resumed_at_batch"] == 8 and again["checkpoint"] == str(folder / "step-8")
    assert again["eval"]["loss"] == first["eval"]["loss"] > 0


@pytest.mark.train
def test_torchtitan_checkpoints_go_to_s3_and_one_there_whose_pickle_runs_a_command_is_refused(
    titan_env, s3, runs_dir, tmp_path
):
    """checkpoint=uri with s3:// (the dev S3 server): torchtitan's DCP saves through s3fs, the
    record names the save in the store; a load_path in the store goes through the same guard."""
    from tests.test_object_storage import keys, s3_client

    env = dict(titan_env, **s3.env())
    prefix = f"titan-{tmp_path.name}"
    args = [*TINY, "train.max_duration=4ba", "checkpoint.interval=2ba", "checkpoint=uri"]
    proc = run_app([*args, f"checkpoint.location={s3.uri(prefix)}"], env, cwd=tmp_path)
    assert proc.returncode == 0, explain(proc)
    [r] = results_of(runs_dir)
    assert r["status"] == "completed" and r["batches_done"] == 4, r.get("error")
    folder = r["checkpoint"].rsplit("/", 1)[0]
    assert folder.startswith(s3.uri(prefix) + "/") and r["checkpoint"] == f"{folder}/step-4", r["checkpoint"]
    saved = keys(s3, folder[len(s3.uri()) + 1 :] + "/")
    for step in (2, 4):
        assert any(k.endswith(f"/step-{step}/.metadata") for k in saved), sorted(saved)
    assert r["checkpoint_bytes"] == sum(n for k, n in saved.items() if "/step-4/" in k) > 0

    # a copy of step-4 whose .metadata would run `touch`, loaded by a fresh run (load_path)
    client, bucket = s3_client(s3), s3.bucket
    evil = f"{prefix}/evil/step-4"
    for key in saved:
        if "/step-4/" in key and not key.endswith("/.metadata"):
            client.copy_object(Bucket=bucket, Key=f"{evil}/{key.rsplit('/', 1)[1]}", CopySource=f"{bucket}/{key}")
    ran = tmp_path / "ran"
    client.put_object(Bucket=bucket, Key=f"{evil}/.metadata", Body=pickle.dumps(_Touch(ran)))
    again = tmp_path / "again"
    proc = run_app(
        [*args, f"checkpoint.location={s3.uri(prefix + '/fresh')}", f"checkpoint.load_path={s3.uri(evil)}"],
        dict(env, HPC_LLM_RUNS=str(again)),
        cwd=tmp_path,
    )
    assert proc.returncode != 0 and not ran.exists(), explain(proc)
    [r] = results_of(again)
    assert r["status"] == "failed" and s3.uri(evil) in r["error"] and "posix.system" in r["error"], r["error"]


@pytest.mark.slurm
def test_a_sweep_of_two_node_counts_on_the_dev_cluster_and_its_report(slurm_env, runs_dir, tmp_path):
    env = dict(slurm_env, HPC_LLM_TORCHTITAN_PYTHON=str(TITAN_PYTHON))
    args = ["-m", *TINY, "hydra/launcher=slurm", "resources.nodes=1,2", "resources.tasks_per_node=1"]
    proc = run_app([*args, "hydra.launcher.wait=true", "hydra.launcher.poll_s=1"], env, cwd=tmp_path)
    assert proc.returncode == 0, explain(proc)
    found = sorted(results_of(runs_dir), key=lambda r: r["nodes"])
    assert [(r["nodes"], r["status"], r["batches_done"]) for r in found] == [(1, "completed", 40), (2, "completed", 40)]
    assert all(r["eval"]["loss"] > 0 and r["tokens_per_sec"] > 0 for r in found)
    sweep = next(runs_dir.glob("llama3_tiny/*"))
    rep = run_cli(["report", str(sweep), "--format", "json"], env)
    assert rep.returncode == 0, explain(rep)
    groups, _ = json.JSONDecoder().raw_decode(rep.stdout)
    rows = [row for g in groups for row in g["rows"]]
    assert len(rows) == 2, rows
