"""Every command in the README and in docs/ is run by a test: docs drift otherwise.

``COVERED`` maps each command of the ```bash blocks of README.md and of every
Markdown file under docs/ (the guides above all; continuations joined,
comments dropped, whitespace collapsed) to how it is run:

- :class:`Run`: this file runs it, placeholders (``<run id>``, ``<date_time>``)
  filled in from what ran before, optional ``[...]`` parts dropped, and the
  listed arguments appended where a command would otherwise train for minutes
  or submit to a GPU cluster (``train.max_duration=2ba``; ``dry_run``): the
  command's whole path up to that point is real.
- :class:`By`: another test runs it (the heavy local training runs, the
  plugin install); the test must exist and its source must hold the command's
  own arguments.
- :class:`Skip`: run by no test, for the reason it gives (one a reader can check).

A command of the docs missing here, or an entry whose command left every
doc, fails :func:`test_every_readme_command_is_covered`.
"""

from __future__ import annotations

import ast
import json
import re
import shlex
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.conftest import PY, ROOT, _free_port_block, explain, with_site
from tests.jobs import beat, paced, wait_for

README = ROOT / "README.md"
#: the Markdown files whose bash blocks are commands a reader runs
DOCS = [README, *sorted((ROOT / "docs").rglob("*.md"))]
QUICK = ["train.max_duration=2ba", "eval=none"]  # appended to training commands: seconds, not minutes


@dataclass(frozen=True)
class Run:
    argv: tuple[str, ...]  # after the program: placeholders in {braces}
    needs: str = "none"  # "none" | "slurm" | "cluster-root"
    append: tuple[str, ...] = ()
    out: str = ""  # a substring of stdout expected


@dataclass(frozen=True)
class By:
    test: str  # path::name
    tokens: tuple[str, ...] = field(default=())


@dataclass(frozen=True)
class Skip:
    reason: str


def doc_commands() -> dict[str, str]:
    """Every command of the docs' bash blocks -> the first doc (relative path) that has it."""
    cmds: dict[str, str] = {}
    for doc in DOCS:
        for block in re.findall(r"```bash\n(.*?)```", doc.read_text(), re.S):
            for line in block.replace("\\\n", " ").splitlines():
                tokens = shlex.split(line, comments=True)
                if tokens:
                    cmds.setdefault(" ".join(tokens), str(doc.relative_to(ROOT)))
    return cmds


def readme_commands() -> list[str]:
    return list(doc_commands())


def _program(cmd: str) -> tuple[str, list[str]]:
    tokens = cmd.split(" ")
    if tokens[:3] == ["python", "-m", "hpc_llm"]:
        return "app", tokens[3:]
    if tokens[0] == "hpc-llm":
        return "cli", tokens[1:]
    return "other", tokens


SITE_TEST = "tests/test_site_profiles.py::test_the_example_site_profile_carries_the_seeds_fabric"
#: the README tour's run that a job of the partition high preempts
PREEMPTED = (
    "python -m hpc_llm +experiment=mpt_tiny hydra/launcher=slurm resources.nodes=1 hydra.launcher.exclusive=true "
    "train.max_duration=300ba"
)

COVERED: dict[str, Run | By | Skip] = {
    # trainer=torchtitan (docs/reference/trainers.md)
    "bash scripts/setup-torchtitan.sh": By(
        "tests/test_constraints.py::test_the_torchtitan_environment_is_the_one_its_constraints_pin",
        ("setup-torchtitan.sh",),
    ),
    "python -m hpc_llm +experiment=llama3_tiny": By(
        "tests/test_torchtitan.py::test_a_torchtitan_checkpoint_whose_pickle_runs_a_command_is_refused",
        ('*TINY, "train.max_duration=4ba"',),
    ),
    "python -m hpc_llm +experiment=llama3_tiny hydra/launcher=slurm resources.nodes=2": By(
        "tests/test_torchtitan.py::test_a_sweep_of_two_node_counts_on_the_dev_cluster_and_its_report",
        ('"hydra/launcher=slurm"', '"resources.nodes=1,2"'),
    ),
    "hpc-llm config +experiment=llama3_tiny": By(
        "tests/test_torchtitan.py::test_config_prints_the_torchtitan_keys_the_run_gets", ('"config"',)
    ),
    # the control plane under simulation (docs/design/simulation.md)
    "python benchmarks/simulate.py --seeds 10000": By(
        "tests/test_simulation.py::test_the_replay_command_and_the_benchmark_print_what_the_docs_say",
        ('simulate.main(["--seeds"',),
    ),
    "python -m hpc_llm.sim --seed 425": By(
        "tests/test_simulation.py::test_the_replay_command_and_the_benchmark_print_what_the_docs_say",
        ('replay(["--seed", "425"])',),
    ),
    "python -m hpc_llm.sim --seed 425 --quiet": By(
        "tests/test_simulation.py::test_the_replay_command_and_the_benchmark_print_what_the_docs_say",
        ('"--quiet"',),
    ),
    # -- first lines ---------------------------------------------------------------
    "python3 -m venv .venv && .venv/bin/pip install -e .[train] -c constraints/llmfoundry.txt && .venv/bin/python -m hpc_llm +experiment=mpt_tiny": By(  # noqa: E501
        "tests/test_train_local.py::test_ddp_two_ranks", ('"+experiment=mpt_tiny"',)
    ),
    "bash scripts/setup-dev.sh && .venv/bin/python -m pytest --basetemp=$PWD/.test-tmp -q -n 2": By(".ci/run"),
    # CI's setup runs it (and the container tests fail in CI without it)
    "scripts/install-apptainer.sh": By("scripts/setup-dev.sh"),
    "python -m hpc_llm +experiment=mpt_tiny": By(
        "tests/test_train_local.py::test_ddp_two_ranks", ('"+experiment=mpt_tiny"',)
    ),
    "python -m hpc_llm +experiment=mpt_tiny parallelism=fsdp": By(
        "tests/test_train_local.py::test_fsdp_two_ranks", ('"parallelism=fsdp"',)
    ),
    "python -m hpc_llm +experiment=mpt_tiny parallelism=hsdp resources.tasks_per_node=4": By(
        "tests/test_train_local.py::test_hsdp_four_ranks_two_by_two",
        ('"parallelism=hsdp"', '"resources.tasks_per_node=4"'),
    ),
    "python -m hpc_llm +experiment=mpt_tiny train.max_duration=4ba,6ba": By(
        "tests/test_train_local.py::test_a_sweep_runs_each_point_with_its_own_config",
        ('"train.max_duration=4ba,6ba"',),
    ),
    "hpc-llm plugins": Run(("plugins",), out="data source"),
    "hpc-llm config +experiment=mpt_tiny": Run(("config", "+experiment=mpt_tiny"), out="max_duration"),
    # -- the README's tour: a fault survived (test_readme_tour_a_preemption_survived) ------
    PREEMPTED: Run(
        (
            "+experiment=mpt_tiny",
            "hydra/launcher=slurm",
            "resources.nodes=1",
            "hydra.launcher.exclusive=true",
            "train.max_duration=300ba",
        ),
        needs="slurm",
        append=("resources.tasks_per_node=1", "eval=none", "checkpoint.interval=5ba", *paced(0.1)),
        out="submitted Slurm job",
    ),
    "squeue -h -o %N -j <job id>": Run(("squeue", "-h", "-o", "%N", "-j", "{job_id}"), needs="slurm", out="n"),
    "sbatch -p high --exclusive -w <node> --wrap sleep 2": Run(
        ("sbatch", "-p", "high", "--exclusive", "-w", "{node}", "--wrap", "sleep 2"),
        needs="slurm",
        out="Submitted batch job",
    ),
    "hpc-llm wait <job id>": Run(("wait", "{job_id}", "--poll", "1"), needs="slurm"),
    "hpc-llm status <job id>": Run(("status", "{job_id}"), needs="slurm", out="preemption"),
    # -- your own LLM Foundry yaml ----------------------------------------------------
    "python -m hpc_llm yaml=mpt-125m.yaml train.variables.data_local=/scratch/c4": By(
        "tests/test_foundry_yaml.py::test_a_foundry_pretraining_yaml_runs_unchanged_with_only_its_variables_pointed_at_the_data",  # noqa: E501
        ("yaml=", "train.variables.data_local="),
    ),
    "python -m hpc_llm yaml=mpt-125m.yaml hydra/launcher=slurm resources.nodes=1,2,4,8": By(
        "tests/test_foundry_yaml.py::test_the_same_yaml_sweeps_node_counts_on_slurm",
        ("yaml=", "hydra/launcher=slurm", "resources.nodes=1,2"),
    ),
    "hpc-llm config yaml=mpt-125m.yaml": By(
        "tests/test_foundry_yaml.py::test_config_shows_what_hpc_llm_added_against_the_file", ('"config"', "yaml=")
    ),
    "hpc-llm model fetch meta-llama/Llama-3.1-8B --out /shared/models/llama-3.1-8b": By(
        "tests/test_model_fetch.py::test_fetch_writes_the_model_pinned_and_whole", ('"model", "fetch"', '"--out"')
    ),
    "hpc-llm config +experiment=mpt7b_dolly --as-yaml > mine.yaml": By(
        "tests/test_foundry_yaml.py::test_a_preset_written_out_as_yaml_trains_the_same", ('"--as-yaml"', "mine.yaml")
    ),
    "hpc-llm estimate yaml=mpt-125m.yaml cluster=h100 --nodes 8 64": By(
        "tests/test_foundry_yaml.py::test_estimate_reads_the_model_of_a_yaml", ('"estimate"', "yaml=")
    ),
    # -- on Slurm ----------------------------------------------------------------------
    "eval $(hpc-llm dev-cluster up --nodes 3)": Run(("dev-cluster", "up", "--nodes", "3"), needs="cluster-root"),
    "hpc-llm dev-cluster down": Run(("dev-cluster", "down"), needs="cluster-root"),
    "hpc-llm doctor": By(
        "tests/test_doctor.py::test_the_dev_cluster_passes_and_its_node_sees_the_run_dir",
        ('run_cli(["doctor", "+experiment=mpt_tiny", "resources.nodes=2"]',),
    ),
    "python -m hpc_llm +experiment=mpt_tiny hydra/launcher=slurm resources.nodes=2": Run(
        ("+experiment=mpt_tiny", "hydra/launcher=slurm", "resources.nodes=2"),
        needs="slurm",
        append=(*QUICK, "+hydra.launcher.extra_sbatch.begin=now+3600"),  # queued for logs/cancel
        out="submitted Slurm job",
    ),
    "python -m hpc_llm +experiment=mpt_tiny hydra/launcher=slurm resources.nodes=2 hydra.launcher.wait=true": Run(
        ("+experiment=mpt_tiny", "hydra/launcher=slurm", "resources.nodes=2", "hydra.launcher.wait=true"),
        needs="slurm",
        append=(*QUICK, "hydra.launcher.poll_s=1"),
        out="completed",
    ),
    "python -m hpc_llm +experiment=mpt_tiny hydra/launcher=slurm resources.nodes=1,2": By(
        "tests/test_slurm.py::test_node_sweep_gives_jobs_of_their_own_size_and_a_ledger", ('"resources.nodes=1,2"',)
    ),
    "hpc-llm render +experiment=mpt125m_c4 cluster=h100 resources.nodes=8": Run(
        ("render", "+experiment=mpt125m_c4", "cluster=h100", "resources.nodes=8"), out="#SBATCH --nodes=8"
    ),
    "hpc-llm status": Run(("status",), needs="slurm", out="{job_id}"),
    "hpc-llm logs <run id | job id | run dir> [--rank 3] [-f]": Run(("logs", "{run_dir}"), needs="slurm"),
    "hpc-llm cancel <run id | job id | run dir>": Run(("cancel", "{job_id}"), needs="slurm"),
    # -- your site: tests/test_site_profiles.py copies the example profile the same way ------------
    "mkdir -p ~/.config/hpc_llm/cluster": By(SITE_TEST, ('mine = tmp_path / "xdg" / "hpc_llm" / "cluster"',)),
    "cp docs/examples/site/cluster/roce_h100_example.yaml ~/.config/hpc_llm/cluster/mysite.yaml": By(
        SITE_TEST, ('"roce_h100_example.yaml"', 'shutil.copy(example, mine / "mysite.yaml")')
    ),
    "hpc-llm render +experiment=mpt125m_c4 cluster=mysite resources.nodes=8": By(
        SITE_TEST, ('["render", "+experiment=mpt125m_c4", "cluster=mysite", "resources.nodes=8"',)
    ),
    "hpc-llm config cluster=mysite": By(SITE_TEST, ('["config", "cluster=mysite"]',)),
    "HPC_LLM_CONFIG_PATH=docs/examples/site hpc-llm render +experiment=mpt125m_c4 cluster=roce_h100_example": By(
        SITE_TEST,
        (
            "HPC_LLM_CONFIG_PATH=str(example.parents[1])",
            '["render", "+experiment=mpt125m_c4", "cluster=roce_h100_example"',
        ),
    ),
    # -- sweeps --------------------------------------------------------------------------
    "python -m hpc_llm +experiment=mpt_tiny hydra/launcher=slurm resources.nodes=1 train.optimizer.lr=1e-4,2e-4,3e-4 hydra.launcher.array_parallelism=2": Run(  # noqa: E501
        (
            "+experiment=mpt_tiny",
            "hydra/launcher=slurm",
            "resources.nodes=1",
            "train.optimizer.lr=1e-4,2e-4,3e-4",
            "hydra.launcher.array_parallelism=2",
        ),
        needs="slurm",
        append=(*QUICK, "resources.tasks_per_node=1"),
        out="Slurm job array",
    ),
    "hpc-llm wait outputs/mpt_tiny/<date_time>": Run(("wait", "{sweep_dir}", "--poll", "1"), needs="slurm"),
    "hpc-llm report outputs/mpt_tiny/<date_time> --wait": Run(
        ("report", "{sweep_dir}", "--wait", "--poll", "1"), needs="slurm", out="| completed |"
    ),
    "python -m hpc_llm +experiment=mpt_tiny hydra/launcher=slurm hydra.launcher.snapshot=true": Run(
        ("+experiment=mpt_tiny", "hydra/launcher=slurm", "hydra.launcher.snapshot=true"),
        needs="slurm",
        append=(*QUICK, "hydra.launcher.dry_run=true"),
        out="dry run",
    ),
    # -- accounting and trackers ------------------------------------------------------------------
    "hpc-llm status <run id | job id | run dir>": Run(("status", "{job_id}"), needs="slurm", out="attempts of run"),
    "hpc-llm estimate --compare outputs/mpt_tiny/<date_time> --peak-flops 1e11 --mfu 0.5": By(
        "tests/test_accounting.py::test_a_completed_two_node_run_in_status_and_report",
        ('"--compare"', '"--peak-flops", "1e11", "--mfu", "0.5"'),
    ),
    "python -m hpc_llm +experiment=mpt_tiny logger=mlflow logger.tracking_uri=http://127.0.0.1:5000": By(
        "tests/test_trackers.py::test_a_run_logs_to_one_mlflow_run_named_after_it",
        ('"logger=mlflow"', 'f"logger.tracking_uri={mlflow_server}"'),
    ),
    "WANDB_MODE=offline python -m hpc_llm +experiment=mpt_tiny logger=wandb": By(
        "tests/test_trackers.py::test_a_resumed_run_keeps_its_wandb_run_offline",
        ('WANDB_MODE="offline"', '"logger=wandb"'),
    ),
    # -- the seeds' experiments: rendered for the GPU cluster, not submitted -------------------
    "hpc-llm data prepare c4 --out $HPC_LLM_DATA/c4 --splits train,val_small": By(
        "tests/test_seed_experiments.py::c4_mds", ('"prepare"', '"c4"', '"--out"', '"--splits"')
    ),
    "python -m hpc_llm -m +experiment=mpt125m_c4 hydra/launcher=slurm resources.nodes=1,2,4,8": Run(
        ("-m", "+experiment=mpt125m_c4", "hydra/launcher=slurm", "resources.nodes=1,2,4,8"),
        append=("hydra.launcher.dry_run=true", "data.remote=s3://bucket/c4"),
        out="job 3: dry run",
    ),
    "python -m hpc_llm -m +experiment=mpt7b_dolly hydra/launcher=slurm resources.nodes=1,2,4,8": Run(
        ("-m", "+experiment=mpt7b_dolly", "hydra/launcher=slurm", "resources.nodes=1,2,4,8"),
        append=("hydra.launcher.dry_run=true",),
        out="job 3: dry run",
    ),
    "python -m hpc_llm +experiment=mpt30b_instruct hydra/launcher=slurm": Run(
        ("+experiment=mpt30b_instruct", "hydra/launcher=slurm"),
        append=("hydra.launcher.dry_run=true",),
        out="job 0: dry run",
    ),
    "hpc-llm config +experiment=mpt7b_c4": Run(("config", "+experiment=mpt7b_c4"), out="mpt_causal_lm"),
    # -- object storage (a real S3 server: see tests/test_object_storage.py) -------------------------
    "eval $(hpc-llm dev-cluster up --nodes 3 --s3)": By(
        "tests/test_object_storage.py::test_dev_cluster_up_s3_prints_the_exports_a_client_needs_and_down_stops_it",
        ("dev-cluster up --nodes 3 --s3",),
    ),
    "hpc-llm data prepare tiny_corpus --out s3://hpc-llm/data/tiny": By(
        "tests/test_object_storage.py::s3_tiny",
        ('"data", "prepare", "tiny_corpus", "--out", "s3://hpc-llm/data/tiny"',),
    ),
    "python -m hpc_llm +experiment=mpt_tiny hydra/launcher=slurm data.remote=s3://hpc-llm/data/tiny checkpoint=uri checkpoint.location=s3://hpc-llm/checkpoints checkpoint.keep=2": By(  # noqa: E501
        "tests/test_object_storage.py::test_a_run_on_s3_preempted_then_stopped_twice_resumes_each_time_where_it_stopped",
        ("s3_base(s3_tiny)", 'f"checkpoint.location={s3.uri(location)}"', '"checkpoint.keep=2"'),
    ),
    "hpc-llm doctor +experiment=mpt_tiny checkpoint=uri checkpoint.location=s3://hpc-llm/checkpoints": By(
        "tests/test_object_storage.py::test_doctor_checks_the_store_from_a_compute_node_with_the_jobs_credentials",
        ('"doctor", "+experiment=mpt_tiny", "checkpoint=uri"',),
    ),
    "hpc-llm data prepare c4 --out s3://bucket/c4 --source /shared/allenai-c4 --splits train,val_small": By(
        "tests/test_object_storage.py::s3_c4", ('"prepare"', '"c4"', '"--out"', '"--source"', '"--splits"')
    ),
    # -- containers (real Apptainer: see tests/test_containers.py) --------------------------------
    "hpc-llm container build containers/h100.def /shared/images/hpc_llm-h100.sif": By(
        "tests/test_containers.py::test_container_build_inspect_check_through_spython", ('"container", "build"',)
    ),
    "hpc-llm container check container=apptainer container.image=/shared/images/hpc_llm-h100.sif": By(
        "tests/test_containers.py::test_container_build_inspect_check_through_spython",
        ('"container", "check", f"container.image={image}"',),
    ),
    "hpc-llm container inspect /shared/images/hpc_llm-h100.sif": By(
        "tests/test_containers.py::test_container_build_inspect_check_through_spython", ('"container", "inspect"',)
    ),
    "python -m hpc_llm +experiment=mpt7b_dolly hydra/launcher=slurm container=apptainer container.image=/shared/images/hpc_llm-h100.sif [container.stage=true]": By(  # noqa: E501
        "tests/test_containers.py::test_a_2_node_run_trains_inside_apptainer_on_every_rank",
        ("*RUN", 'f"container.image={sif}"'),
    ),
    # -- pyxis and enroot (real pyxis and enroot: see tests/test_pyxis.py) -------------------------
    # CI's setup runs it (the pyxis tests skip with its one line where it could not build them)
    "scripts/install-pyxis.sh": By("scripts/setup-dev.sh"),
    "eval $(hpc-llm dev-cluster up --nodes 3 --pyxis)": By("tests/test_pyxis.py::pyxis_cluster", ("pyxis=True",)),
    "python -m hpc_llm +experiment=mpt_tiny hydra/launcher=slurm resources.nodes=2 container=pyxis container.image=/shared/images/hpc_llm-h100.sqsh": By(  # noqa: E501
        "tests/test_pyxis.py::test_a_2_node_run_in_pyxis_trains_as_without_a_container_and_a_killed_rank_trains_again",
        ("*SHORT", '"container=pyxis"', 'f"container.image={image}"'),
    ),
    # -- preflight and the watchdog ------------------------------------------------------------
    "hpc-llm preflight hydra/launcher=slurm cluster=h100 resources.nodes=2": By(
        "tests/test_preflight.py::test_preflight_prints_a_busbw_table_from_two_dev_cluster_nodes",
        ('"preflight"', '"resources.nodes=2"'),
    ),
    "python -m hpc_llm +experiment=mpt7b_c4 hydra/launcher=slurm preflight.enabled=true preflight.min_busbw_gbps=300 preflight.min_tflops=600 [preflight.exclude_bad_nodes=true]": Run(  # noqa: E501
        (
            "+experiment=mpt7b_c4",
            "hydra/launcher=slurm",
            "preflight.enabled=true",
            "preflight.min_busbw_gbps=300",
            "preflight.min_tflops=600",
            "preflight.exclude_bad_nodes=true",
        ),
        append=("hydra.launcher.dry_run=true", "data.remote=s3://bucket/c4"),
        out="job 0: dry run",
    ),
    # docs/guides/long-runs.md, "Slow nodes": a slowed node swapped for the spare, on the 24.11 dev cluster
    "python -m hpc_llm +experiment=mpt7b_c4 hydra/launcher=slurm resources.nodes=8 resources.spare_nodes=1 "
    "straggler.action=swap": By(
        "tests/test_spares.py::test_a_slowed_node_is_found_and_swapped_for_the_spare_with_nothing_lost",
        ('"straggler.action=swap"',),
    ),
    # docs/guides/long-runs.md, "Fewer nodes": a run shrunk from 3 nodes to 2 and grown back, on the 24.11 dev cluster
    "python -m hpc_llm +experiment=mpt7b_c4 hydra/launcher=slurm resources.nodes=8 resources.min_nodes=6": By(
        "tests/test_min_nodes.py::test_a_lost_node_with_no_spare_the_run_goes_on_with_fewer_and_grows_back_at_the_requeue",
        ("submit(RUN, env, tmp_path)", '"shrink"'),
    ),
    "python -m hpc_llm +experiment=mpt7b_c4 hydra/launcher=slurm watchdog.enabled=true [watchdog.action=requeue]": Run(
        ("+experiment=mpt7b_c4", "hydra/launcher=slurm", "watchdog.enabled=true", "watchdog.action=requeue"),
        append=("hydra.launcher.dry_run=true", "data.remote=s3://bucket/c4"),
        out="job 0: dry run",
    ),
    # -- reports and estimates -------------------------------------------------------------------
    "python -m hpc_llm +experiment=mpt_tiny hydra/launcher=slurm resources.nodes=1,2 hydra.launcher.wait=true": By(
        "tests/test_slurm.py::test_node_sweep_gives_jobs_of_their_own_size_and_a_ledger",
        ('"resources.nodes=1,2"',),  # FAST has wait=true
    ),
    "hpc-llm report outputs/mpt_tiny/<date_time>": Run(("report", "{sweep_dir}"), needs="slurm", out="Speedup"),
    "hpc-llm estimate model=mpt-70b cluster=h100 --nodes 8 64": Run(
        ("estimate", "model=mpt-70b", "cluster=h100", "--nodes", "8", "64"), out="GPU-hours"
    ),
    # -- plugins -------------------------------------------------------------------------------------
    "pip install ./plugins/hpc-llm-jsonl": By(
        "tests/test_plugins.py::test_example_package_is_discovered_from_its_entry_point", ("pip_install(EXAMPLE",)
    ),
    "python -m hpc_llm data.name=jsonl data.path=corpus.jsonl +train.tokenizer.name=/path/to/tokenizer": By(
        "tests/test_train_local.py::test_third_party_jsonl_source_trains",
        ('"data.name=jsonl"', "data.path=", "+train.tokenizer.name="),
    ),
    "HPC_LLM_BLOCK_PLUGINS=jsonl hpc-llm plugins": By(
        "tests/test_plugins.py::test_name_collision_is_reported_not_resolved", ("HPC_LLM_BLOCK_PLUGINS",)
    ),
}


def test_every_readme_command_is_covered():
    commands = doc_commands()
    missing = [f"{where}: {c}" for c, where in commands.items() if c not in COVERED]
    stale = [c for c in COVERED if c not in commands]
    assert not missing, "commands of the docs no test runs (add them to COVERED):\n" + "\n".join(missing)
    assert not stale, "COVERED entries no doc has any more:\n" + "\n".join(stale)
    assert len(DOCS) > 10 and any("guides" in d.parts for d in DOCS), DOCS  # README.md and docs/, guides included


def test_every_skip_says_why():
    for cmd, spec in COVERED.items():
        if isinstance(spec, Skip):
            assert len(spec.reason.split()) >= 3, f"{cmd}: skipped without a reason"


def _function_source(path: Path, name: str) -> str:
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return ast.get_source_segment(path.read_text(), node) or ""
    raise AssertionError(f"{path.relative_to(ROOT)} has no function {name}")


@pytest.mark.parametrize("cmd", [c for c, s in COVERED.items() if isinstance(s, By)])
def test_commands_run_by_other_tests_are_really_run_there(cmd):
    spec = COVERED[cmd]
    assert isinstance(spec, By)
    if spec.test == ".ci/run":  # CI runs the README's test command: the same one
        ci = (ROOT / ".ci" / "run").read_text()
        setup, test = cmd.split(" && ")
        assert f"\n{setup}\n" in ci and test.replace("$PWD", '"$PWD') in ci.replace('.test-tmp"', ".test-tmp"), ci
        return
    if spec.test == "scripts/setup-dev.sh":  # the setup CI runs (.ci/run) runs it too
        assert f"\nbash {cmd}\n" in (ROOT / spec.test).read_text()
        assert "\nbash scripts/setup-dev.sh\n" in (ROOT / ".ci" / "run").read_text()
        return
    path, name = spec.test.split("::")
    source = _function_source(ROOT / path, name)
    for token in spec.tokens:
        assert token in source, f"{spec.test} does not run {token} (README: {cmd})"


def _argv(spec: Run, cmd: str, values: dict[str, str]) -> list[str]:
    kind, _ = _program(cmd)
    args = [a.format(**values) for a in spec.argv] + list(spec.append)
    if kind == "app":
        return [PY, "-m", "hpc_llm", *args]
    if kind == "other":  # a Slurm client command, as the reader types it
        return args
    return [PY, "-c", "from hpc_llm.cli import main; main()", *args]


def _run(
    cmd: str,
    env: dict[str, str],
    cwd: Path,
    values: dict[str, str] | None = None,
    timeout: int = 600,
    extra: tuple[str, ...] = (),
):
    """The README's ``cmd`` (its placeholders filled from ``values``, ``extra`` arguments after
    it); asserts it succeeds and prints what the README says."""
    spec = COVERED[cmd]
    assert isinstance(spec, Run)
    proc = subprocess.run(
        [*_argv(spec, cmd, values or {}), *extra], env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout
    )
    assert proc.returncode == 0, f"README: {cmd}\n" + explain(proc)
    out = spec.out.format(**(values or {}))
    assert out in proc.stdout, f"README: {cmd}: {out!r} not in the output\n" + explain(proc)
    return proc


@pytest.mark.parametrize("cmd", [c for c, s in COVERED.items() if isinstance(s, Run) and s.needs == "none"])
def test_readme_commands_without_a_running_job(cmd, app_env, tmp_path):
    _run(cmd, app_env, tmp_path, timeout=300)


@pytest.mark.slurm
def test_readme_dev_cluster_up_and_down(app_env, tmp_path):
    """``eval "$(hpc-llm dev-cluster up --nodes 3)"`` then ``down``, in a root of its own."""
    root = tmp_path / "cluster"
    extra = ["--root", str(root), "--port", str(_free_port_block(8))]
    up, down = (COVERED[c] for c in ("eval $(hpc-llm dev-cluster up --nodes 3)", "hpc-llm dev-cluster down"))
    assert isinstance(up, Run) and isinstance(down, Run)
    cli = f"{shlex.quote(PY)} -c 'from hpc_llm.cli import main; main()'"
    script = f'eval "$({cli} {shlex.join([*up.argv, *extra])})" && sinfo -h -o "%D %t"'
    try:
        proc = subprocess.run(["bash", "-c", script], env=app_env, capture_output=True, text=True, timeout=180)
        assert proc.returncode == 0, explain(proc)
        assert proc.stdout.split() == ["3", "idle"]
    finally:
        off = subprocess.run(
            [PY, "-c", "from hpc_llm.cli import main; main()", *down.argv, "--root", str(root)],
            env=app_env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert off.returncode == 0, explain(off)


SUBMIT = "python -m hpc_llm +experiment=mpt_tiny hydra/launcher=slurm resources.nodes=2"


@pytest.mark.slurm
def test_readme_slurm_commands_in_order(slurm_env, runs_dir, tmp_path):
    """The On Slurm and Sweeps sections, in the README's order, against the session's cluster."""
    values: dict[str, str] = {}
    sub = _run(SUBMIT, slurm_env, tmp_path)
    values["job_id"] = re.search(r"submitted Slurm job (\d+), run dir (\S+)", sub.stdout).group(1)
    _run("hpc-llm status", slurm_env, tmp_path, values)
    waited = _run(
        "python -m hpc_llm +experiment=mpt_tiny hydra/launcher=slurm resources.nodes=2 hydra.launcher.wait=true",
        slurm_env,
        tmp_path,
    )
    assert "status      completed" in waited.stdout
    values["run_dir"] = re.search(r"submitted Slurm job \d+, run dir (\S+)", waited.stdout).group(1)
    _run("hpc-llm logs <run id | job id | run dir> [--rank 3] [-f]", slurm_env, tmp_path, values)
    # the README's first submit, ended by now (or soon) on an idle cluster: cancel refuses an ended
    # run (exit 1), so cancel one that is surely queued, held an hour by sbatch's --begin
    held = _run(SUBMIT, slurm_env, tmp_path, extra=("hydra.launcher.extra_sbatch.begin=now+3600",))
    values["job_id"] = re.search(r"submitted Slurm job (\d+), run dir (\S+)", held.stdout).group(1)
    _run("hpc-llm cancel <run id | job id | run dir>", slurm_env, tmp_path, values)  # the queued one
    _run("hpc-llm status <run id | job id | run dir>", slurm_env, tmp_path, values)
    swept = _run(
        "python -m hpc_llm +experiment=mpt_tiny hydra/launcher=slurm resources.nodes=1 "
        "train.optimizer.lr=1e-4,2e-4,3e-4 hydra.launcher.array_parallelism=2",
        slurm_env,
        tmp_path,
    )
    values["sweep_dir"] = str(Path(re.search(r"run dir (\S+)/0 ", swept.stdout).group(1)))
    _run("hpc-llm wait outputs/mpt_tiny/<date_time>", slurm_env, tmp_path, values)
    _run("hpc-llm report outputs/mpt_tiny/<date_time> --wait", slurm_env, tmp_path, values)
    _run("hpc-llm report outputs/mpt_tiny/<date_time>", slurm_env, tmp_path, values)
    lrs = sorted(
        json.loads((Path(values["sweep_dir"]) / str(i) / "results.json").read_text())["status"] for i in range(3)
    )
    assert lrs == ["completed"] * 3
    _run(
        "python -m hpc_llm +experiment=mpt_tiny hydra/launcher=slurm hydra.launcher.snapshot=true", slurm_env, tmp_path
    )


@pytest.mark.slurm
def test_readme_tour_a_preemption_survived(slurm_env, test_site, tmp_path):
    """The README tour's fault: a run alone on its node of the partition low, a job of the
    partition high on that node, the run saved, requeued under the same job id and resumed.
    Paced (0.1 s a batch) so that the preemption finds it training on any machine."""
    env = with_site(slurm_env, test_site)
    values: dict[str, str] = {}
    sub = _run(PREEMPTED, env, tmp_path)
    values["job_id"], run_dir = re.search(r"submitted Slurm job (\d+), run dir (\S+)", sub.stdout).groups()
    wait_for(lambda: beat(Path(run_dir), 0).get("batch", -1) >= 20, 240, "rank 0 to pass batch 20")
    node = _run("squeue -h -o %N -j <job id>", env, tmp_path, values)
    values["node"] = node.stdout.strip()
    _run("sbatch -p high --exclusive -w <node> --wrap sleep 2", env, tmp_path, values)
    _run("hpc-llm wait <job id>", env, tmp_path, values, timeout=400)
    shown = _run("hpc-llm status <job id>", env, tmp_path, values)
    r = json.loads((Path(run_dir) / "results.json").read_text())
    assert r["status"] == "completed" and r["restarts_by_cause"] == {"preemption": 1}, explain(shown)
    first, second = r["attempts"]
    assert first["cause"] == "preemption" and second["resumed_at_batch"] == first["stopped_at_batch"] > 0
    assert r["slurm_job_ids"] == [values["job_id"]]
