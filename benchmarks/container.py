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

``--pyxis`` measures instead, on a dev cluster of its own whose srun and slurmd load pyxis
(``dev-cluster up --pyxis``; scripts/install-pyxis.sh builds enroot and pyxis), for each Slurm
version installed: what one srun step costs with ``--container-image`` (pyxis unpacks the
squashfs at every step) against the same step without, for the tests' enroot image and the same
image padded with 100 and 500 MB of random data; ``enroot start`` of the squashfs itself (what
the check before the queue runs); and, for no container, Apptainer and pyxis, a cold job start
(submit to rank 0's first batch, 1 node x 1 rank) and a rank restart (SIGKILL to the rank
training again).

    .venv/bin/python benchmarks/container.py --pyxis [--samples 5]
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
from tests.skeleton import host_binds, make_enroot_image, make_skeleton  # noqa: E402

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
    ap.add_argument("--pyxis", action="store_true", help="pyxis's per-step cost; cold start and restart, 3 runtimes")
    args = ap.parse_args()
    if args.pyxis:
        pyxis_figures(args)
        return
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


def pyxis_figures(args: argparse.Namespace) -> None:
    from hpc_llm.devcluster import cluster as devcluster
    from hpc_llm.devcluster import pyxis

    (Path.home() / ".hpc_llm").mkdir(exist_ok=True)  # not /tmp: every job gets a private one
    work = Path(tempfile.mkdtemp(prefix="pyxis-bench-", dir=str(Path.home() / ".hpc_llm")))
    n = args.samples
    try:
        images = {0: make_enroot_image(work / "rootfs", work / "image.sqsh")}
        for mb in (100, 500):
            rootfs = work / f"rootfs-{mb}"
            shutil.copytree(work / "rootfs", rootfs, symlinks=True)
            with open(rootfs / "pad.bin", "wb") as f:  # random: squashfs cannot shrink it
                for _ in range(mb):
                    f.write(os.urandom(1 << 20))
            images[mb] = make_enroot_image(rootfs, work / f"image-{mb}.sqsh")
        enroot_env = dict(os.environ, PATH=f"{pyxis.enroot().parent}:{os.environ['PATH']}")
        mounts = [a for b in host_binds() for a in ("--mount", f"{b}:{b}")]
        start = statistics.median(
            [timed_env(["enroot", "start", *mounts, str(images[0]), "true"], enroot_env) for _ in range(n)]
        )
        print(
            f"enroot start of the squashfs on this machine (the check before the queue; median of {n}): {start:.2f} s"
        )
        for slurm in devcluster.installed_versions():
            if pyxis.unavailable(slurm):
                print(f"Slurm {slurm}: {pyxis.unavailable(slurm)}")
                continue
            root = Path.home() / ".hpc_llm" / f"bench-pyxis-{slurm}"
            c = devcluster.up(root=root, nodes=2, ctld_port=27017, slurm=slurm, accounting=False, pyxis=True)
            try:
                env = c.full_env()
                plain = statistics.median([timed_env(["srun", "-N1", "/bin/true"], env) for _ in range(n)])
                cells = []
                for image in images.values():
                    step = [
                        "srun",
                        "-N1",
                        f"--container-image={image}",
                        f"--container-mounts={','.join(host_binds())}",
                        "/bin/true",
                    ]
                    t = statistics.median([timed_env(step, env) for _ in range(n)])
                    size = image.stat().st_size / 1e6
                    cells.append(f"{size:.0f} MB image {t:.2f} s (+{t - plain:.2f} s)")
                print(f"Slurm {slurm}, one srun step (median of {n}): no container {plain:.2f} s; " + "; ".join(cells))
            finally:
                devcluster.down(root)
        if not args.skip_run:
            start_and_restart(images[0], work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def timed_env(cmd: list[str], env: dict[str, str]) -> float:
    t = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True, env=env)
    return time.perf_counter() - t


def start_and_restart(enroot_image: Path, work: Path) -> None:
    """Submit to rank 0's first batch, and SIGKILL of rank 0 to it training again, for no
    container, Apptainer (the skeleton SIF) and pyxis (the enroot squashfs), on 22.05."""
    import signal

    from hpc_llm.devcluster import cluster as devcluster
    from tests.jobs import beat, finished, paced, submit, wait_for

    binds = f"container.binds=[{','.join(host_binds())}]"
    run = [
        "+experiment=mpt_tiny",
        "hydra/launcher=slurm",
        "eval=none",
        "resources.nodes=1",
        "resources.tasks_per_node=1",
        "checkpoint.interval=5ba",
        "train.max_duration=40ba",
        *paced(0.1),
    ]
    setups: dict[str, list[str]] = {"none": []}
    if shutil.which("apptainer"):
        sif = build(work / "skeleton.sif", skeleton(work / "skeleton"))
        setups["apptainer"] = ["container=apptainer", f"container.image={sif}", binds]
    setups["pyxis"] = ["container=pyxis", f"container.image={enroot_image}", binds]
    root = Path.home() / ".hpc_llm" / "bench-pyxis-runs"
    c = devcluster.up(root=root, nodes=2, ctld_port=27117, accounting=False, pyxis=True)
    site = work / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--target",
            str(site),
            "tests/plugins/hpc-llm-pace",
        ],
        check=True,
        cwd=ROOT,
    )
    try:
        env = dict(c.full_env(), HPC_LLM_RUNS=str(work / "runs"), HPC_LLM_HOME=str(work / "home"))
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(site), env.get("PYTHONPATH", "")) if p)
        env["HPC_LLM_PRECHECK"] = "0"
        for name, extra in setups.items():
            t0 = time.monotonic()
            _job, run_dir = submit([*run, *extra], env, work)
            wait_for(lambda rd=run_dir: beat(rd, 0).get("batch", -1) >= 1 and beat(rd, 0), 300, "batch 1")
            cold = time.monotonic() - t0
            victim = wait_for(lambda rd=run_dir: beat(rd, 0).get("batch", -1) >= 8 and beat(rd, 0), 300, "batch 8")
            os.kill(victim["pid"], signal.SIGKILL)
            t1 = time.monotonic()
            wait_for(
                lambda rd=run_dir, v=victim: beat(rd, 0).get("pid") not in (None, v["pid"]) and beat(rd, 0),
                300,
                "the rank again",
            )
            again = time.monotonic() - t1
            r = finished(run_dir, 300)
            assert r["status"] == "completed", r.get("error")
            print(
                f"{name:9s} cold start (submit to batch 1) {cold:.1f} s; rank restart (kill to training) {again:.1f} s"
            )
    finally:
        devcluster.down(root)


if __name__ == "__main__":
    main()
