"""Login-node latency: no-wait submits of a 4-point node sweep and a 100-point lr sweep.

Needs a Slurm cluster: uses $SLURM_CONF if set, else starts a dev cluster
under ~/.hpc_llm/bench-cluster (and stops it afterwards). Prints the median
wall time of

    python -m hpc_llm +experiment=mpt_tiny hydra/launcher=slurm resources.nodes=1,2,3,4 ...

(goal <= 1.5 s), the same against four bare `sbatch --wrap` calls as a baseline
ratio; of a 100-point learning-rate sweep, which goes out as one job array in
one sbatch call (goal <= 6 s), against one bare `sbatch --array=0-99 --wrap`;
and proof from `python -X importtime` that the submitting process imports no
torch / composer / llmfoundry. Submitted jobs are cancelled.

With ``--submitit`` it also puts the same 100-point sweep through hydra-submitit-launcher
(``hydra/launcher=submitit_slurm``, pip-installed into a temporary directory: it is not one
of hpc_llm's dependencies) and hpc_llm's own launcher, alternated in one run, both timed
from the start of the process until the sweep's 100 tasks are in squeue (hpc_llm's time
until its process ended is printed beside): submitit's and hpc_llm's with the check before
the queue off (``precheck.enabled=false``; goal: hpc_llm <= 0.5x submitit's), then hpc_llm's
with the check on, cold (a new hpc_llm home: the first submit of the day), warm (its checker
up, the points new to it; goals: <= 1.5x the check off, <= 0.5x submitit's) and the same sweep
again (from the cache; goal: the check adds <= 1 s), each beside the load average it ran at.

    .venv/bin/python benchmarks/login_latency.py [--repeats 5] [--submitit]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

#: queued but not started while the next submit is timed: on a login node the jobs run
#: elsewhere; here they would share the 2 cores with the submitting process
LATER = "+hydra.launcher.extra_sbatch.begin=now+3600"
SWEEP = [
    "+experiment=mpt_tiny",
    "hydra/launcher=slurm",
    "resources.nodes=1,2,3,4",  # four shapes: four jobs
    "resources.tasks_per_node=1",
    "train.global_train_batch_size=48",  # 1 to 4 ranks, micro-batch 4
    "hydra.launcher.partition=low",
    LATER,
]
LRS = ",".join(f"{(i + 1) * 1e-5:.5g}" for i in range(100))
LR_SWEEP = [
    "+experiment=mpt_tiny",
    "hydra/launcher=slurm",
    "resources.nodes=1",
    "resources.tasks_per_node=1",
    f"train.optimizer.lr={LRS}",
    "hydra.launcher.partition=low",
    "hydra.launcher.array_parallelism=8",
    LATER,
]
IMPORT_LINE = re.compile(r"import time:\s+(\d+) \|\s+(\d+) \|(\s*)(\S+)")
HEAVY = ("torch", "composer", "llmfoundry", "streaming", "transformers")


def job_ids(text: str) -> list[str]:
    return sorted(set(re.findall(r"submitted Slurm job (\d+)", text)))


def timed(cmd: list[str], env: dict[str, str]) -> tuple[float, subprocess.CompletedProcess[str]]:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    return time.perf_counter() - t0, proc


SUBMITIT_WHEEL = "hydra-submitit-launcher==1.2.0"


def submitit_site(into: Path) -> Path:
    """hydra-submitit-launcher in a directory of its own (pip --target; its dependencies, hydra
    and submitit, are this venv's), to put on PYTHONPATH."""
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(into), SUBMITIT_WHEEL], check=True
    )
    return into


def submitit_ids(sweep_root: Path) -> list[str]:
    """Job ids submitit recorded under the sweep dirs (<sweep>/.submitit/<array>_<task>/)."""
    return sorted({p.name.split("_")[0] for p in sweep_root.rglob(".submitit/*") if p.name[:1].isdigit()})


def queued(env: dict[str, str]) -> int:
    """Jobs (array tasks counted one by one) this cluster's queue holds."""
    out = subprocess.run(["squeue", "-h", "-r", "-o", "%i"], env=env, capture_output=True, text=True)
    return len(out.stdout.split())


def until_queued(cmd: list[str], env: dict[str, str], points: int = 100, timeout_s: float = 300) -> float:
    """Seconds from starting ``cmd`` until ``points`` more jobs are in the queue. hydra-submitit-launcher
    then waits for the jobs' results (they are held: --begin=now+3600), so it is stopped there."""
    return until_queued_and_done(cmd, env, points, timeout_s, stop=True)[0]


def until_queued_and_done(
    cmd: list[str], env: dict[str, str], points: int = 100, timeout_s: float = 300, stop: bool = False
) -> tuple[float, float, str]:
    """(seconds until ``points`` more jobs are in the queue, seconds until ``cmd`` ended, its stdout);
    ``stop``: stopped once they are queued (the second figure is then the first)."""
    before = queued(env)
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        while queued(env) - before < points:
            if proc.poll() is not None:
                raise SystemExit(f"{cmd[:4]} ended before its jobs were queued: {(proc.stderr.read() or '')[-2000:]}")
            if time.perf_counter() - t0 > timeout_s:
                raise SystemExit(f"{points} jobs not queued after {timeout_s} s")
            time.sleep(0.05)
        to_queue = time.perf_counter() - t0
        if stop:
            return to_queue, to_queue, ""
        out, err = proc.communicate(timeout=timeout_s)
        if proc.returncode:
            raise SystemExit(f"{cmd[:4]} failed: {err[-2000:]}")
        return to_queue, time.perf_counter() - t0, out
    finally:
        proc.kill()
        proc.wait()


def lr_sweep(k: int) -> list[str]:
    """LR_SWEEP with another set of learning rates (points new to a warm checker)."""
    lrs = ",".join(f"{(i + 1) * 1e-5 * (1 + k / 1000):.6g}" for i in range(100))
    return [a if not a.startswith("train.optimizer.lr=") else f"train.optimizer.lr={lrs}" for a in LR_SWEEP]


def stop_checkers(env: dict[str, str]) -> None:
    """The warm checkers of ``env``'s hpc_llm home (hpc-llm check --stop)."""
    cmd = [sys.executable, "-c", "from hpc_llm.cli import main; main()", "check", "--stop"]
    subprocess.run(cmd, env=env, capture_output=True, check=True)


PLAIN_APP = """import hydra


@hydra.main(config_path=".", config_name="config", version_base="1.3")
def main(cfg) -> None:
    pass


if __name__ == "__main__":
    main()
"""


def plain_app(where: Path, env: dict[str, str]) -> Path:
    """A plain Hydra app (Hydra's own sweeper composes each point) whose config is mpt_tiny's
    train config as hpc_llm makes it (``hpc-llm config --as-yaml``): what the same sweep costs
    hydra-submitit-launcher without hpc_llm."""
    import yaml

    cmd = [sys.executable, "-c", "from hpc_llm.cli import main; main()", "config", "+experiment=mpt_tiny", "--as-yaml"]
    train = yaml.safe_load(subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout)
    where.mkdir(parents=True, exist_ok=True)
    (where / "config.yaml").write_text(yaml.safe_dump({"train": train}, sort_keys=False))
    (where / "app.py").write_text(PLAIN_APP)
    return where / "app.py"


def versus_submitit(env: dict[str, str], runs: Path, repeats: int, submitted: list[str]) -> None:
    """The same 100-point sweep to the queue: hydra-submitit-launcher against hpc_llm's launcher,
    with the check before the queue off, cold (a new hpc_llm home: no warm checker, nothing
    cached), warm (the checker up, the points new to it) and repeated (the same sweep again:
    its verdicts cached), alternated in each round; the load average beside each."""
    site = submitit_site(runs / "submitit-site")
    senv = dict(env, PYTHONPATH=os.pathsep.join(p for p in (str(site), env.get("PYTHONPATH", "")) if p))
    theirs = [
        *(a for a in LR_SWEEP if not a.startswith(("hydra/launcher=", "hydra.launcher.", "+hydra.launcher."))),
        "hydra/launcher=submitit_slurm",
        "hydra.launcher.partition=low",
        "hydra.launcher.array_parallelism=8",
        "+hydra.launcher.additional_parameters.begin=now+3600",
        "precheck.enabled=false",
    ]
    ours = [*LR_SWEEP, "precheck.enabled=false"]
    on = dict(senv, HPC_LLM_PRECHECK="1")
    plain = [
        str(plain_app(runs / "plain-app", senv)),
        "-m",
        *(a for a in theirs if a.startswith(("hydra/launcher=", "hydra.launcher.", "+hydra.launcher.", "train."))),
    ]
    ways = ("plain", "submitit", "off", "cold", "warm", "repeat")
    walls: dict[str, list[float]] = {w: [] for w in ways}
    loads: dict[str, list[float]] = {w: [] for w in ways}
    our_ends: list[float] = []
    homes: list[dict[str, str]] = []
    try:
        for i in range(repeats):
            cold = dict(on, HPC_LLM_HOME=str(runs / f"home-cold-{i}"))
            homes.append(cold)
            plan = [
                ("plain", [*plain, f"hydra.sweep.dir={runs / f'plain-{i}'}"], senv),
                ("submitit", [*theirs], dict(senv, HPC_LLM_RUNS=str(runs / f"submitit-{i}"))),
                ("off", ours, senv),
                ("cold", lr_sweep(3 * i + 1), cold),
                ("warm", lr_sweep(3 * i + 2), cold),
                ("repeat", lr_sweep(3 * i + 2), cold),
            ]
            for way, args, way_env in plan:
                loads[way].append(os.getloadavg()[0])
                if way == "plain":
                    walls[way].append(until_queued([sys.executable, *args], way_env))
                    submitted += submitit_ids(runs / f"plain-{i}")
                elif way == "submitit":
                    walls[way].append(until_queued([sys.executable, "-m", "hpc_llm", *args], way_env))
                    submitted += submitit_ids(runs / f"submitit-{i}")
                else:
                    # timed as theirs is, to the queue; and to its end (the ledger, what it prints, Hydra's end)
                    to_queue, to_end, out = until_queued_and_done([sys.executable, "-m", "hpc_llm", *args], way_env)
                    walls[way].append(to_queue)
                    submitted += job_ids(out)
                    if way == "off":
                        our_ends.append(to_end)
                subprocess.run(["scancel", *submitted], env=env, capture_output=True)
    finally:
        for home in homes:
            stop_checkers(home)
    med = {w: statistics.median(walls[w]) for w in ways}
    sub, off, bare = med["submitit"], med["off"], med["plain"]

    def at(way: str) -> str:
        return f"{med[way]:.2f} s (load {min(loads[way]):.1f}-{max(loads[way]):.1f})"

    print(
        f"100-point lr sweep to the queue (start to 100 tasks in squeue; squeue polled every 50 ms), medians of "
        f"{repeats}, alternated:\n"
        f"  hydra-submitit-launcher on a plain Hydra app (mpt_tiny's train config, Hydra's sweeper): {at('plain')}\n"
        f"  hydra-submitit-launcher on hpc_llm's app (its sweeper; check off): {at('submitit')}\n"
        f"  hpc_llm, check off: {at('off')} -> {off / bare:.2f}x the plain app's, {off / sub:.2f}x submitit's on "
        f"hpc_llm's app (goal <= 0.5x); its process ended after {statistics.median(our_ends):.2f} s",
        flush=True,
    )
    goals = {
        "cold": "adds <= 10 s on an idle machine",
        "warm": "<= 1.5x off, <= 0.5x the plain app's",
        "repeat": "adds <= 1 s",
    }
    for way in ("cold", "warm", "repeat"):
        print(
            f"  hpc_llm, check on, {way}: {at(way)}: the check adds {med[way] - off:+.2f} s; "
            f"{med[way] / off:.2f}x off, {med[way] / bare:.2f}x the plain app's, {med[way] / sub:.2f}x submitit's "
            f"on hpc_llm's app (goal: {goals[way]})",
            flush=True,
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--submitit", action="store_true", help="also against hydra-submitit-launcher (pip-installed)")
    ap.add_argument("--submitit-only", action="store_true", help="only the comparison with hydra-submitit-launcher")
    args = ap.parse_args()
    from _cluster import dev_cluster

    with dev_cluster("bench-cluster", nodes=4, ctld_port=26817) as (_cluster, env):
        (Path.home() / ".hpc_llm").mkdir(exist_ok=True)  # not /tmp: every job gets a private one
        runs = Path(tempfile.mkdtemp(prefix="login-latency-", dir=str(Path.home() / ".hpc_llm")))
        # the check before the queue is measured apart (benchmarks/precheck.py, and --submitit below)
        env.update(HPC_LLM_RUNS=str(runs), HPC_LLM_HOME=str(runs / "home"), HPC_LLM_PRECHECK="0")
        submitted: list[str] = []
        try:
            if args.submitit or args.submitit_only:
                versus_submitit(env, runs, max(1, args.repeats // 2), submitted)
            if args.submitit_only:
                return
            walls, bases = [], []
            for _ in range(args.repeats):
                wall, proc = timed([sys.executable, "-m", "hpc_llm", *SWEEP], env)
                ids = job_ids(proc.stdout)
                assert len(ids) == 4, proc.stdout
                submitted += ids
                walls.append(wall)
                t0 = time.perf_counter()
                for _ in range(4):
                    out = subprocess.run(
                        ["sbatch", "--parsable", "-p", "low", "--begin=now+3600", "--wrap", "true"],
                        env=env,
                        capture_output=True,
                        text=True,
                        check=True,
                    )
                    submitted.append(out.stdout.strip().split(";")[0])
                bases.append(time.perf_counter() - t0)
                subprocess.run(["scancel", *submitted], env=env, capture_output=True)
            lr_walls, lr_bases = [], []
            for _ in range(max(1, args.repeats // 2)):
                wall, proc = timed([sys.executable, "-m", "hpc_llm", *LR_SWEEP], env)
                ids = job_ids(proc.stdout)
                assert len(ids) == 1, ids  # one array, one sbatch call
                submitted += ids
                lr_walls.append(wall)
                t0 = time.perf_counter()
                out = subprocess.run(
                    ["sbatch", "--parsable", "-p", "low", "--begin=now+3600", "--array=0-99%8", "--wrap", "true"],
                    env=env,
                    capture_output=True,
                    text=True,
                    check=True,
                )
                lr_bases.append(time.perf_counter() - t0)
                submitted.append(out.stdout.strip().split(";")[0])
                subprocess.run(["scancel", *submitted], env=env, capture_output=True)
            _, proc = timed([sys.executable, "-X", "importtime", "-m", "hpc_llm", *SWEEP], env)
            submitted += job_ids(proc.stdout)
            modules = [m.group(4) for m in IMPORT_LINE.finditer(proc.stderr)]
            heavy = sorted({m for m in modules if m.split(".")[0] in HEAVY})
            costs = sorted(
                ((int(m.group(2)), m.group(4)) for m in IMPORT_LINE.finditer(proc.stderr) if not m.group(3).strip(" ")),
                reverse=True,
            )[:6]
        finally:
            subprocess.run(["scancel", *submitted], env=env, capture_output=True)
    med, base = statistics.median(walls), statistics.median(bases)
    print(
        f"no-wait submit of a 4-point node sweep: median {med:.2f} s over {args.repeats} (goal <= 1.5 s); "
        f"min {min(walls):.2f} s, max {max(walls):.2f} s"
    )
    print(f"baseline, 4 bare `sbatch --wrap` calls: median {base:.2f} s -> ratio {med / base:.1f}x")
    lr_med, lr_base = statistics.median(lr_walls), statistics.median(lr_bases)
    print(
        f"no-wait submit of a 100-point lr sweep (one job array): median {lr_med:.2f} s over {len(lr_walls)} "
        f"(goal <= 6 s); {lr_med / 100 * 1000:.0f} ms a point"
    )
    print(f"baseline, one bare `sbatch --array=0-99`: median {lr_base:.2f} s -> ratio {lr_med / lr_base:.0f}x")
    print(
        f"modules imported by the submitting process: {len(modules)}; "
        f"torch/composer/llmfoundry/streaming/transformers among them: {heavy or 'none'}"
    )
    print("largest top-level imports (cumulative us): " + ", ".join(f"{n} {c}" for c, n in costs))
    if heavy:
        sys.exit(1)


if __name__ == "__main__":
    main()
