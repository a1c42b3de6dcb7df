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
