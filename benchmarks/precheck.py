"""What the check before the queue costs (hpc_llm/launch/precheck.py): one process of the
job's environment for a whole sweep, in the venv and through the image.

Printed, for a 1-point and a 100-point learning-rate sweep of ``+experiment=mpt_tiny`` (the
points composed and validated as ``python -m hpc_llm`` does, then checked):

* the check's wall time in the venv (this interpreter) and through ``apptainer exec`` of the
  tests' skeleton image (an empty root filesystem with this checkout's venv bound in), and
  its cost per point beyond the first (goal: under 15 s for 100 points, both ways);
* the whole dry run of the 100-point sweep with the check on and off, and their difference.

CPU figures on this machine; the image is the tests' skeleton, so the image figure is
Apptainer's cost on top of the same Python. Needs Apptainer for the image rows
(scripts/install-apptainer.sh); without it they are skipped.

    .venv/bin/python benchmarks/precheck.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the tests' image helpers
from tests.skeleton import host_binds, make_skeleton  # noqa: E402

LRS = ",".join(f"{(i + 1) * 1e-5:.5g}" for i in range(100))
SWEEP = ["+experiment=mpt_tiny", "hydra/launcher=slurm", "hydra.launcher.dry_run=true", f"train.optimizer.lr={LRS}"]


def venv_binds() -> list[str]:
    """The skeleton's binds, and this interpreter's venv where it lies outside the checkout."""
    out = host_binds()
    venv = os.path.realpath(sys.prefix)
    if not any(venv == b or venv.startswith(b + "/") for b in out):
        out.append(venv)
    return out


def points(overrides: list[str], n: int) -> list:
    """``n`` points of ``overrides`` (+ a learning rate each), composed and validated."""
    from hpc_llm.app import validate_job
    from hpc_llm.config.compose import compose
    from hpc_llm.launch.precheck import point_of

    out = []
    cfg = compose(overrides)
    train = validate_job(cfg, "/nonexistent/run")
    for i in range(n):
        one = {**train, "optimizer": {**train["optimizer"], "lr": (i + 1) * 1e-5}}
        out.append(point_of(cfg, one, f"job {i}"))
    return out


def timed_check(pts: list, repeats: int) -> float:
    from hpc_llm.launch.precheck import check_sweep

    walls = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        check_sweep(pts)
        walls.append(time.perf_counter() - t0)
    return statistics.median(walls)


def dry_run(extra: list[str], env: dict[str, str], runs: Path) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "hpc_llm", *SWEEP, *extra], env=env, capture_output=True, text=True, cwd=runs
    )
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"dry run failed: {proc.stderr[-2000:]}")
    return wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    os.environ["HPC_LLM_PRECHECK"] = "1"
    (Path.home() / ".hpc_llm").mkdir(exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="precheck-", dir=str(Path.home() / ".hpc_llm")))
    os.environ.setdefault("HPC_LLM_HOME", str(work / "home"))
    rows = []
    ways: list[tuple[str, list[str]]] = [("venv", [])]
    if shutil.which("apptainer"):
        image = make_skeleton(work / "skeleton")
        binds = "container.binds=[" + ",".join(venv_binds()) + "]"
        ways.append(("image", ["container=apptainer", f"container.image={image}", binds]))
    for label, extra in ways:
        one = timed_check(points(["+experiment=mpt_tiny", *extra], 1), args.repeats)
        hundred = timed_check(points(["+experiment=mpt_tiny", *extra], 100), args.repeats)
        rows.append((label, one, hundred))
        print(
            f"check in the {label}: 1 point {one:.2f} s, 100 points {hundred:.2f} s (goal < 15 s); "
            f"{(hundred - one) / 99 * 1000:.0f} ms a point beyond the first"
        )
    if not shutil.which("apptainer"):
        print("image: skipped (no apptainer on this machine; scripts/install-apptainer.sh)")
    env = {**os.environ, "HPC_LLM_RUNS": str(work / "runs")}
    on = statistics.median(dry_run([], env, work) for _ in range(args.repeats))
    off = statistics.median(dry_run(["precheck.enabled=false"], env, work) for _ in range(args.repeats))
    print(
        f"dry run of a 100-point sweep: check on {on:.2f} s, off {off:.2f} s: the check adds {on - off:.2f} s "
        f"({(on - off) / off:.1f}x the rest of the dry run)"
    )
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
