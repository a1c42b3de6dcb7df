"""``hpc-llm model fetch``: a hub model into a local directory, and an ``hf_causal_lm`` yaml
that reads it on Slurm nodes inside Apptainer.

The hub is not reachable here: tests/fake_hub.py serves a tiny Llama-shaped model (built
with transformers from a config) over HTTP the way the hub does, and huggingface_hub's own
``snapshot_download`` fetches it (``HF_ENDPOINT`` points at the stand-in).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from hpc_llm.data.model_fetch import RECORD, choose_files
from tests.conftest import explain, results_of, run_cli
from tests.fake_hub import FakeHub
from tests.jobs import finished, submit
from tests.test_containers import BINDS, apptainer, images_dir, sandbox, sif  # noqa: F401  (fixtures)
from tests.test_foundry_yaml import FINETUNE, corpus, tiny_llama

LLAMA_REPO = [
    "config.json",
    "generation_config.json",
    "model-00001-of-00002.safetensors",
    "model-00002-of-00002.safetensors",
    "model.safetensors.index.json",
    "original/consolidated.00.pth",
    "original/params.json",
    "original/tokenizer.model",
    "special_tokens_map.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "LICENSE",
    "README.md",
    ".gitattributes",
]


def test_the_files_a_local_model_needs_are_chosen():
    # a Llama-3 repo: safetensors shards and the tokenizer, not the original/ consolidated copy
    assert choose_files(LLAMA_REPO) == [
        "config.json",
        "generation_config.json",
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
        "model.safetensors.index.json",
        "special_tokens_map.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    # an older repo with only .bin weights, remote code and a sentencepiece tokenizer (MPT, Llama-2)
    old = ["config.json", "pytorch_model.bin", "configuration_mpt.py", "modeling_mpt.py", "tokenizer.model", "x.h5"]
    assert choose_files(old) == [
        "config.json",
        "configuration_mpt.py",
        "modeling_mpt.py",
        "pytorch_model.bin",
        "tokenizer.model",
    ]
    # .bin copies are left when safetensors exist
    assert "pytorch_model.bin" not in choose_files([*old, "model.safetensors"])


@pytest.fixture
def hub(tmp_path: Path, cache_dir: Path):
    """The stand-in hub with ``tiny/llama`` (a tiny Llama and the tiny corpus's tokenizer,
    plus the files a real repo has that a run does not need)."""
    repo = tmp_path / "hub-repo"
    n_params = tiny_llama(corpus(cache_dir), repo)
    (repo / "original").mkdir()
    (repo / "original" / "consolidated.00.pth").write_bytes(b"\0" * 1024)
    (repo / "README.md").write_text("# tiny llama\n")
    fake = FakeHub()
    fake.repos["tiny/llama"] = repo
    fake.n_params = n_params  # type: ignore[attr-defined]
    yield fake
    fake.close()


def hub_env(env: dict[str, str], hub: FakeHub, tmp_path: Path) -> dict[str, str]:
    return dict(env, HF_ENDPOINT=hub.endpoint, HF_HOME=str(tmp_path / "hf-home"))


def test_fetch_writes_the_model_pinned_and_whole(hub, app_env, tmp_path):
    env = hub_env(app_env, hub, tmp_path)
    out = tmp_path / "models" / "tiny-llama"
    proc = run_cli(["model", "fetch", "tiny/llama", "--out", str(out)], env)
    assert proc.returncode == 0, explain(proc)
    commit = hub.commit("tiny/llama")
    assert f"fetched tiny/llama at {commit[:12]} into {out}" in proc.stdout
    assert f"model.pretrained_model_name_or_path: {out}" in proc.stdout and f"tokenizer.name: {out}" in proc.stdout
    record = json.loads((out / RECORD).read_text())
    assert record["commit"] == commit and record["repo_id"] == "tiny/llama"
    served = [f for f in hub.files("tiny/llama") if not f.startswith("original/") and f != "README.md"]
    assert sorted(record["files"]) == sorted(served)
    assert sorted(p.name for p in out.iterdir()) == sorted([*served, RECORD])
    for f in served:  # byte for byte what the hub holds
        assert (out / f).read_bytes() == (hub.repos["tiny/llama"] / f).read_bytes()
    # every file was asked for at the pinned commit, none from original/
    asked = [r for r in hub.requests if "/resolve/" in r]
    assert asked and all(f"/resolve/{commit}/" in r for r in asked) and not any("original/" in r for r in asked)
    # an existing directory is never overwritten
    before = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    again = run_cli(["model", "fetch", "tiny/llama", "--out", str(out)], env)
    assert again.returncode == 2 and "exists already" in again.stderr, explain(again)
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == before


@pytest.mark.parametrize(
    "case,message",
    [
        ("gated", "tiny/llama is gated: accept its license on"),
        ("unknown", "tiny/nope: no such model on"),
        ("unreachable", "did not answer for tiny/llama: could not connect; run hpc-llm model fetch on a machine"),
        ("offline", "HF_HUB_OFFLINE is set"),
    ],
)
def test_fetch_failures_are_one_line_and_leave_nothing(case, message, hub, app_env, tmp_path):
    env = hub_env(app_env, hub, tmp_path)
    repo = "tiny/nope" if case == "unknown" else "tiny/llama"
    if case == "gated":
        hub.gated.add("tiny/llama")
    if case == "unreachable":
        hub.close()
    if case == "offline":
        env["HF_HUB_OFFLINE"] = "1"
    out = tmp_path / "models" / "m"
    proc = run_cli(["model", "fetch", repo, "--out", str(out)], env)
    assert proc.returncode == 2, explain(proc)
    [line] = proc.stderr.strip().splitlines()[-1:]
    assert line.startswith("hpc_llm: error: ") and message in line, proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "models").exists() or not any((tmp_path / "models").iterdir())


def test_a_yaml_naming_a_hub_id_is_told_how_to_fetch_it(app_env, tmp_path):
    """A yaml with a hub id runs as written (nodes may reach the hub), with a line saying how to
    make a local copy where they cannot."""
    text = FINETUNE.read_text().replace(
        "pretrained_model_name_or_path: ${variables.model_dir}",
        "pretrained_model_name_or_path: meta-llama/Llama-3.2-1B",
    )
    (tmp_path / "hub.yaml").write_text(text)
    (tmp_path / "data").mkdir()
    (tmp_path / "tiny-llama").mkdir()  # the tokenizer's directory (a path, not an id)
    local = [f"train.variables.model_dir={tmp_path / 'tiny-llama'}", f"train.variables.data_dir={tmp_path / 'data'}"]
    proc = run_cli(["config", f"yaml={tmp_path / 'hub.yaml'}", *local], app_env)
    assert proc.returncode == 0, explain(proc)
    assert (
        "train.model.pretrained_model_name_or_path='meta-llama/Llama-3.2-1B' is a hub id, downloaded by every "
        "node at start; where the nodes cannot reach the hub: hpc-llm model fetch meta-llama/Llama-3.2-1B --out DIR"
    ) in proc.stderr
    assert "tokenizer.name" not in proc.stderr  # a local directory is no hub id


@pytest.mark.slurm
@pytest.mark.train
def test_a_fetched_llama_finetunes_on_two_slurm_nodes_inside_apptainer(hub, sif, slurm_env, runs_dir, tmp_path):  # noqa: F811
    """The whole path of an LLM Foundry user with a hub model: fetch it on the login node, point
    their hf_causal_lm yaml at the directory, run it with FSDP over 2 Slurm nodes with every rank
    in Apptainer (the nodes never see the hub), through HF export and generation."""
    env = hub_env(slurm_env, hub, tmp_path)
    model = tmp_path / "models" / "tiny-llama"
    fetched = run_cli(["model", "fetch", "tiny/llama", "--out", str(model)], env)
    assert fetched.returncode == 0, explain(fetched)
    data = tmp_path / "data"
    data.mkdir()
    rows = [{"prompt": f"What is {i} plus {i}? ", "response": f"It is {2 * i}."} for i in range(64)]
    (data / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    run_env = dict(env, HPC_LLM_RUNS=str(runs_dir), HF_HUB_OFFLINE="1", HF_ENDPOINT="http://127.0.0.1:9")
    args = [
        f"yaml={FINETUNE}",
        f"train.variables.model_dir={model}",
        f"train.variables.data_dir={data}",
        "hydra/launcher=slurm",
        "resources.nodes=2",
        "resources.tasks_per_node=1",
        "container=apptainer",
        f"container.image={sif}",
        BINDS,
    ]
    _job, run_dir = submit(args, run_env, tmp_path)
    r = finished(run_dir, 800)
    assert r["status"] == "completed" and r["batches_done"] == 6 and r["parallelism"] == "fsdp", r.get("error")
    assert r["conversion_ok"] and r["inference_ok"], r
    assert r["n_params"] == hub.n_params and r["model"].startswith("Llama-")
    assert len({x["node"] for x in r["ranks"]}) == 2 and all(x["container"]["image"] == str(sif) for x in r["ranks"])
    assert results_of(runs_dir) and os.path.isdir(model)
