"""What running every rank inside Apptainer costs, measured with the real runtime.

Printed:

* per-rank start-up (python importing hpc_llm's job side, torch, Composer and
  LLM Foundry) on the host and inside ``apptainer exec``, and the ratio;
* ``apptainer exec`` overhead per task: ``/bin/true`` through it minus without it;
* staging a 100 MB image (``container.stage=true``'s copy-then-rename) and the
  first exec from the staged copy;
* a whole mpt_tiny run on the dev cluster (1 node, 1 rank), wall clock inside
  the container over outside, alternated ``--repeats`` times (target <= 1.03).

The image is the tests' skeleton (an empty root filesystem; the host's /usr and
this checkout's venv are bound in), so the figures are Apptainer's own cost,
not a different Python's. CPU figures on a 2-core VM; the dev cluster's "nodes"
are slurmd processes on this host. Needs root, slurm-wlm and Apptainer
(scripts/install-apptainer.sh). Uses $SLURM_CONF if set, else starts a dev
cluster under ~/.hpc_llm/bench-container-cluster and stops it.

    .venv/bin/python benchmarks/container.py [--repeats 2] [--batches 100] [--skip-run]
"""

from __future__ import annotations

import argparse
import json
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

IMPORTS = "import hpc_llm.job.rank.task, torch, composer, llmfoundry"


def skeleton(root: Path, pad_mb: int = 0) -> Path:
    """The tests' skeleton image (tests/skeleton.py), optionally padded to a size."""
    make_skeleton(root)
    if pad_mb:
        with open(root / "pad.bin", "wb") as f:  # random: squashfs cannot shrink it
            for _ in range(pad_mb):
                f.write(os.urandom(1 << 20))
    return root


def build(image: Path, rootfs: Path) -> Path:
    subprocess.run(["apptainer", "build", "-F", str(image), str(rootfs)], check=True, capture_output=True)
    return image


def timed(cmd: list[str], repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        t = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True)
        out.append(time.perf_counter() - t)
    return out


def exec_prefix(image: Path) -> list[str]:
    return ["apptainer", "exec", *[a for b in host_binds() for a in ("--bind", b)], str(image)]


def wall_clock(args: list[str], env: dict[str, str]) -> float:
    proc = subprocess.run(
        [sys.executable, "-m", "hpc_llm", *args, "hydra.launcher.wait=true", "hydra.launcher.poll_s=1"],
        env=env,
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise SystemExit(f"run failed: {proc.stderr[-2000:]}")
    line = next(ln for ln in proc.stdout.splitlines() if "run dir " in ln)
    run_dir = Path(line.split("run dir ")[1].split()[0])
    r = json.loads((run_dir / "results.json").read_text())
    if r["status"] != "completed":
        raise SystemExit(f"run {run_dir} {r['status']}: {r.get('error')}")
    return float(r["total_wallclock_s"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=2, help="mpt_tiny runs per setting (alternated)")
    ap.add_argument("--batches", type=int, default=100, help="train.max_duration of each mpt_tiny run")
    ap.add_argument("--samples", type=int, default=10, help="timings per start-up figure")
    ap.add_argument("--skip-run", action="store_true", help="only the start-up, exec and staging figures")
    args = ap.parse_args()
    if shutil.which("apptainer") is None:
        raise SystemExit("apptainer is not on PATH: run scripts/install-apptainer.sh")
    version = subprocess.run(["apptainer", "--version"], capture_output=True, text=True).stdout.strip()
    (Path.home() / ".hpc_llm").mkdir(exist_ok=True)  # not /tmp: every job gets a private one
    work = Path(tempfile.mkdtemp(prefix="container-bench-", dir=str(Path.home() / ".hpc_llm")))
    try:
        image = build(work / "skeleton.sif", skeleton(work / "skeleton"))
        print(f"{version}; image: skeleton SIF ({image.stat().st_size // 1024} KiB) with host /usr and venv bound")

        n = args.samples
        bare = statistics.median(timed([sys.executable, "-c", IMPORTS], n))
        inside = statistics.median(timed([*exec_prefix(image), "python3", "-c", IMPORTS], n))
        print(
            f"per-rank start-up ({IMPORTS!r}, median of {n}): host {bare:.3f} s, "
            f"in apptainer exec {inside:.3f} s: ratio {inside / bare:.3f}"
        )
        true_host = statistics.median(timed(["/bin/true"], n))
        true_in = statistics.median(timed([*exec_prefix(image), "/bin/true"], n))
        print(
            f"apptainer exec overhead per task (/bin/true, median of {n}): "
            f"{true_in - true_host:.3f} s ({true_in:.3f} s vs {true_host:.3f} s)"
        )

        big = build(work / "big.sif", skeleton(work / "big", pad_mb=100))
        scratch = work / "scratch"
        stage_s, first_s = [], []
        for i in range(3):
            dst = scratch / f"hpc_llm-image-{i}.sif"
            t = time.perf_counter()
            # what container.stage=true runs on each node (hpc_llm.builtin.container_runtimes)
            subprocess.run(
                ["bash", "-c", f"mkdir -p {scratch} && cp -f {big} {dst}.job && mv -f {dst}.job {dst} && sync {dst}"],
                check=True,
            )
            stage_s.append(time.perf_counter() - t)
            first_s.append(timed([*exec_prefix(dst), "/bin/true"], 1)[0])
        print(
            f"staging a {big.stat().st_size / 1e6:.0f} MB image to local disk (copy, rename, sync; median of 3): "
            f"{statistics.median(stage_s):.3f} s; first exec from the copy {statistics.median(first_s):.3f} s"
        )
        if not args.skip_run:
            run_inside_vs_outside(image, args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run_inside_vs_outside(image: Path, args: argparse.Namespace, work: Path) -> None:
    from _cluster import dev_cluster

    run = [
        "+experiment=mpt_tiny",
        "hydra/launcher=slurm",
        "eval=none",
        "resources.nodes=1",
        "resources.tasks_per_node=1",
        "hydra.launcher.exclusive=true",
        f"train.max_duration={args.batches}ba",
    ]
    inside = [*run, "container=apptainer", f"container.image={image}", f"container.binds=[{','.join(host_binds())}]"]
    with dev_cluster("bench-container-cluster", nodes=2, ctld_port=26917) as (_cluster, env):
        env.update(HPC_LLM_RUNS=str(work / "runs"), HPC_LLM_HOME=str(work / "home"))
        wall_clock([*run, "train.max_duration=2ba"], env)  # warm the corpus cache
        times: dict[str, list[float]] = {"outside": [], "inside": []}
        for _ in range(args.repeats):
            times["outside"].append(wall_clock(run, env))
            times["inside"].append(wall_clock(inside, env))
        out, ins = statistics.median(times["outside"]), statistics.median(times["inside"])
        print(
            f"mpt_tiny, {args.batches} batches, 1 node x 1 rank, allocation wall clock: "
            f"inside {ins:.1f} s (runs {', '.join(f'{x:.1f}' for x in times['inside'])}), "
            f"outside {out:.1f} s (runs {', '.join(f'{x:.1f}' for x in times['outside'])}): "
            f"ratio {ins / out:.3f} (target <= 1.03)"
        )


if __name__ == "__main__":
    main()
