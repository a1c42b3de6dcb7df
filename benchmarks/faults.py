"""What each kind of fault costs a run on the dev cluster, and what fault tolerance costs a run with none.

For each fault kind -- a rank SIGKILLed, a rank frozen (SIGSTOP), a node's
daemons and tasks killed, a preemption, a time limit -- one mpt_tiny run is
submitted, hit once mid-run, and left to finish. Printed per kind: seconds
from the fault to its detection (the supervisor's decision), to training
again (the next attempt's first batch), batches recomputed, and the goodput
of the whole run. Then the overhead of fault tolerance itself: a fault-free
run's wall clock with ``fault.enabled=true`` over ``false``, alternated
``--repeats`` times in this process (target <= 1.02).

CPU figures on a 2-core machine where the "nodes" are slurmd processes on one
host: the times are Slurm's and hpc_llm's plumbing (detection, requeue,
restart), not a GPU cluster's. Needs root and slurm-wlm. Uses $SLURM_CONF if
set, else starts a dev cluster under ~/.hpc_llm/bench-cluster and stops it.

    .venv/bin/python benchmarks/faults.py [--only kill,freeze,node,preempt,time] [--repeats 3]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

RUN = [
    "+experiment=mpt_tiny",
    "hydra/launcher=slurm",
    "eval=none",
    "checkpoint.interval=20ba",
    "fault.heartbeat_s=2",
    "fault.hang_timeout_s=20",
]
TWO_NODES = ["resources.nodes=2", "resources.tasks_per_node=1"]
ALONE = ["resources.nodes=1", "resources.tasks_per_node=1", "hydra.launcher.exclusive=true"]


def read(path: Path) -> Any:
    try:
        return json.loads(path.read_text()) if path.exists() else None
    except ValueError:
        return None


def wait(pred: Any, timeout: float, what: str) -> Any:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = pred()
        if v:
            return v
        time.sleep(0.25)
    raise SystemExit(f"timed out waiting for {what}")


def submit(args: list[str], env: dict[str, str]) -> tuple[str, Path]:
    out = subprocess.run(
        [sys.executable, "-m", "hpc_llm", *args], env=env, capture_output=True, text=True, check=True
    ).stdout
    line = next(ln for ln in out.splitlines() if "submitted Slurm job" in ln)
    return line.split("submitted Slurm job ")[1].split(",")[0], Path(line.split("run dir ")[1].split()[0])


def beat(run_dir: Path, rank: int) -> dict:
    from hpc_llm.job import heartbeat

    found = heartbeat.read_all(run_dir).get(rank)
    return dataclasses.asdict(found) if found else {}


def done(run_dir: Path, timeout: float = 900) -> dict:
    return wait(
        lambda: (
            (read(run_dir / "results.json") or {}).get("status") in ("completed", "failed")
            and read(run_dir / "results.json")
        ),
        timeout,
        f"{run_dir} to finish",
    )


def nodes_of(job_id: str, env: dict[str, str]) -> list[str]:
    out = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%N"], env=env, capture_output=True, text=True)
    return subprocess.run(
        ["scontrol", "show", "hostnames", out.stdout.strip()], env=env, capture_output=True, text=True
    ).stdout.split()


#: nodes a scenario killed, started again once its run is over (DevCluster is frozen)
TO_REVIVE: list[str] = []


def fault_kill(run_dir: Path, job_id: str, env: dict[str, str], cluster: Any) -> float:
    os.kill(
        wait(lambda: beat(run_dir, 1).get("batch", -1) >= 30 and beat(run_dir, 1), 300, "rank 1")["pid"], signal.SIGKILL
    )
    return time.time()


def fault_freeze(run_dir: Path, job_id: str, env: dict[str, str], cluster: Any) -> float:
    os.kill(
        wait(lambda: beat(run_dir, 1).get("batch", -1) >= 30 and beat(run_dir, 1), 300, "rank 1")["pid"], signal.SIGSTOP
    )
    return time.time()


def fault_node(run_dir: Path, job_id: str, env: dict[str, str], cluster: Any) -> float:
    from hpc_llm.slurm import devcluster

    victim = wait(lambda: beat(run_dir, 1).get("batch", -1) >= 30 and beat(run_dir, 1), 300, "rank 1")
    devcluster.kill_node(cluster, victim["node"])
    t = time.time()
    TO_REVIVE.append(victim["node"])
    return t


def fault_preempt(run_dir: Path, job_id: str, env: dict[str, str], cluster: Any) -> float:
    wait(lambda: beat(run_dir, 0).get("batch", -1) >= 30, 300, "rank 0")
    nodes = nodes_of(job_id, env)
    subprocess.run(
        ["sbatch", "-p", "high", "-N", str(len(nodes)), "-w", ",".join(nodes), "--exclusive", "--wrap", "sleep 2"],
        env=env,
        check=True,
        capture_output=True,
    )
    return time.time()


def fault_time(run_dir: Path, job_id: str, env: dict[str, str], cluster: Any) -> float:
    a = wait(
        lambda: next((x for x in read(run_dir / ".hpc_llm" / "attempts.json") or [] if x.get("signal_time")), None),
        300,
        "the time-limit signal",
    )
    return float(a["signal_time"])


SCENARIOS = {
    "kill": ("a rank SIGKILLed", [*TWO_NODES, "train.max_duration=300ba"], fault_kill),
    "freeze": ("a rank frozen (SIGSTOP)", [*TWO_NODES, "train.max_duration=300ba"], fault_freeze),
    "node": ("a node's daemons and tasks killed", [*TWO_NODES, "train.max_duration=300ba"], fault_node),
    "preempt": ("a preemption", [*ALONE, "train.max_duration=600ba"], fault_preempt),
    "time": (
        "a time limit (1 min)",
        [
            *ALONE,
            "train.max_duration=1500ba",
            "resources.time=1",
            "hydra.launcher.signal_lead_s=45",
            "fault.stop_lead_s=30",
        ],
        fault_time,
    ),
}


def measure(kind: str, env: dict[str, str], cluster: Any) -> dict[str, Any]:
    what, args, inject = SCENARIOS[kind]
    job_id, run_dir = submit([*RUN, *args], env)
    t_fault = inject(run_dir, job_id, env, cluster)
    try:
        r = done(run_dir)
    finally:
        while TO_REVIVE:
            from hpc_llm.slurm import devcluster

            devcluster.revive_node(cluster, TO_REVIVE.pop())
    attempts = r.get("attempts", [])
    stopped = next((a for a in attempts if a.get("cause") not in (None, "completed")), None)
    nxt = attempts[attempts.index(stopped) + 1] if stopped and attempts.index(stopped) + 1 < len(attempts) else None
    full = read(run_dir / ".hpc_llm" / "attempts.json") or []
    decided = next((a.get("decided_at") for a in full if a.get("cause") not in (None, "completed")), None)
    again = (
        full[full.index(next(a for a in full if a.get("decided_at") == decided)) + 1].get("first_batch_at")
        if decided
        else None
    )
    return {
        "fault": what,
        "status": r["status"],
        "cause": stopped.get("cause") if stopped else None,
        "action": stopped.get("action") if stopped else None,
        "detect_s": round(decided - t_fault, 1) if decided else None,
        "training_again_s": round(again - t_fault, 1) if again else None,
        "recomputed": sum((r.get("batches_recomputed") or {}).values()),
        "resumed_at": nxt.get("resumed_at_batch") if nxt else None,
        "goodput": r.get("goodput"),
        "total_s": r.get("total_wallclock_s"),
    }


def overhead(env: dict[str, str], repeats: int) -> tuple[float, list[float], list[float]]:
    """A fault-free run's allocation time with fault tolerance on over off, alternated."""
    times: dict[bool, list[float]] = {True: [], False: []}
    for i in range(repeats * 2):
        enabled = i % 2 == 0
        job_id, run_dir = submit(
            [*RUN, *ALONE, "train.max_duration=300ba", f"fault.enabled={str(enabled).lower()}"], env
        )
        r = done(run_dir)
        times[enabled].append(float(r["total_wallclock_s"]))
    return statistics.median(times[True]) / statistics.median(times[False]), times[True], times[False]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default=",".join(SCENARIOS), help="comma-separated: " + ",".join(SCENARIOS))
    ap.add_argument("--repeats", type=int, default=3, help="fault-free runs per setting for the overhead ratio")
    args = ap.parse_args()
    from _cluster import dev_cluster

    with dev_cluster("bench-cluster", nodes=3, ctld_port=26817) as (cluster, env):
        runs = Path(tempfile.mkdtemp(prefix="faults-bench-", dir=str(Path.home() / ".hpc_llm")))
        env.update(HPC_LLM_RUNS=str(runs), HPC_LLM_HOME=str(runs / "home"))
        rows = [measure(k, env, cluster) for k in args.only.split(",") if k]
        print("mpt_tiny on the dev cluster (CPU, gloo; checkpoint every 20 batches; heartbeat 2 s, hang timeout 20 s)")
        print(
            "| fault | cause | action | fault->detected s | fault->training again s | batches recomputed | "
            "goodput | total s | status |"
        )
        print("|---|---|---|---|---|---|---|---|---|")
        for r in rows:
            print(
                f"| {r['fault']} | {r['cause']} | {r['action']} | {r['detect_s']} | {r['training_again_s']} | "
                f"{r['recomputed']} | {r['goodput']} | {r['total_s']} | {r['status']} |"
            )
        if args.repeats:
            ratio, on, off = overhead(env, args.repeats)
            print(
                "\nfault-free run, 300 batches, allocation wall clock: "
                f"fault tolerance on {statistics.median(on):.1f} s "
                f"(runs {', '.join(f'{x:.1f}' for x in on)}), off {statistics.median(off):.1f} s "
                f"(runs {', '.join(f'{x:.1f}' for x in off)}): ratio {ratio:.3f} (target <= 1.02)"
            )


if __name__ == "__main__":
    main()
