"""The seeds' experiments: data prep, finetuning, every experiment's config and 8xH100 render.

No hub here: C4 and the finetuning sets are written by the tests in their real
schemas (a few hundred rows) and go through the same code as the real ones
(LLM Foundry's converters, LLM Foundry's finetuning loader).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT, explain, results_of, run_app, run_cli

GOLDEN = ROOT / "tests" / "golden"
EXPERIMENTS = sorted(p.stem for p in (ROOT / "conf" / "experiment").glob("*.yaml"))
SEED_EXPERIMENTS = [f"mpt{s}_c4" for s in ("125m", "350m", "760m", "1b", "3b", "7b", "13b", "30b", "70b")] + [
    "mpt7b_dolly",
    "mpt30b_instruct",
]
FIXED = ["hydra.sweep.dir=/shared/runs/golden", "hydra.launcher.python=/opt/hpc_llm/venv/bin/python"]


@pytest.fixture
def data_root(tmp_path: Path) -> Path:
    """$HPC_LLM_DATA of the config and render tests: the c4 shards are not prepared there (that
    starts the training stack: c4_mds), so those previews warn that they are missing."""
    return tmp_path / "data"


@pytest.fixture
def cli(monkeypatch, capsys, data_root):
    """``hpc-llm`` in this process (the same main(); dozens of config/render calls stay fast)."""
    from hpc_llm.cli import main

    monkeypatch.setenv("HPC_LLM_DATA", str(data_root))

    def call(*args: str) -> str:
        with pytest.raises(SystemExit) as exc:
            main(list(args))
        out = capsys.readouterr()
        assert exc.value.code == 0, out.err
        return out.out

    return call


@pytest.fixture(scope="module")
def tiny_tokenizer(cache_dir: Path) -> Path:
    """The bundled corpus' BPE tokenizer (512 tokens), from the session's shared cache."""
    from hpc_llm.data import tiny_corpus

    tokenizer, _ = tiny_corpus.ensure(cache_dir)
    return tokenizer


def write_c4_like(root: Path) -> Path:
    """C4's own layout and schema: en/c4-{train,validation}.NNNNN-of-01024.json.gz, {text, timestamp, url}."""
    from hpc_llm.data import tiny_corpus

    lines = tiny_corpus.corpus_lines()
    (root / "en").mkdir(parents=True)
    for split, rows, shards in (("train", lines[:240], 2), ("validation", lines[240:300], 1)):
        for s in range(shards):
            with gzip.open(root / "en" / f"c4-{split}.{s:05d}-of-01024.json.gz", "wt") as f:
                for i, text in enumerate(rows[s::shards]):
                    f.write(
                        json.dumps(
                            {
                                "text": text,
                                "timestamp": "2019-04-25T12:57:54Z",
                                "url": f"https://example.org/{split}/{s}/{i}",
                            }
                        )
                        + "\n"
                    )
    return root


@pytest.fixture(scope="module")
def c4_mds(pytestconfig, tiny_tokenizer) -> Path:
    """`hpc-llm data prepare c4` from local C4 files: LLM Foundry's converter, real MDS shards.
    Converted once per test session (~10 s: the converter starts the training stack): the first
    xdist worker to ask converts under a lock, the others read what it wrote."""
    import fcntl
    import os
    import shutil

    from tests.conftest import session_dir

    where = session_dir(pytestconfig) / "c4"
    out = where / "data" / "c4"
    with open(str(where) + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (where / ".done").exists():
            return out
        shutil.rmtree(where, ignore_errors=True)
        source = write_c4_like(where / "allenai-c4")
        proc = run_cli(
            [
                "data",
                "prepare",
                "c4",
                "--out",
                str(out),
                "--source",
                str(source),
                "--splits",
                "train,val_small",
                f"data.options.tokenizer={tiny_tokenizer}",
                "data.options.concat_tokens=128",
            ],
            dict(os.environ),
            timeout=600,
        )
        assert proc.returncode == 0, explain(proc)
        (where / ".done").touch()
    return out


@pytest.mark.stack  # c4_mds: LLM Foundry's converter
def test_prepared_c4_shards_hold_packed_token_samples(c4_mds):
    from streaming import StreamingDataset

    for split in ("train", "val_small"):
        index = json.loads((c4_mds / split / "index.json").read_text())
        assert index["shards"][0]["column_names"] == ["tokens"]
    ds = StreamingDataset(local=str(c4_mds), split="train", shuffle=False, batch_size=1)
    assert len(ds) > 50
    sample = ds[0]["tokens"]
    assert len(sample) == 128 and int(sample.max()) < 512


@pytest.mark.stack
def test_prepare_refuses_to_overwrite(c4_mds, app_env, tmp_path):
    proc = run_cli(
        ["data", "prepare", "c4", "--out", str(c4_mds), "--source", str(tmp_path), "--splits", "train"], app_env
    )
    assert proc.returncode == 2, explain(proc)
    assert "split 'train' exists already" in proc.stderr


@pytest.mark.train
def test_pretraining_on_prepared_c4_with_an_icl_task(c4_mds, tiny_tokenizer, app_env, runs_dir, tmp_path):
    """Held-out eval on the prepared shards, plus an LLM Foundry ICL task from a local file."""
    from hpc_llm.data import tiny_corpus

    icl = tmp_path / "tiny_lm.jsonl"
    with icl.open("w") as f:
        for line in tiny_corpus.corpus_lines()[-30:]:
            words = line.split()
            f.write(json.dumps({"context": " ".join(words[:12]), "continuation": " " + " ".join(words[12:15])}) + "\n")
    task = f"[{{label: tiny_lm, dataset_uri: {icl}, num_fewshot: [0], icl_task_type: language_modeling}}]"
    proc = run_app(
        [
            "+experiment=mpt_tiny",
            "data=c4",
            f"data.path={c4_mds}",
            f"data.options.tokenizer={tiny_tokenizer}",
            "train.max_duration=6ba",
            "eval=heldout",
            "resources.tasks_per_node=1",
            f"+train.icl_tasks={task}",
        ],
        app_env,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, explain(proc)
    [r] = results_of(runs_dir)
    assert r["status"] == "completed" and r["batches_done"] == 6, r.get("error")
    assert r["tokens_done"] == 6 * 8 * 128 and r["eval"]["loss"] > 0 and r["world_size"] == 1
    assert 0 <= r["eval"]["icl"]["tiny_lm/0-shot/InContextLearningLMAccuracy"] <= 1


@pytest.mark.parametrize("name", SEED_EXPERIMENTS)
def test_every_seed_experiment_prints_its_llm_foundry_config(name, data_root, cli):
    assert name in EXPERIMENTS
    train = yaml.safe_load(cli("config", f"+experiment={name}"))
    assert train["precision"] == "amp_bf16" and train["fsdp_config"]["sharding_strategy"] == "FULL_SHARD"
    assert train["train_loader"]["num_workers"] == 8  # H100 nodes load data in worker processes
    if name.endswith("_c4"):
        assert train["model"]["name"] == "mpt_causal_lm" and train["tokenizer"]["name"] == "EleutherAI/gpt-neox-20b"
        assert train["train_loader"]["dataset"]["local"] == str((data_root / "c4").resolve())
        assert train["scheduler"] == {"name": "cosine_with_warmup", "t_warmup": "100ba", "alpha_f": 0.1}
    else:
        assert train["model"]["name"] == "hf_causal_lm" and train["max_duration"] == "2ep"
        assert train["eval_interval"] == "1ep" and train["train_loader"]["name"] == "finetuning"


# The seeds' Table 1 and LLM Foundry's yamls: (max_duration, eval_interval, global batch, lr)
TABLE_1 = {
    "mpt125m_c4": ("4800ba", "1000ba", 256, 6.0e-4),
    "mpt350m_c4": ("13400ba", "1000ba", 256, 3.0e-4),
    "mpt760m_c4": ("29000ba", "2000ba", 256, 2.5e-4),
    "mpt1b_c4": ("24800ba", "2000ba", 512, 2.0e-4),
    "mpt7b_c4": ("63900ba", "5000ba", 1024, 1.2e-4),
    "mpt70b_c4": ("333800ba", "10000ba", 2048, 8.0e-5),
}


@pytest.mark.parametrize("name", sorted(TABLE_1))
def test_pretraining_experiments_follow_the_seeds_and_llm_foundry(name, cli):
    train = yaml.safe_load(cli("config", f"+experiment={name}"))
    duration, interval, gbs, lr = TABLE_1[name]
    assert (train["max_duration"], train["eval_interval"], train["global_train_batch_size"]) == (
        duration,
        interval,
        gbs,
    )
    assert train["optimizer"]["lr"] == lr and train["max_seq_len"] == 2048


def test_finetuning_experiments_use_the_seeds_datasets(cli):
    dolly = yaml.safe_load(cli("config", "+experiment=mpt7b_dolly"))
    assert dolly["train_loader"]["dataset"]["hf_name"] == "mosaicml/dolly_hhrlhf"
    assert dolly["eval_loader"]["dataset"]["split"] == "test"
    assert dolly["model"]["pretrained_model_name_or_path"] == "mosaicml/mpt-7b"
    instruct = yaml.safe_load(cli("config", "+experiment=mpt30b_instruct"))
    assert instruct["train_loader"]["dataset"]["hf_name"] == "kowndinya23/instruct-v3"
    assert instruct["eval_loader"]["dataset"]["split"] == "validation"
    assert instruct["train_loader"]["dataset"]["packing_ratio"] == 9 and instruct["max_seq_len"] == 8192


@pytest.mark.parametrize("nodes", [1, 2, 4, 8])
def test_mpt125m_c4_renders_for_h100_nodes(nodes, cli):
    text = cli("render", "+experiment=mpt125m_c4", f"resources.nodes={nodes}", *FIXED)
    golden = GOLDEN / f"sbatch_mpt125m_c4_h100_{nodes}nodes.sh"
    if not golden.exists():
        golden.write_text(text)
        pytest.fail(f"wrote missing golden file {golden}; check it and commit it")
    assert text == golden.read_text(), f"render changed; delete {golden} to regenerate"


@pytest.mark.parametrize("name", SEED_EXPERIMENTS)
def test_every_seed_experiment_renders_for_8_h100_nodes(name, cli):
    text = cli("render", f"+experiment={name}", "resources.nodes=8", *FIXED)
    for line in (
        "#SBATCH --nodes=8",
        "#SBATCH --gpus-per-node=8",
        "#SBATCH --ntasks-per-node=8",
        f"#SBATCH --job-name=hpc_llm-{name}",
        "export TORCH_NCCL_ASYNC_ERROR_HANDLING=1",
    ):
        assert line in text
    # cluster=h100 is generic: one site's fabric lives in a site profile (docs/examples/site)
    assert "NCCL_IB_HCA" not in text and "NCCL_IB_GID_INDEX" not in text


def write_dolly_like(root: Path, columns=("prompt", "response"), splits=("train", "test")) -> Path:
    """mosaicml/dolly_hhrlhf's schema: one prompt/response pair per row."""
    from hpc_llm.data import tiny_corpus

    lines = tiny_corpus.corpus_lines()
    root.mkdir(parents=True, exist_ok=True)
    for split, rows in zip(splits, (lines[:200], lines[200:260]), strict=True):
        with (root / f"{split}.jsonl").open("w") as f:
            for text in rows:
                words = text.split()
                cut = max(3, min(20, len(words) // 3))
                prompt = "Continue the text: " + " ".join(words[:cut]) + "\n"
                f.write(json.dumps({columns[0]: prompt, columns[1]: " ".join(words[cut : cut + 40])}) + "\n")
    return root


@pytest.mark.train
def test_finetuning_a_tiny_mpt_on_local_dolly_schema_data(tiny_tokenizer, app_env, runs_dir, tmp_path):
    data = write_dolly_like(tmp_path / "dolly")
    proc = run_app(
        [
            "+experiment=mpt_tiny",
            "data=finetuning",
            f"data.path={data}",
            f"data.options.tokenizer={tiny_tokenizer}",
            "train.max_duration=2ep",
            "eval.interval=1ep",
            "train.global_train_batch_size=32",
            "train.device_train_microbatch_size=16",
            "resources.tasks_per_node=1",
            "eval=heldout",
        ],
        app_env,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, explain(proc)
    [r] = results_of(runs_dir)
    assert r["status"] == "completed", r.get("error")
    assert r["batches_done"] == 2 * (200 // 32)  # two epochs of the 200 training rows
    assert r["train_loss"] < r["train_loss_first"]
    assert 0 < r["eval"]["token_accuracy"] <= 1 and r["eval"]["loss"] > 0
    config = yaml.safe_load((Path(r["run_dir"]) / "train_config.yaml").read_text())
    assert config["train_loader"]["name"] == "finetuning"
    assert config["train_loader"]["dataset"]["hf_name"] == str(data)


def test_prepare_finetuning_data_for_offline_nodes(app_env, tmp_path):
    """A dataset with other column names -> <out>/<split>.jsonl with prompt/response."""
    src = write_dolly_like(tmp_path / "src", columns=("instruction", "output"))
    out = tmp_path / "out"
    proc = run_cli(
        [
            "data",
            "prepare",
            "finetuning",
            "--out",
            str(out),
            "--source",
            str(src),
            "--splits",
            "train,test",
            "data.options.prompt_column=instruction",
            "data.options.response_column=output",
        ],
        app_env,
        timeout=600,
    )
    assert proc.returncode == 0, explain(proc)
    rows = [json.loads(line) for line in (out / "test.jsonl").read_text().splitlines()]
    assert len(rows) == 60 and set(rows[0]) == {"prompt", "response"}
    assert rows[0]["prompt"].startswith("Continue the text:")


BAD = [
    (
        ["data=finetuning", "data.path={bad_schema}"],
        "has columns instruction, output but no 'prompt' or 'response'; a finetuning dataset needs prompt and response",
    ),
    (["data=finetuning", "data.path={dolly}", "data.eval_split=validation"], "has no file for split 'validation'"),
    (["data=finetuning"], "needs data.options.hf_name"),
    (
        ["+train.tokenizer.name=EleutherAI/gpt-neox-20b"],
        "has 50277 tokens but train.model.vocab_size=512; allowed: vocab_size >= 50277 (e.g. 50304",
    ),
    (["train.global_train_batch_size=7"], "train.global_train_batch_size=7 is not divisible by the world size 2"),
    (["train.global_train_batch_size=12"], "is not divisible by world size 2 x micro-batch 4 (6 samples per rank)"),
    (["data=c4", "data.path={tmp}/nowhere"], "has no MDS split 'train'; build it with `hpc-llm data prepare c4"),
    (
        ["+eval.options.inference.prompt=Hi", "eval=heldout"],
        "eval.options.inference: 'inference' is not in eval.evaluators",
    ),
    (["eval.evaluators=[heldout,inference]"], "list hf_convert before it"),
]


@pytest.mark.parametrize("overrides,message", BAD, ids=[" ".join(b[0]) for b in BAD])
def test_bad_data_and_batch_input_is_one_line_before_training(overrides, message, app_env, runs_dir, tmp_path):
    dolly = write_dolly_like(tmp_path / "dolly")
    bad_schema = write_dolly_like(tmp_path / "bad", columns=("instruction", "output"))
    overrides = [o.format(dolly=dolly, bad_schema=bad_schema, tmp=tmp_path) for o in overrides]
    proc = run_app(["+experiment=mpt_tiny", *overrides], app_env, cwd=tmp_path, timeout=120)
    assert proc.returncode == 2, explain(proc)
    [line] = proc.stderr.strip().splitlines()
    assert message in line, line
    assert not runs_dir.exists()


@pytest.mark.parametrize("command", ["config", "render"])
def test_previews_work_before_the_data_is_prepared_and_submitting_does_not(command, app_env, tmp_path):
    """A user looks at the job before preparing hundreds of GB of C4: a warning, not an error."""
    missing = tmp_path / "no_c4_yet"
    env = dict(app_env, HPC_LLM_HOME=str(tmp_path / "home"))
    proc = run_cli([command, "+experiment=mpt7b_c4", f"data.path={missing}"], env)
    assert proc.returncode == 0, explain(proc)
    [warning] = [ln for ln in proc.stderr.splitlines() if "no MDS split" in ln]
    assert warning.startswith("hpc_llm: warning: ") and "a preview; submitting the run would stop here" in warning
    assert ("global_train_batch_size: 1024" if command == "config" else "#SBATCH --nodes=1") in proc.stdout
    submit = run_app(
        ["+experiment=mpt7b_c4", f"data.path={missing}", "hydra/launcher=slurm", "hydra.launcher.dry_run=true"],
        env,
        cwd=tmp_path,
    )
    assert submit.returncode == 2, explain(submit)
    [line] = submit.stderr.strip().splitlines()
    assert line.startswith("hpc_llm: error: ") and "has no MDS split 'train'" in line
    assert not (tmp_path / "runs").exists()
