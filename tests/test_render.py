"""The batch script: deterministic, quoted, secrets by name; golden files.

A golden file that does not exist is written and the test fails once, saying
so: delete tests/golden/<name> to regenerate it after an intended change.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import ROOT, explain, run_cli

GOLDEN = ROOT / "tests" / "golden"
FIXED = ["hydra.launcher.python=/opt/hpc_llm/venv/bin/python", "hydra.sweep.dir=/shared/runs/golden"]

CASES = {
    "sbatch_local_2nodes.sh": ["+experiment=mpt_tiny", "resources.nodes=2"],
    "sbatch_h100_4nodes.sh": [
        "+experiment=mpt_tiny",
        "cluster=h100",
        "resources.nodes=4",
        "train.global_train_batch_size=256",
        "hydra.launcher.partition=gpu",
        "hydra.launcher.account=llm team",
    ],
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_render_matches_golden(name, app_env):
    proc = run_cli(["render", *CASES[name], *FIXED], app_env)
    assert proc.returncode == 0, explain(proc)
    golden = GOLDEN / name
    if not golden.exists():
        golden.write_text(proc.stdout)
        pytest.fail(f"wrote missing golden file {golden}; check it and commit it")
    assert proc.stdout == golden.read_text(), f"render changed; delete {golden} to regenerate"


def test_render_is_deterministic(app_env):
    a = run_cli(["render", *CASES["sbatch_h100_4nodes.sh"], *FIXED], app_env).stdout
    b = run_cli(["render", *reversed(CASES["sbatch_h100_4nodes.sh"]), *FIXED], app_env).stdout
    assert a == b


def test_values_are_quoted_and_secrets_pass_by_name(app_env):
    app_env = dict(app_env, WANDB_API_KEY="s3cr3t-value")
    proc = run_cli(
        [
            "render",
            "+experiment=mpt_tiny",
            *FIXED,
            "+cluster.env.WEIRD='a b;$(rm -rf /)'",
            "cluster.env_passthrough=[WANDB_API_KEY]",
            "hydra.launcher.setup=[module load cuda]",
        ],
        app_env,
    )
    assert proc.returncode == 0, explain(proc)
    assert "export WEIRD='a b;$(rm -rf /)'" in proc.stdout
    assert "WANDB_API_KEY" in proc.stdout and "s3cr3t-value" not in proc.stdout
    assert "\nmodule load cuda\n" in proc.stdout


def test_dry_run_writes_scripts_without_submitting(app_env, runs_dir: Path, tmp_path: Path):
    from tests.conftest import results_of, run_app

    proc = run_app(
        ["+experiment=mpt_tiny", "hydra/launcher=slurm", "hydra.launcher.dry_run=true", "resources.nodes=1,2"],
        app_env,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, explain(proc)
    scripts = sorted(runs_dir.rglob("sbatch.sh"))
    assert len(scripts) == 2
    assert "#SBATCH --nodes=1" in scripts[0].read_text() and "#SBATCH --nodes=2" in scripts[1].read_text()
    assert results_of(runs_dir) == []
    assert not list(runs_dir.rglob(".submitit"))


def test_keys_of_free_form_mappings_need_no_plus(app_env, runs_dir: Path, tmp_path: Path):
    """hydra.launcher.extra_sbatch's own example ({constraint: h100}) and cluster.env take new
    keys as typed, without Hydra's +, in both the app and `hpc-llm render`."""
    from tests.conftest import run_app, run_cli

    args = ["+experiment=mpt_tiny", "hydra/launcher=slurm", "hydra.launcher.extra_sbatch.constraint=h100"]
    args += ["cluster.env.NCCL_DEBUG=INFO", "cluster.sbatch.reservation=big"]
    proc = run_app([*args, "hydra.launcher.dry_run=true"], app_env, cwd=tmp_path)
    assert proc.returncode == 0, explain(proc)
    [script] = runs_dir.rglob("sbatch.sh")
    rendered = run_cli(["render", *args], app_env)
    assert rendered.returncode == 0, explain(rendered)
    for text in (script.read_text(), rendered.stdout):
        assert "#SBATCH --constraint=h100" in text and "#SBATCH --reservation=big" in text
        assert "export NCCL_DEBUG=INFO" in text


def _gpu_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("#SBATCH --gpus") or "--gres" in line]


@pytest.mark.parametrize(
    "extra,expected",
    [
        ([], "#SBATCH --gpus-per-node=8"),
        (["resources.gpu_type=h100"], "#SBATCH --gpus-per-node=h100:8"),
        (["resources.gpu_type=a100", "resources.gpus_per_node=4", "resources.tasks_per_node=4"], None),
    ],
    ids=["untyped", "typed", "typed-4"],
)
def test_one_gpu_request_typed_or_not(extra, expected, app_env):
    """resources.gpu_type makes the one --gpus-per-node typed; no --gres beside it."""
    proc = run_cli(["render", *CASES["sbatch_h100_4nodes.sh"], *extra, *FIXED], app_env)
    assert proc.returncode == 0, explain(proc)
    assert _gpu_lines(proc.stdout) == [expected or "#SBATCH --gpus-per-node=a100:4"]


def test_other_gres_passes_beside_the_gpu_request(app_env):
    proc = run_cli(
        ["render", *CASES["sbatch_h100_4nodes.sh"], "resources.gpu_type=h100", "cluster.sbatch.gres=nvme:1", *FIXED],
        app_env,
    )
    assert proc.returncode == 0, explain(proc)
    assert _gpu_lines(proc.stdout) == ["#SBATCH --gpus-per-node=h100:8", "#SBATCH --gres=nvme:1"]


@pytest.mark.parametrize(
    "passthrough",
    [
        "cluster.sbatch.gres=gpu:h100:8",
        "cluster.sbatch.gpus_per_node=8",
        "hydra.launcher.extra_sbatch.gres=gpu:8",
        "hydra.launcher.extra_sbatch.gpus_per_node=h100:8",
        "hydra.launcher.extra_sbatch.gpus=32",
    ],
)
@pytest.mark.parametrize("gpu_type", [None, "h100"])
def test_a_gpu_passthrough_beside_the_request_is_refused_before_anything_exists(
    passthrough, gpu_type, app_env, runs_dir: Path, tmp_path: Path
):
    """Slurm would take both flags (--gpus-per-node=8 and --gres=gpu:h100:8): one line naming
    the key and resources.gpu_type, from `hpc-llm render` and from a submit alike."""
    from tests.conftest import run_app

    key = passthrough.split("=")[0]
    args = [*CASES["sbatch_h100_4nodes.sh"], passthrough] + ([f"resources.gpu_type={gpu_type}"] if gpu_type else [])
    flag = f"{gpu_type}:8" if gpu_type else "8"
    for proc in (
        run_cli(["render", *args], app_env),
        run_app([*args, "hydra/launcher=slurm"], app_env, cwd=tmp_path),
    ):
        assert proc.returncode == 2, explain(proc)
        [line] = proc.stderr.splitlines()
        assert line.startswith(f"hpc_llm: error: {key}="), line
        assert f"asks Slurm for GPUs beside resources.gpus_per_node=8 (--gpus-per-node={flag})" in line
        assert "resources.gpu_type" in line and line.endswith(f"remove {key}"), line
        assert proc.stdout == "", explain(proc)
    assert not runs_dir.exists() and not (tmp_path / "outputs").exists()


def test_spare_nodes_render_n_plus_s_nodes_and_no_kill(app_env):
    """resources.spare_nodes=1 beside 2 training nodes: the job and the agent step ask for 3
    nodes, both with --no-kill; the supervisor still trains on 2. Without spares neither flag."""
    proc = run_cli(["render", *CASES["sbatch_local_2nodes.sh"], *FIXED, "resources.spare_nodes=1"], app_env)
    assert proc.returncode == 0, explain(proc)
    assert "#SBATCH --nodes=3\n" in proc.stdout and "#SBATCH --no-kill\n" in proc.stdout
    assert "srun --unbuffered --export=ALL --nodes=3 --ntasks=3 --ntasks-per-node=1 --no-kill " in proc.stdout
    assert " --nodes 2 " in proc.stdout  # the supervisor's training nodes
    plain = run_cli(["render", *CASES["sbatch_local_2nodes.sh"], *FIXED], app_env)
    assert "--no-kill" not in plain.stdout and "#SBATCH --nodes=2\n" in plain.stdout
    bad = run_cli(["render", *CASES["sbatch_local_2nodes.sh"], *FIXED, "resources.spare_nodes=-1"], app_env)
    assert bad.returncode == 2 and bad.stderr.strip().splitlines() == [
        "hpc_llm: error: resources.spare_nodes=-1: must be >= 0 (0: no spares, the default)"
    ], explain(bad)


def test_every_point_of_a_sweep_is_its_own_full_composition(app_env, runs_dir: Path, tmp_path: Path):
    """The sweeper composes one point per shape and gives the others its config with their own
    values (hpc_llm.launch.sweeper); a group choice (parallelism=) is another shape, composed
    anew. Each point's payload config and .hydra/ files are what composing that point alone
    gives, value types included (1 and true are equal in Python)."""
    import yaml
    from omegaconf import OmegaConf

    from hpc_llm.config.compose import compose
    from hpc_llm.rundir.payload import read_payload
    from tests.conftest import run_app

    sweep = ["train.optimizer.lr=1e-4,2e-4", "parallelism=ddp,fsdp", "+train.variables.x=1,true"]
    proc = run_app(["+experiment=mpt_tiny", *sweep, "hydra/launcher=slurm", "hydra.launcher.dry_run=true"], app_env)
    assert proc.returncode == 0, explain(proc)
    payloads = sorted(runs_dir.rglob("job.pkl"))
    assert len(payloads) == 8
    seen = set()
    for path in payloads:
        run_dir = path.parent.parent
        overrides = yaml.safe_load((run_dir / ".hydra" / "overrides.yaml").read_text())
        seen.add(tuple(o for o in overrides if not o.startswith("+experiment")))
        config = read_payload(path).config
        alone = compose(overrides)
        mine, theirs = (OmegaConf.to_container(c, resolve=False) for c in (config, alone))
        assert isinstance(mine, dict) and isinstance(theirs, dict)
        for c in (mine, theirs):
            c.pop("hydra")
        assert _typed(mine) == _typed(theirs), overrides  # types too: 1 is not true
        assert _typed(yaml.safe_load((run_dir / ".hydra" / "config.yaml").read_text())) == _typed(mine)
        assert list(config.hydra.overrides.task) == overrides
    assert len(seen) == 8  # every point once


@pytest.mark.parametrize(
    "sweep",
    [
        [],
        ["train.optimizer.lr=1e-4,2e-4", "+train.variables.x=1,true"],
        ["model=mpt_tiny", "train.model.n_layers=1,3"],  # a group choice beside a swept value
        # a swept key the config lacks, then a new key after it: Hydra adds them in that order
        ["train.eval_subset_num_batches=1,2", "train.save_overwrite=true"],
    ],
)
def test_points_made_from_the_master_config_are_what_hydra_composes(sweep, app_env, tmp_path: Path):
    """A point whose swept values are plain is the master config (what Hydra composed for the
    whole sweep) with its values set, hydra node included. Against the same points with a
    group swept over its one value (parallelism=choice(ddp)), which the sweeper has Hydra
    compose (load_sweep_config): equal but for the override Hydra records, key order and
    value types included."""
    import math

    from omegaconf import OmegaConf

    from hpc_llm.rundir.payload import read_payload
    from tests.conftest import run_app

    def points(extra: list[str], name: str) -> list[dict]:
        runs = tmp_path / name
        args = ["+experiment=mpt_tiny", *sweep, *extra, "hydra/launcher=slurm", "hydra.launcher.dry_run=true"]
        proc = run_app([*args, f"hydra.sweep.dir={runs}"], dict(app_env, HPC_LLM_RUNS=str(runs)))
        assert proc.returncode == 0, explain(proc)
        got = []
        for path in sorted(runs.rglob("job.pkl")):
            cfg = OmegaConf.to_container(read_payload(path).config, resolve=False)
            assert isinstance(cfg, dict)
            hydra = cfg["hydra"]
            hydra["overrides"]["task"] = [o for o in hydra["overrides"]["task"] if not o.startswith("parallelism=")]
            for key in ("override_dirname", "num", "id"):
                hydra["job"].pop(key)
            hydra["runtime"].pop("output_dir")
            hydra["sweep"].pop("dir")
            hydra["overrides"]["hydra"] = [o for o in hydra["overrides"]["hydra"] if "sweep.dir" not in o]
            got.append(_ordered(cfg))
        return got

    mine, composed = points([], "from-master"), points(["parallelism=choice(ddp)"], "composed")
    assert len(mine) == len(composed) == math.prod(len(o.split("=", 1)[1].split(",")) for o in sweep)
    for a, b in zip(mine, composed, strict=True):
        assert a == b


def test_a_swept_plus_key_the_config_has_is_refused_as_hydra_refuses_it(app_env, runs_dir: Path):
    """``+key=a,b`` adds a key: where the config has it, composing the point refuses it; a point
    made from the master config must not quietly set it instead."""
    from tests.conftest import run_app

    sweep = ["+experiment=mpt_tiny", "+train.max_duration=4ba,6ba"]
    proc = run_app([*sweep, "hydra/launcher=slurm", "hydra.launcher.dry_run=true"], app_env)
    assert proc.returncode != 0, explain(proc)
    assert "train.max_duration" in proc.stderr and "already" in proc.stderr, explain(proc)
    assert not runs_dir.exists() or not any(runs_dir.rglob("job.pkl"))


def test_a_swept_key_a_later_override_sets_again_keeps_hydras_order(app_env, runs_dir: Path):
    """Hydra applies overrides in order: ``lr=a,b`` then a mapping holding ``lr`` leaves the
    mapping's value in every point. Setting only the swept value on a shared composition would
    put it last, so such points are composed as Hydra composes them."""
    from hpc_llm.rundir.payload import read_payload
    from tests.conftest import run_app

    sweep = ["+experiment=mpt_tiny", "train.optimizer.lr=1e-4,2e-4", "++train.optimizer={lr:5e-4}"]
    proc = run_app([*sweep, "hydra/launcher=slurm", "hydra.launcher.dry_run=true"], app_env)
    assert proc.returncode == 0, explain(proc)
    assert [read_payload(p).config.train.optimizer.lr for p in sorted(runs_dir.rglob("job.pkl"))] == [5e-4, 5e-4]


def test_a_group_found_only_on_hydra_searchpath_is_a_group_in_every_point(app_env, runs_dir: Path, tmp_path: Path):
    """Hydra adds ``hydra.searchpath``'s directories to its repository for each composition: a
    group found only there (``+extra=opt``) is a group, not the value 'opt', in the points the
    sweeper makes without composing."""
    from hpc_llm.rundir.payload import read_payload
    from tests.conftest import run_app

    group = tmp_path / "site" / "extra"
    group.mkdir(parents=True)
    (group / "opt.yaml").write_text("# @package train.variables\nfrom_the_group: 7\n")
    sweep = ["+experiment=mpt_tiny", f"hydra.searchpath=[file://{tmp_path / 'site'}]", "+extra=opt"]
    for lrs in ([], ["train.optimizer.lr=1e-4,2e-4"]):
        proc = run_app([*sweep, *lrs, "hydra/launcher=slurm", "hydra.launcher.dry_run=true"], app_env)
        assert proc.returncode == 0, explain(proc)
    configs = [read_payload(p).config for p in sorted(runs_dir.rglob("job.pkl"))]
    assert len(configs) == 3 and all(c.train.variables.from_the_group == 7 for c in configs)
    assert all("extra" not in c for c in configs)


def test_each_point_of_a_yaml_sweep_is_its_own_yaml(app_env, runs_dir: Path, tmp_path: Path, monkeypatch):
    """``yaml=A,B``: B's point is B applied to what Hydra composed, not to A's point (which kept
    A's experiment name, hence its run name and dir, and left out the evaluator A has no loader
    for). Each point's config is what composing it alone gives."""
    from omegaconf import OmegaConf

    from hpc_llm.config.compose import compose
    from hpc_llm.rundir.payload import read_payload
    from tests.conftest import run_app

    yamls = ROOT / "tests" / "foundry_yamls"
    dolly, testing = yamls / "finetune" / "7b_dolly_sft.yaml", yamls / "pretrain" / "testing.yaml"
    (tmp_path / "my-copy-c4").mkdir()
    args = [f"yaml={dolly},{testing}", "hydra/launcher=slurm", "hydra.launcher.dry_run=true"]
    proc = run_app(args, app_env, cwd=tmp_path)
    assert proc.returncode == 0, explain(proc)
    points = sorted(runs_dir.rglob("job.pkl"), key=lambda p: int(p.parent.parent.name))
    assert len(points) == 2
    monkeypatch.chdir(tmp_path)
    for key, value in app_env.items():
        monkeypatch.setenv(key, value)
    for path, yml in zip(points, (dolly, testing), strict=True):
        config = read_payload(path).config
        assert config.experiment == yml.stem.replace("_", "-") or config.experiment == yml.stem, config.experiment
        mine, alone = (OmegaConf.to_container(c, resolve=False) for c in (config, compose([f"yaml={yml}"])))
        assert isinstance(mine, dict) and isinstance(alone, dict)
        for c in (mine, alone):
            c.pop("hydra")
        assert _typed(mine) == _typed(alone), yml.name


def test_hydra_is_asked_the_run_mode_only_where_the_command_line_could_change_it(app_env, runs_dir: Path):
    """hpc_llm answers Hydra's get_mode without composing only where its own config.yaml (MULTIRUN)
    decides; ``hydra.mode=RUN`` on the command line goes to Hydra, which runs the sweep all the
    same and records MULTIRUN, as it always did."""
    import yaml

    from hpc_llm.app import _mode_known
    from tests.conftest import run_app

    assert _mode_known(["+experiment=mpt_tiny", "train.optimizer.lr=1e-4,2e-4", "hydra/launcher=slurm"])
    for args in (["-cn", "x"], ["--config-name=x"], ["-cp", "d"], ["--config-path=d"], ["++hydra.mode=RUN"]):
        assert not _mode_known(args), args
    for extra in ([], ["hydra.mode=RUN"]):
        proc = run_app(["+experiment=mpt_tiny", *extra, "hydra/launcher=slurm", "hydra.launcher.dry_run=true"], app_env)
        assert proc.returncode == 0, explain(proc)
    modes = [yaml.safe_load(p.read_text())["hydra"]["mode"] for p in runs_dir.rglob(".hydra/hydra.yaml")]
    assert modes == ["MULTIRUN", "MULTIRUN"]


def test_a_mandatory_group_left_unset_is_refused_in_every_point(tmp_path: Path, app_env):
    """Hydra composes the master config of a sweep skipping a ``???`` group default, and each
    point refusing it ("You must specify"): under hpc_llm's sweeper and launcher, no point may
    be made from that master."""
    import subprocess
    import sys

    (tmp_path / "app" / "db").mkdir(parents=True)
    (tmp_path / "app" / "config.yaml").write_text("defaults:\n  - db: ???\n  - _self_\nx: 1\n")
    (tmp_path / "app" / "db" / "mysql.yaml").write_text("port: 3306\n")
    app = tmp_path / "app" / "app.py"
    app.write_text(
        "import pathlib, hydra\n"
        "from hydra.core.hydra_config import HydraConfig\n"
        "@hydra.main(config_path='.', config_name='config', version_base='1.3')\n"
        "def main(cfg):\n    pathlib.Path(HydraConfig.get().runtime.output_dir, 'ran').write_text(str(cfg.db.port))\n"
        "main()\n"
    )
    common = ["hydra/sweeper=hpc_llm", "hydra/launcher=local", f"hydra.sweep.dir={tmp_path / 'sweep'}"]
    proc = subprocess.run(
        [sys.executable, str(app), "-m", "x=2,3", *common], env=app_env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode != 0 and not list(tmp_path.rglob("ran")), explain(proc)
    assert "You must specify 'db'" in proc.stderr, explain(proc)
    proc = subprocess.run(
        [sys.executable, str(app), "-m", "x=2,3", "db=mysql", *common],
        env=app_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, explain(proc)
    assert [p.read_text() for p in tmp_path.rglob("ran")] == ["3306", "3306"]


def test_a_mapping_swept_as_a_value_is_each_points_own(app_env, runs_dir: Path, tmp_path: Path):
    """Hydra merges a mapping value into what is there: the sweeper composes each such point
    anew, so the first point's keys do not stay in the second's."""
    import yaml

    from hpc_llm.rundir.payload import read_payload
    from tests.conftest import run_app

    sweep = ["+experiment=mpt_tiny", "++train.variables.d={a:1},{b:2}"]
    proc = run_app([*sweep, "hydra/launcher=slurm", "hydra.launcher.dry_run=true"], app_env)
    assert proc.returncode == 0, explain(proc)
    got = sorted(str(dict(read_payload(p).config.train.variables.d)) for p in runs_dir.rglob("job.pkl"))
    assert got == ["{'a': 1}", "{'b': 2}"]
    assert all("d" in yaml.safe_load(p.read_text())["train"]["variables"] for p in runs_dir.rglob("config.yaml"))


def _ordered(data: object) -> object:
    """``data`` as _typed gives it, each mapping a list of its (key, value) pairs: in its order."""
    if isinstance(data, dict):
        return [(k, _ordered(v)) for k, v in data.items()]
    if isinstance(data, list):
        return [_ordered(v) for v in data]
    return (type(data).__name__, data)


def _typed(data: object) -> object:
    """``data`` with every value's type beside it (1 == True == 1.0 in Python)."""
    if isinstance(data, dict):
        return {k: _typed(v) for k, v in data.items()}
    if isinstance(data, list):
        return [_typed(v) for v in data]
    return (type(data).__name__, data)


def test_a_bad_value_in_a_later_point_of_a_shape_refuses_the_sweep(app_env, runs_dir: Path, tmp_path: Path):
    """The second point of a shape is the first's config with its own values (no composition of
    its own): its bad value is still refused in one line naming the key, before anything exists."""
    from tests.conftest import run_app

    proc = run_app(
        ["+experiment=mpt_tiny", "fault.max_failures=3,-1", "hydra/launcher=slurm", "hydra.launcher.dry_run=true"],
        app_env,
    )
    assert proc.returncode == 2, explain(proc)
    said = [ln for ln in proc.stderr.splitlines() if ln.startswith("hpc_llm: error:")]
    assert len(said) == 1 and "fault.max_failures=-1" in said[0] and "an integer >= 0" in said[0], proc.stderr
    assert not list(runs_dir.rglob("*")), list(runs_dir.rglob("*"))
