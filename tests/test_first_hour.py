"""The first hour of an LLM Foundry user (issue 32): mistakes caught before the queue by the
code the job runs, relative paths as LLM Foundry means them, a failure that names its
exception, and answers to the habits people bring from Slurm, Hydra and LLM Foundry.

LLM Foundry's own train yamls (tests/foundry_yamls/, v0.22.0, Apache-2.0: see its NOTICE)
are fed to ``hpc-llm config`` and, as one sweep, to the check before the queue.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT, explain, results_of, run_app, run_cli
from tests.test_containers import apptainer, images_dir, sandbox  # noqa: F401 - fixtures

FOUNDRY = ROOT / "tests" / "foundry_yamls"
UPSTREAM = sorted(FOUNDRY.glob("*/*.yaml"))
#: the two LLM Foundry itself refuses (make_dataclass_and_log_config: a top-level key that is no
#: TrainConfig field), with its words
REFUSED = {
    "finetune/1b_local_data_sft.yaml": "Unused parameters ['dataset'] found in cfg",
    "finetune/mpt-30b-instruct.yaml": "Unused parameters ['icl_max_seq_len'] found in cfg",
}
ACCEPTED = [p for p in UPSTREAM if p.relative_to(FOUNDRY).as_posix() not in REFUSED]
#: a dry run of the Slurm launcher with no Slurm: everything is checked, nothing submitted
DRY = ["hydra/launcher=slurm", "hydra.launcher.dry_run=true"]


def checked(env: dict[str, str]) -> dict[str, str]:
    """``env`` with the check before the queue on (the suite turns it off elsewhere)."""
    return {**env, "HPC_LLM_PRECHECK": "1"}


@pytest.fixture(autouse=True)
def no_checker_left(app_env: dict[str, str]):
    """The warm checkers a test's submits started (docs/guides/precheck.md), stopped after it."""
    yield
    if (Path(app_env["HPC_LLM_HOME"]) / "precheck" / "checkers").is_dir():  # the check ran
        proc = run_cli(["check", "--stop"], app_env)
        assert proc.returncode == 0, explain(proc)


def errors(proc: subprocess.CompletedProcess) -> list[str]:
    return [ln.removeprefix("hpc_llm: error: ") for ln in proc.stderr.splitlines() if ln.startswith("hpc_llm: error:")]


def test_upstream_yamls_are_all_here():
    assert len(UPSTREAM) == 26 and (FOUNDRY / "LICENSE").is_file() and (FOUNDRY / "NOTICE").is_file()
    uses_c4 = [p for p in UPSTREAM if "./my-copy-c4" in p.read_text()]
    assert len(uses_c4) == 17, uses_c4  # the issue counted 18 stopping there: gpt2-arc-easy's ./my_data


# -- the check before the queue, through the job's own code ------------------------------------


@pytest.mark.stack
def test_bad_values_stop_the_sweep_before_anything_exists(app_env, runs_dir, tmp_path):
    """Each of the issue's values, given together: one line each, naming the key the user set;
    the sweep's one bad point stops all three; nothing is created."""
    args = [
        "+experiment=mpt_tiny",
        *DRY,
        "train.optimizer.lrr=1e-3",
        "train.precision=amp_bf17",
        "train.scheduler.name=cosine_warmup",
        "train.eval_interval=5xx",
        "checkpoint.interval=10xx",
        "train.model.d_model=66",  # not a multiple of n_heads: MPTConfig says so, without building the model
        "train.max_duration=4ba,6ba,xyz",
    ]
    proc = run_app(args, checked(app_env), cwd=tmp_path)
    assert proc.returncode == 2, explain(proc)
    said = errors(proc)
    for line in (
        "train.optimizer.lrr=0.001: TypeError: DecoupledAdamW.__init__() got an unexpected keyword argument 'lrr'; "
        "allowed: lr, betas, eps, weight_decay, amsgrad (in every point of the sweep, 3)",
        "train.precision='amp_bf17': ValueError: Value amp_bf17 not found in Precision; allowed: fp32, amp_fp16, "
        "amp_bf16, amp_fp8",
        "train.scheduler.name='cosine_warmup': LLM Foundry has no scheduler 'cosine_warmup'; allowed: "
        "constant_with_warmup, cosine_with_warmup",
        "train.eval_interval='5xx': ValueError: Invalid time string: 5xx; allowed:",
        "checkpoint.interval='10xx': ValueError: Invalid time string: 10xx",
        "train.model: ValueError: d_model must be divisible by n_heads; allowed: an MPT config",
        "train.max_duration='xyz': ValueError: Invalid time string: xyz; allowed: an integer and a unit: ba, ep, "
        "sp, tok (e.g. 100ba, 1ep, 2e6tok) (in job 2 [train.max_duration=xyz])",
    ):
        assert any(s.startswith(line) for s in said), (line, said)
    assert not any("max_duration='4ba'" in s or "max_duration='6ba'" in s for s in said)
    assert not runs_dir.exists() and not (tmp_path / "outputs").exists()
    # off: the same sweep is written (a dry run), its values unchecked
    off = run_app([*args, "precheck.enabled=false"], checked(app_env), cwd=tmp_path)
    assert off.returncode == 0, explain(off)
    assert len(list(runs_dir.rglob("sbatch.sh"))) == 3


@pytest.mark.stack
def test_a_loader_with_num_workers_0_is_refused_by_config(app_env, tmp_path):
    """LLM Foundry's text loader passes prefetch_factor=2 and persistent_workers=true unless told
    otherwise, which torch refuses with num_workers: 0, in the job. Now `hpc-llm config` says so."""
    tiny = yaml.safe_load(run_cli(["config", "+experiment=mpt_tiny", "--as-yaml"], app_env).stdout)
    for key in ("prefetch_factor", "persistent_workers"):
        tiny["train_loader"].pop(key)
    (tmp_path / "zero.yaml").write_text(yaml.safe_dump(tiny))
    proc = run_cli(["config", f"yaml={tmp_path / 'zero.yaml'}"], checked(app_env))
    assert proc.returncode == 2, explain(proc)
    [line] = errors(proc)
    assert line.startswith("train.train_loader.num_workers=0: num_workers: 0, prefetch_factor: 2, persistent_workers:")
    assert "LLM Foundry's default" in line
    assert "allowed: num_workers > 0, or num_workers: 0 with prefetch_factor: null" in line


def test_a_job_environment_missing_here_is_said_once_and_skipped(app_env, tmp_path, runs_dir):
    args = ["+experiment=mpt_tiny", *DRY, "hydra.launcher.python=/nowhere/bin/python", "train.max_duration=4ba,xyz"]
    proc = run_app(args, checked(app_env), cwd=tmp_path)
    assert proc.returncode == 0, explain(proc)
    said = [ln for ln in proc.stderr.splitlines() if "/nowhere/bin/python" in ln]
    assert len(said) == 1 and "train configs not checked before submitting" in said[0], proc.stderr


@pytest.mark.stack
def test_the_check_runs_in_the_image_through_the_container_runtime(apptainer, sandbox, app_env, tmp_path, runs_dir):  # noqa: F811
    """container=apptainer: the check runs the image's python (apptainer exec, as the ranks start)."""
    import os
    import sys

    from tests.skeleton import host_binds

    binds = host_binds()
    venv = os.path.realpath(sys.prefix)  # where a checkout without its own .venv (a worktree) finds it
    if not any(venv == b or venv.startswith(b + "/") for b in binds):
        binds.append(venv)
    args = ["+experiment=mpt_tiny", *DRY, "container=apptainer", f"container.image={sandbox}"]
    args.append("container.binds=[" + ",".join(binds) + "]")
    proc = run_app([*args, "train.max_duration=1xx"], checked(app_env), cwd=tmp_path)
    assert proc.returncode == 2, explain(proc)
    assert errors(proc)[0].startswith("train.max_duration='1xx': ValueError: Invalid time string: 1xx"), proc.stderr
    assert not runs_dir.exists()
    # the image's warm checker (its directories bound in) answers the same again from the cache
    again = run_app([*args, "train.max_duration=1xx"], checked(app_env), cwd=tmp_path)
    assert again.returncode == 2 and errors(again) == errors(proc), explain(again)
    assert "1 point, from the cache; " in again.stderr and f"(the image {sandbox})" in again.stderr, again.stderr
    status = run_cli(["check", "--status"], app_env)
    assert f"the image {sandbox}: pid" in status.stdout, explain(status)
    missing = run_app([*args, "container.executable=/nowhere/apptainer"], checked(app_env), cwd=tmp_path)
    assert "/nowhere/apptainer (container.executable) is not on this machine" in missing.stderr, explain(missing)


@pytest.mark.stack
def test_upstream_yamls_llm_foundry_accepts_pass_the_check_as_one_sweep(app_env, tmp_path, runs_dir):
    """The 24 yamls LLM Foundry accepts, as one sweep over yaml= (one checking process for all), from a
    directory holding their data: every point passes the check through the job's own code."""
    for name in ("my-copy-c4", "my_data", "my-adaptation-data"):
        (tmp_path / name).mkdir()
    icl_files(
        tmp_path, ["a b c d e f g h i j k l m n o"], "tasks_v0.2.yaml", "eval_gauntlet_v0.2.yaml"
    )  # gpt-neo-125m_eval's
    sweep = "yaml=" + ",".join(str(p) for p in ACCEPTED)
    proc = run_app([sweep, *DRY, "resources.tasks_per_node=8"], checked(app_env), cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, explain(proc)
    assert len(list(runs_dir.rglob("sbatch.sh"))) == len(ACCEPTED) == 24
    # their run_name: null is no choice of the user's; mpt-small-cpu's own name is said once
    assert "run_name=None" not in proc.stderr and proc.stderr.count("is not used: hpc_llm names the run") == 1
    assert "train configs not checked" not in proc.stderr


@pytest.mark.parametrize("path", UPSTREAM, ids=[p.relative_to(FOUNDRY).as_posix() for p in UPSTREAM])
def test_each_upstream_yaml_in_hpc_llm_config(path, app_env, tmp_path):
    """Given its data path, `hpc-llm config` passes every yaml LLM Foundry accepts and refuses the
    two it refuses, with its reason; a relative data path is shown made absolute."""
    (tmp_path / "my-copy-c4").mkdir()
    (tmp_path / "my_data").mkdir()
    (tmp_path / "my-adaptation-data").mkdir()
    proc = run_cli(["config", f"yaml={path}"], app_env, cwd=tmp_path)
    refused = REFUSED.get(path.relative_to(FOUNDRY).as_posix())
    if refused:
        assert proc.returncode == 2, explain(proc)
        [line] = errors(proc)
        assert refused in line and "Please place any variables under the `variables` key" in line, line
        return
    assert proc.returncode == 0, explain(proc)
    train = yaml.safe_load(proc.stdout.partition("\n# what hpc_llm added")[0])
    text = path.read_text()
    if "local: ${variables.data_local}" in text and "data_remote:  #" in text:
        local = (
            train["train_loader"]["dataset"].get("local")
            or next(iter(train["train_loader"]["dataset"]["streams"].values()))["local"]
        )
        assert Path(local).is_absolute() and Path(local).parent == tmp_path, local
    warnings = [ln for ln in proc.stderr.splitlines() if "warning" in ln]
    named = yaml.safe_load(text).get("variables", {}).get("run_name")
    assert sum("run_name" in w for w in warnings) == (1 if named else 0), warnings
    assert sum("need a GPU" in w for w in warnings) <= 1, warnings
    if "autoresume: false" in text:  # mpt-small-cpu.yaml: LLM Foundry's CPU yaml runs, and says why once
        assert sum("autoresume: false and no save_folder" in w for w in warnings) == 1 and train["autoresume"]


# -- paths as LLM Foundry means them ------------------------------------------------------------


def test_relative_data_is_taken_from_the_submit_dir_and_missing_data_is_one_rule(app_env, tmp_path):
    """./my-copy-c4 means the directory the user submits from; where it is missing, `config` warns
    (as it does for a preset's data) naming train.variables.data_local, and a submit refuses."""
    yml = str(FOUNDRY / "pretrain" / "testing.yaml")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shown = run_cli(["config", f"yaml={yml}"], app_env, cwd=elsewhere)
    assert shown.returncode == 0, explain(shown)
    [warned] = [ln for ln in shown.stderr.splitlines() if "does not exist" in ln]
    assert f"train.variables.data_local: {elsewhere / 'my-copy-c4'} does not exist" in warned
    assert "(a preview; submitting the run would stop here)" in warned
    preset = run_cli(["config", "+experiment=mpt125m_c4", "data.path=/nowhere/c4"], app_env, cwd=elsewhere)
    assert preset.returncode == 0, explain(preset)  # the same rule for a preset's data
    assert "data.path='/nowhere/c4' has no MDS split" in preset.stderr and "(a preview;" in preset.stderr
    refused = run_app([f"yaml={yml}", *DRY], app_env, cwd=elsewhere)
    assert refused.returncode == 2, explain(refused)
    [line] = errors(refused)
    assert line.startswith(f"yaml={yml}: train.variables.data_local: {elsewhere / 'my-copy-c4'} does not exist")
    assert "allowed: a path the nodes see, or a remote URI: train.variables.data_local=PATH" in line
    # a local that caches a remote is the node's cache: left as written, never checked
    cached = run_cli(["config", f"yaml={yml}", "train.variables.data_remote=s3://bucket/c4"], app_env, cwd=elsewhere)
    assert cached.returncode == 0 and "does not exist" not in cached.stderr, explain(cached)
    assert yaml.safe_load(cached.stdout.partition("\n#")[0])["train_loader"]["dataset"]["local"] == "./my-copy-c4"
    # with the data there, the absolute path is what the job gets, shown as a change against the file
    (elsewhere / "my-copy-c4").mkdir()
    ok = run_cli(["config", f"yaml={yml}"], app_env, cwd=elsewhere)
    assert f"+    local: {elsewhere / 'my-copy-c4'}" in ok.stdout and "-    local: ./my-copy-c4" in ok.stdout, ok.stdout


def icl_files(where: Path, lines: list[str], tasks: str = "tasks.yaml", gauntlet: str = "gauntlet.yaml") -> None:
    """LLM Foundry's layout under ``where``: eval/yamls/<tasks> naming eval/local_data/tiny_lm.jsonl
    (relative, as its own tasks files name theirs), eval/yamls/<gauntlet>."""
    (where / "eval" / "yamls").mkdir(parents=True)
    (where / "eval" / "local_data").mkdir()
    with (where / "eval" / "local_data" / "tiny_lm.jsonl").open("w") as f:
        for line in lines:
            words = line.split()
            f.write(json.dumps({"context": " ".join(words[:12]), "continuation": " " + " ".join(words[12:15])}) + "\n")
    (where / "eval" / "yamls" / tasks).write_text(
        "icl_tasks:\n- label: tiny_lm\n  dataset_uri: eval/local_data/tiny_lm.jsonl\n  num_fewshot: [0]\n"
        "  icl_task_type: language_modeling\n"
    )
    (where / "eval" / "yamls" / gauntlet).write_text(
        "eval_gauntlet:\n  weighting: EQUAL\n  subtract_random_baseline: true\n  rescale_accuracy: true\n"
        "  categories:\n  - name: lm\n    benchmarks:\n    - name: tiny_lm\n      num_fewshot: 0\n"
        "      random_baseline: 0\n"
    )


def test_icl_task_files_and_their_datasets_are_read_from_the_submit_dir(app_env, tmp_path):
    """`icl_tasks: eval/yamls/tasks.yaml` and the `dataset_uri`s in it mean the directory LLM Foundry
    runs in: the file is read from the submit dir, inlined, and its datasets made absolute and
    checked there; a missing dataset is refused naming the tasks file it was written in."""
    base = yaml.safe_load((FOUNDRY / "pretrain" / "testing.yaml").read_text())
    base.update(icl_tasks="eval/yamls/tasks.yaml", eval_gauntlet="eval/yamls/gauntlet.yaml")
    yml = tmp_path / "with_icl.yaml"
    yml.write_text(yaml.safe_dump(base))
    (tmp_path / "my-copy-c4").mkdir()
    icl_files(tmp_path, ["a b c d e f g h i j k l m n o p"] * 3)
    shown = run_cli(["config", f"yaml={yml}"], app_env, cwd=tmp_path)
    assert shown.returncode == 0 and "does not exist" not in shown.stderr, explain(shown)
    train = yaml.safe_load(shown.stdout.partition("\n# what hpc_llm added")[0])
    [task] = train["icl_tasks"]
    assert task["dataset_uri"] == str(tmp_path / "eval" / "local_data" / "tiny_lm.jsonl") and task["label"] == "tiny_lm"
    assert train["eval_gauntlet"]["categories"][0]["name"] == "lm" and "icl_tasks_str" not in train
    (tmp_path / "eval" / "local_data" / "tiny_lm.jsonl").unlink()
    refused = run_app([f"yaml={yml}", *DRY], app_env, cwd=tmp_path)
    assert refused.returncode == 2, explain(refused)
    [line] = errors(refused)
    missing = tmp_path / "eval" / "local_data" / "tiny_lm.jsonl"
    assert line.startswith(f"yaml={yml}: icl_tasks[0].dataset_uri in eval/yamls/tasks.yaml: {missing} does not exist")
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())
    # the tasks file itself missing: the same rule, naming the key the yaml sets
    shutil.rmtree(tmp_path / "eval")
    gone = run_app([f"yaml={yml}", *DRY], app_env, cwd=tmp_path)
    assert gone.returncode == 2, explain(gone)
    assert errors(gone)[0].startswith(f"yaml={yml}: train.icl_tasks: {tmp_path / 'eval/yamls/tasks.yaml'} does not")


def test_own_save_folder_with_autoresume_false_is_still_refused(app_env, tmp_path):
    text = (FOUNDRY / "pretrain" / "mpt-small-cpu.yaml").read_text()
    (tmp_path / "my-copy-c4").mkdir()
    (tmp_path / "mine.yaml").write_text(text + "save_folder: ./ckpt\n")
    proc = run_cli(["config", f"yaml={tmp_path / 'mine.yaml'}"], app_env, cwd=tmp_path)
    assert proc.returncode == 2, explain(proc)
    assert "sets autoresume: false with its own save_folder" in errors(proc)[0]


# -- habits --------------------------------------------------------------------------------------

HABITS = [
    (["experiment=mpt_tiny"], "did you mean +experiment=mpt_tiny?"),
    (["variables.data_local=/x"], "did you mean train.variables.data_local=/x?"),
    (["model.d_model=128"], "did you mean train.model.d_model=128?"),
    (["optimizer.lr=1e-3"], "did you mean train.optimizer.lr=1e-3?"),
    (["hydra/launcher=slurm", "hydra.launcher.partiton=low"], "did you mean hydra.launcher.partition?"),
    (["resources.node=2"], "did you mean resources.nodes?"),
    (["train.max_duraton=8ba"], "train.max_duraton (did you mean max_duration?)"),
]


@pytest.mark.parametrize("args,hint", HABITS, ids=[" ".join(a) for a, _ in HABITS])
def test_habits_get_a_hint_in_one_line(args, hint, app_env, tmp_path, runs_dir):
    proc = run_app(args, app_env, cwd=tmp_path, timeout=120)
    assert proc.returncode == 2, explain(proc)
    [line] = errors(proc)
    assert hint in line, line
    assert not runs_dir.exists()


def test_python_m_hpc_llm_help_is_written_for_hpc_llm(app_env):
    proc = run_app(["--help"], app_env)
    assert proc.returncode == 0, explain(proc)
    for text in (
        "+experiment=NAME",
        "yaml=PATH",
        "hydra/launcher=slurm",
        "experiment: llama3_tiny, mpt125m_c4",
        "README.md",
    ):
        assert text in proc.stdout, text
    assert "powered by Hydra" not in proc.stdout


def test_every_subcommand_and_option_has_help():
    from hpc_llm.cli import build_parser

    parser = build_parser()
    [sub] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    missing = []
    for name, p in sub.choices.items():
        if not p.description:
            missing.append(f"{name}: no description")
        for action in p._actions:
            if not isinstance(action, argparse._HelpAction) and not action.help:
                missing.append(f"{name}: {action.dest}")
    assert not missing, missing


def test_estimate_takes_overrides_anywhere_and_shows_the_keep_the_run_gets(app_env, tmp_path):
    (tmp_path / "my-copy-c4").mkdir()
    yml = FOUNDRY / "pretrain" / "mpt-125m.yaml"
    args = ["estimate", f"yaml={yml}", "--nodes", "1", "8", "train.max_duration=100ba", "cluster=h100"]
    proc = run_cli(args, app_env, cwd=tmp_path)
    assert proc.returncode == 0, explain(proc)
    assert "the run keeps every checkpoint (checkpoint.keep=-1" in proc.stdout
    assert "keep the last 3" not in proc.stdout
    preset = run_cli(["estimate", "+experiment=mpt125m_c4", "--nodes", "8", "cluster=h100"], app_env)
    assert "the run keeps the last 3 (checkpoint.keep)" in preset.stdout, explain(preset)


def test_status_hides_dry_runs_unless_asked(app_env, tmp_path):
    assert run_app(["+experiment=mpt_tiny", *DRY], app_env, cwd=tmp_path).returncode == 0
    plain = run_cli(["status"], app_env)
    assert "DRY_RUN" not in plain.stdout and "1 dry run(s) not shown" in plain.stdout, explain(plain)
    asked = run_cli(["status", "--dry-runs"], app_env)
    assert "DRY_RUN" in asked.stdout
    cancel = run_cli(["cancel", "1"], app_env)
    assert cancel.returncode == 1 and "run 1 was a dry run (never submitted); nothing to cancel" in cancel.stderr


def test_two_submits_in_one_second_get_a_sweep_dir_each(app_env, runs_dir, tmp_path):
    """The default sweep dir is named to the second: two submits of one experiment within it once
    shared a dir, the second writing its job 0 over the first's run. ``${now:%Y}`` stands in for
    the second (a year is the same for both invocations on any machine); a dir with no
    ``${now:...}`` in it is the user's own, reused as Hydra reuses it."""
    timed = "hydra.sweep.dir=${oc.env:HPC_LLM_RUNS}/tiny/${now:%Y}"
    scripts = []
    for _ in range(3):
        proc = run_app(["+experiment=mpt_tiny", *DRY, timed], app_env, cwd=tmp_path)
        assert proc.returncode == 0, explain(proc)
        scripts.append(Path(re.search(r"batch script (\S+)", proc.stdout)[1]))
    year = str(runs_dir / "tiny" / time.strftime("%Y"))
    assert [str(s.parent.parent) for s in scripts] == [year, f"{year}_2", f"{year}_3"]
    # each job's own run dir throughout its script: none names the first's
    assert f"{year}/0" not in scripts[1].read_text() and f"{year}_2/0" in scripts[1].read_text()
    named = f"hydra.sweep.dir={runs_dir / 'mine'}"
    again = [run_app(["+experiment=mpt_tiny", *DRY, named], app_env, cwd=tmp_path) for _ in range(2)]
    assert all(p.returncode == 0 for p in again) and sorted(x.name for x in runs_dir.iterdir()) == ["mine", "tiny"]


# -- a failure that names its exception -------------------------------------------------------------


@pytest.mark.train
def test_a_failed_local_run_names_its_exception_node_and_log(app_env, runs_dir, tmp_path):
    """The first rank's exception is the last line; status shows it as the cause; logs prints each
    rank prefix once; cancel of the ended run says so; the node-local scratch is gone."""
    import socket

    scratch = tmp_path / "scratch"
    args = ["+experiment=mpt_tiny", "train.model.d_model=66", "eval=none", f"cluster.scratch={scratch}"]
    proc = run_app(args, app_env, cwd=tmp_path)
    assert proc.returncode == 1, explain(proc)
    last = proc.stderr.strip().splitlines()[-1]
    m = re.fullmatch(
        r"hpc_llm: error: job 0 failed: ValueError: d_model must be divisible by n_heads "
        r"\(rank (\d) on (\S+)\); log: (\S+)",
        last,
    )
    assert m and m.group(2) == socket.gethostname(), last
    assert Path(m.group(3)) == Path(results_of(runs_dir)[0]["run_dir"]) / "logs" / f"rank{m.group(1)}.log"
    status = run_cli(["status"], app_env)
    assert "ValueError: d_model must be" in status.stdout, status.stdout
    logs = run_cli(["logs", "1", "--rank", m.group(1)], app_env)
    assert f"[rank{m.group(1)}]: ValueError: d_model must be divisible by n_heads" in logs.stdout
    assert "]: [rank" not in logs.stdout
    cancel = run_cli(["cancel", "1"], app_env)
    assert cancel.returncode == 1 and "run 1 already ended (failed); nothing to cancel" in cancel.stderr
    assert scratch.is_dir() and not any(scratch.iterdir())  # made by the ranks, emptied at the end


# -- end to end: LLM Foundry's relative path on 2 Slurm nodes ------------------------------------


@pytest.mark.slurm
@pytest.mark.train
def test_a_foundry_yaml_with_a_relative_data_path_runs_on_2_slurm_nodes(slurm_env, cache_dir, runs_dir, tmp_path):
    """``data_local: ./my-copy-c4``, run from the directory that holds my-copy-c4, with the check
    before the queue on: two nodes, one rank each, completed. With an ICL tasks file and a
    gauntlet named as LLM Foundry's yamls name theirs (eval/yamls/..., the tasks' data
    eval/local_data/...), both relative to that directory too."""
    from hpc_llm.data import tiny_corpus
    from tests.test_foundry_yaml import PRETRAIN, corpus

    root = corpus(cache_dir)
    shutil.copytree(root / "mds", tmp_path / "my-copy-c4")
    icl_files(tmp_path, tiny_corpus.corpus_lines()[-30:])
    assert "data_local: ./my-copy-c4" in PRETRAIN.read_text()
    args = [f"yaml={PRETRAIN}", f"train.tokenizer.name={root / 'tokenizer'}", "hydra/launcher=slurm"]
    args += ["train.icl_tasks=eval/yamls/tasks.yaml", "train.eval_gauntlet=eval/yamls/gauntlet.yaml"]
    args += ["resources.nodes=2", "resources.tasks_per_node=1", "hydra.launcher.wait=true", "hydra.launcher.poll_s=1"]
    proc = run_app(args, checked(slurm_env), cwd=tmp_path)
    assert proc.returncode == 0, explain(proc)
    [r] = results_of(runs_dir)
    assert (r["nodes"], r["status"], r["batches_done"]) == (2, "completed", 12), r.get("error")
    ran = yaml.safe_load((Path(r["run_dir"]) / "train_config.yaml").read_text())
    assert ran["train_loader"]["dataset"]["local"] == str(tmp_path / "my-copy-c4")
    assert ran["icl_tasks"][0]["dataset_uri"] == str(tmp_path / "eval" / "local_data" / "tiny_lm.jsonl")
    assert 0 <= r["eval"]["icl"]["tiny_lm/0-shot/InContextLearningLMAccuracy"] <= 1, r["eval"]
    assert "default_average" in r["eval"]["gauntlet"] and "lm" in r["eval"]["gauntlet"], r["eval"]
