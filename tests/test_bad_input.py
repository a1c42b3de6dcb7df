"""Bad input: one line on stderr naming the key and what is allowed, exit 2,
before any process starts, and nothing left behind (no run directory)."""

from pathlib import Path

import pytest

from tests.conftest import explain, run_app

CASES = [
    (["+experiment=nope"], "unknown experiment 'nope'; allowed: llama3_tiny, mpt125m_c4, mpt13b_c4"),
    (["data.name=nope"], "unknown data source 'nope' (data.name); allowed:"),
    (["parallelism=nope"], "unknown parallelism 'nope'; allowed: ddp, fsdp, hsdp"),
    (["parallelism.name=nope"], "unknown parallelism 'nope' (parallelism.name); allowed: ddp, fsdp, hsdp"),
    (["checkpoint.name=s3"], "unknown checkpoint backend 's3' (checkpoint.name); allowed: folder, uri"),
    (["eval.evaluators=[heldout,nope]"], "unknown evaluator 'nope' (eval.evaluators); allowed: heldout"),
    (["resources.nodes=0"], "resources.nodes=0: must be an integer >= 1"),
    (["resources.tasks_per_node=-1"], "resources.tasks_per_node=-1: must be an integer >= 1"),
    (["resources.min_nodes=2"], "resources.min_nodes=2: must be an integer from 1 to resources.nodes=1"),
    (["resources.nodes=2"], "hydra/launcher=local runs one node"),
    (
        ["parallelism=hsdp", "parallelism.replicas=3"],
        "parallelism.replicas=3 does not divide the world size 2 (1 node(s) x 2 tasks); allowed: 1, 2",
    ),
    (["data=mds", "data.path=/no/such/dir"], "data.path='/no/such/dir' does not exist"),
    (["data=mds"], "data.path is required for data source 'mds'"),
    (
        ["resources.nodez=1"],
        "unknown config key 'resources.nodez'; did you mean resources.nodes?; allowed keys under resources: nodes,",
    ),
    (["+train.max_duraton=3ba"], "train.max_duraton (did you mean max_duration?) is not an LLM Foundry train-config"),
    (["resources.nodes=two"], "resources.nodes"),
    (["resources.time=soon"], "resources.time='soon' is not a Slurm time limit"),
    (["checkpoint=uri"], "checkpoint.location='': not an object-store URI"),
    (["parallelism=fsdp", "parallelism.fsdp_version=1"], "parallelism.fsdp_version=1 needs GPUs"),
    (
        ["+data.options.cache_dirr=/x"],
        "data.options.cache_dirr: not an option of data source 'tiny_corpus'; allowed: cache_dir",
    ),
    # One bad point in a sweep stops the whole sweep before anything is created.
    (["resources.tasks_per_node=1,0"], "resources.tasks_per_node=0: must be an integer >= 1"),
    # submitit's option names, which users bring by habit, point to hpc_llm's
    (
        ["hydra/launcher=slurm", "+hydra.launcher.additional_parameters={constraint:h100}"],
        "unknown config key 'hydra.launcher.additional_parameters'; for submitit's additional_parameters "
        "use hydra.launcher.extra_sbatch",
    ),
    (["hydra/launcher=slurm", "hydra.launcher.nodes=4"], "for submitit's nodes use resources.nodes; allowed keys"),
    (["+hydra.launcher.timeout_min=60"], "for submitit's timeout_min use resources.time"),
    (["hydra/launcher=slurm", "+hydra.launcher.gpus_per_node=8"], "use resources.gpus_per_node"),
    # GPUs: resources.gpus_per_node (+ resources.gpu_type) only, one --gpus-per-node
    (["resources.gpu_type=h100"], "resources.gpu_type=h100 asks for no GPUs (resources.gpus_per_node=0)"),
    (["cluster=h100", "resources.gpu_type='gpu:h100'"], "resources.gpu_type='gpu:h100' is not a GPU type"),
    (
        ["cluster=h100", "hydra/launcher=slurm", "cluster.sbatch.gres=gpu:h100:8"],
        "cluster.sbatch.gres='gpu:h100:8' asks Slurm for GPUs beside resources.gpus_per_node=8 "
        "(--gpus-per-node=8); allowed: GPUs only through resources.gpus_per_node, with resources.gpu_type",
    ),
    (["hydra/launcher=slurm", "+hydra.launcher.gres=gpu:8"], "for submitit's gres use resources.gpus_per_node and"),
    # trainer=torchtitan: what it cannot do, and what does not serve it (docs/reference/trainers.md)
    (["trainer=nope"], "unknown trainer 'nope'; allowed: llmfoundry, torchtitan"),
    (["trainer.name=nope"], "unknown trainer 'nope' (trainer.name); allowed: llmfoundry, torchtitan"),
    (
        ["trainer=torchtitan", "eval=none"],
        "train.model.name=mpt_causal_lm: trainer=torchtitan builds torchtitan_llama3",
    ),
    (
        ["+experiment=llama3_tiny", "parallelism=fsdp"],
        "parallelism=fsdp with trainer=torchtitan on CPU: FSDP2's reduce-scatter averages with ReduceOp.PREMUL_SUM",
    ),
    (
        ["+experiment=llama3_tiny", "eval=heldout"],
        "eval.evaluators=['heldout']: evaluator 'heldout' serves trainer llmfoundry, not trainer=torchtitan; "
        "allowed with trainer=torchtitan: (none) (or eval=none)",
    ),
    (
        ["+experiment=llama3_tiny", "data=mds", "data.path=/tmp"],
        "data.name=mds: data source 'mds' serves trainer llmfoundry, not trainer=torchtitan; allowed with "
        "trainer=torchtitan: tiny_corpus",
    ),
    (
        ["+experiment=llama3_tiny", "checkpoint=uri", "checkpoint.location=gs://bucket/ckpt"],
        "checkpoint.location=gs://bucket/ckpt: trainer=torchtitan saves to an object store through fsspec with "
        "s3fs, which its environment has; allowed: s3://bucket/path, or checkpoint=folder",
    ),
    (["+experiment=llama3_tiny", "train.max_duration=1ep"], "train.max_duration=1ep: trainer=torchtitan counts steps"),
    (["+experiment=llama3_tiny", "+train.model.n_layers=2"], "train.model.n_layers: not a key of torchtitan_llama3"),
    (["+experiment=llama3_tiny", "+train.eval_loader={}"], "train.eval_loader: not read by trainer=torchtitan"),
    (["+experiment=llama3_tiny", "+trainer.options.heldoutt=1"], "trainer.options.heldoutt: not an option of trainer"),
    (
        ["+experiment=llama3_tiny", "trainer.python=/nope/python"],
        "trainer.python=/nope/python: /nope/python does not exist; trainer=torchtitan runs in an environment of "
        "its own",
    ),
    # a threshold of checks that do not run
    (["preflight.min_busbw_gbps=300"], "preflight.min_busbw_gbps=300.0 is ignored while preflight.enabled=false"),
    # a sweep given to a command that shows one config (Hydra: a ValueError, then Ambiguous value)
    (["-m", "resources.nodes=1,2", "--cfg", "job"], "--cfg and --info show one job's config"),
    # a profile that does not compose keeps the line naming its bad key
    (
        ["hydra.searchpath=[file://{bad_configs}]", "cluster=naive"],
        "In 'cluster/naive': unknown config key 'cluster.partitionz'; did you mean cluster.partition?; "
        "allowed keys under cluster: name,",
    ),
    # another app's primary config
    (
        ["--config-path", "{bad_configs}", "--config-name", "not_hpc_llm"],
        "config 'not_hpc_llm' is not an hpc_llm config",
    ),
    (
        ["--config-path", "{bad_configs}", "--config-name", "not_hpc_llm", "hydra/launcher=slurm"],
        "config 'not_hpc_llm' is not an hpc_llm config",
    ),
]

BAD_CONFIGS = Path(__file__).parent / "bad_configs"


@pytest.mark.parametrize("overrides,message", CASES, ids=[" ".join(c[0]) for c in CASES])
def test_bad_input_is_one_line_and_leaves_nothing(overrides, message, app_env, runs_dir: Path, tmp_path: Path):
    overrides = [o.replace("{bad_configs}", str(BAD_CONFIGS)) for o in overrides]
    proc = run_app(overrides, app_env, cwd=tmp_path, timeout=120)
    assert proc.returncode == 2, explain(proc)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, explain(proc)
    assert lines[0].startswith("hpc_llm: error: "), explain(proc)
    assert message in lines[0], explain(proc)
    assert "Traceback" not in proc.stdout + proc.stderr
    assert not runs_dir.exists(), f"a run directory was created: {list(runs_dir.rglob('*'))}"
    assert not (tmp_path / "outputs").exists() and not (tmp_path / "multirun").exists()


def test_a_dev_cluster_of_a_slurm_that_cannot_run_here_is_one_line(app_env, tmp_path):
    from tests.conftest import explain, run_cli

    proc = run_cli(["dev-cluster", "up", "--slurm", "23.02", "--root", str(tmp_path / "dc")], app_env)
    assert proc.returncode == 2, explain(proc)
    [line] = proc.stderr.strip().splitlines()
    assert line == "hpc_llm: error: --slurm=23.02: not a Slurm a dev cluster can run; installable: 22.05, 24.11"
    assert not (tmp_path / "dc").exists()
