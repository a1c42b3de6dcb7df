"""What the check before the queue costs a submit (hpc_llm/launch/precheck.py; how it runs:
docs/guides/precheck.md), cold, warm and from the cache.

Printed, medians of ``--repeats`` (3), each beside the load average it was measured at (this
machine may be shared: figures are comparable at a like load only):

* the whole dry run of a 100-point learning-rate sweep of ``+experiment=mpt_tiny``
  (``python -m hpc_llm ... hydra/launcher=slurm hydra.launcher.dry_run=true``) in four ways,
  each round with a new hpc_llm home, the check-off baseline run in the same round:

  - off: ``precheck.enabled=false`` (the baseline);
  - cold: the first submit of the day (no warm checker, nothing cached);
  - warm: the checker up, the points new to it (other learning rates);
  - repeat: the same sweep submitted again (its verdicts cached);

  as seconds, seconds the check adds and ratios to off (goals: warm <= 1.5x off; repeat: the
  check adds <= 1 s; cold: it adds <= 10 s on an idle machine). Each line the check printed is
  matched against the way meant (a warm checker restarts when a source of hpc_llm the check
  loaded changes: in a checkout others edit, a "warm" round can be cold);
* the check alone, in this process (``check_sweep``), of 1 and of 100 points: one process
  (``precheck.warm=false``: the stack started for it) and warm, in the venv and through
  ``apptainer exec`` of the tests' skeleton image (an empty root filesystem with this
  checkout's venv bound in: Apptainer's cost on top of the same Python). Needs Apptainer for
  the image rows (scripts/install-apptainer.sh); without it they are skipped.

    .venv/bin/python benchmarks/precheck.py [--repeats 3] [--no-image]
"""

from __future__ import annotations

import argparse
import os
import re
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


def lrs(round_: int, n: int = 100) -> str:
    """``n`` learning rates, another set each round (points new to a warm checker)."""
    return ",".join(f"{(i + 1) * 1e-5 * (1 + round_ / 1000):.6g}" for i in range(n))


def sweep(round_: int) -> list[str]:
    dry = ["hydra/launcher=slurm", "hydra.launcher.dry_run=true"]
    return ["+experiment=mpt_tiny", *dry, f"train.optimizer.lr={lrs(round_)}"]


def load() -> float:
    return os.getloadavg()[0]


def venv_binds() -> list[str]:
    """The skeleton's binds, and this interpreter's venv where it lies outside the checkout."""
    out = host_binds()
    venv = os.path.realpath(sys.prefix)
    if not any(venv == b or venv.startswith(b + "/") for b in out):
        out.append(venv)
    return out


def dry_run(args: list[str], env: dict[str, str], cwd: Path) -> tuple[float, float, str]:
    """(seconds, load average at its start, the check's line)."""
    at = load()
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "hpc_llm", *args], env=env, capture_output=True, text=True, cwd=cwd)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"dry run failed: {proc.stderr[-2000:]}")
    said = [ln for ln in proc.stderr.splitlines() if ln.startswith("hpc_llm: check before the queue:")]
    return wall, at, said[0] if said else ""


def stop_checkers(env: dict[str, str]) -> None:
    subprocess.run(
        [sys.executable, "-c", "from hpc_llm.cli import main; main()", "check", "--stop"],
        env=env,
        capture_output=True,
        check=True,
    )


def kind(line: str) -> str:
    if ": 100 points, from the cache;" in line:
        return "repeat"
    m = re.search(r": 100 points, (cold|warm)", line)
    return m.group(1) if m else "off" if not line else "?"


def figure(walls: list[float], loads: list[float]) -> str:
    return f"{statistics.median(walls):.2f} s (load {min(loads):.1f}-{max(loads):.1f})"


def submits(work: Path, repeats: int) -> None:
    """The 100-point dry run: off, cold, warm, repeat, a new hpc_llm home each round."""
    ways = ("off", "cold", "warm", "repeat")
    walls: dict[str, list[float]] = {w: [] for w in ways}
    loads: dict[str, list[float]] = {w: [] for w in ways}
    adds: dict[str, list[float]] = {w: [] for w in ways}
    odd: list[str] = []
    for r in range(repeats):
        env = {**os.environ, "HPC_LLM_RUNS": str(work / "runs"), "HPC_LLM_HOME": str(work / f"home-{r}")}
        env["HPC_LLM_PRECHECK"] = "1"
        plan = [("cold", sweep(2 * r)), ("warm", sweep(2 * r + 1)), ("repeat", sweep(2 * r + 1))]
        off = ("off", [*sweep(2 * r), "precheck.enabled=false"])
        plan = [off, *plan] if r % 2 == 0 else [*plan, off]  # the baseline first, then last
        got: dict[str, float] = {}
        try:
            for way, args in plan:
                wall, at, line = dry_run(args, env, work)
                walls[way].append(wall)
                loads[way].append(at)
                got[way] = wall
                if kind(line) != way:
                    odd.append(f"round {r + 1}, {way}: {line or '(no line)'}")
        finally:
            stop_checkers(env)
        for way in ways[1:]:
            adds[way].append(got[way] - got["off"])
    off_med = statistics.median(walls["off"])
    print(f"dry run of a 100-point lr sweep, medians of {repeats} (a new hpc_llm home each round):")
    print(f"  check off (baseline): {figure(walls['off'], loads['off'])}")
    goals = {"cold": "adds <= 10 s on an idle machine", "warm": "<= 1.5x off", "repeat": "adds <= 1 s"}
    for way in ways[1:]:
        med = statistics.median(walls[way])
        print(
            f"  check {way}: {figure(walls[way], loads[way])}: the check adds {statistics.median(adds[way]):.2f} s, "
            f"{med / off_med:.2f}x off (goal: {goals[way]})"
        )
    for line in odd:
        print(f"  not the way meant: {line}")


def points(overrides: list[str], n: int, round_: int = 0) -> list:
    """``n`` points of ``overrides`` (+ a learning rate each, another set each round: a warm
    checker has found nothing of them yet), composed and validated."""
    from hpc_llm.app import validate_job
    from hpc_llm.config.compose import compose
    from hpc_llm.launch.precheck import point_of

    out = []
    cfg = compose(overrides)
    train = validate_job(cfg, "/nonexistent/run")
    for i in range(n):
        one = {**train, "optimizer": {**train["optimizer"], "lr": (i + 1) * 1e-5 * (1 + round_ / 1000)}}
        out.append(point_of(cfg, one, f"job {i}"))
    return out


_ROUND = [0]


def timed_check(overrides: list[str], n: int, repeats: int) -> tuple[float, float]:
    import io
    from contextlib import redirect_stderr

    from hpc_llm.launch.precheck import check_sweep

    walls, loads = [], []
    for _ in range(repeats):
        _ROUND[0] += 1
        pts = points(overrides, n, _ROUND[0])
        loads.append(load())
        t0 = time.perf_counter()
        with redirect_stderr(io.StringIO()):  # the check's own line, once a call
            check_sweep(pts)
        walls.append(time.perf_counter() - t0)
    return statistics.median(walls), max(loads)


def alone(work: Path, repeats: int, image: bool) -> None:
    """The check alone, in this process: one process (cold) and warm, in the venv and the image."""
    from hpc_llm.launch import checker_client

    os.environ.update(HPC_LLM_PRECHECK="1", HPC_LLM_HOME=str(work / "home-alone"))
    ways: list[tuple[str, list[str]]] = [("venv", [])]
    if image and shutil.which("apptainer"):
        skeleton = make_skeleton(work / "skeleton")
        binds = "container.binds=[" + ",".join(venv_binds()) + "]"
        ways.append(("image", ["container=apptainer", f"container.image={skeleton}", binds]))
    elif image:
        print("image: skipped (no apptainer on this machine; scripts/install-apptainer.sh)")
    try:
        for label, extra in ways:
            for how, more in (("one process, cold", ["precheck.warm=false"]), ("warm", [])):
                got = {}
                overrides = ["+experiment=mpt_tiny", *extra, *more, "precheck.cache=false"]
                if how == "warm":
                    timed_check(overrides, 1, 1)  # the checker up, its stack imported
                for n in (1, 100):
                    got[n] = timed_check(overrides, n, repeats)
                (one, l1), (hundred, l100) = got[1], got[100]
                print(
                    f"check alone in the {label}, {how}: 1 point {one:.2f} s, 100 points {hundred:.2f} s; "
                    f"{(hundred - one) / 99 * 1000:.1f} ms a point beyond the first (load <= {max(l1, l100):.1f})"
                )
    finally:
        checker_client.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-image", action="store_true", help="without the rows through apptainer")
    ap.add_argument("--submits-only", action="store_true", help="only the dry runs (not the check alone)")
    args = ap.parse_args()
    (Path.home() / ".hpc_llm").mkdir(exist_ok=True)  # not /tmp: every job gets a private one
    work = Path(tempfile.mkdtemp(prefix="precheck-", dir=str(Path.home() / ".hpc_llm")))
    print(f"uptime at the start: {subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}")
    try:
        submits(work, args.repeats)
        if not args.submits_only:
            alone(work, args.repeats, image=not args.no_image)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"uptime at the end: {subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}")


if __name__ == "__main__":
    main()
