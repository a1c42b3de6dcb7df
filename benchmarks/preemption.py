"""Preemption round trips on the dev cluster: signal-to-requeue, save time, batches lost.

Submits a 2-node mpt_tiny run on the preemptable `low` partition, preempts it
--preemptions times with an exclusive job on `high` (waiting for each resume),
lets it finish, and prints per preemption: seconds from the signal to
`scontrol requeue` returning, checkpoint save seconds, the batch it stopped
at and the batch the next attempt resumed from; then batches_lost and the
requeued job's wait before restarting (cred_expire on the dev cluster).

Needs root and slurm-wlm. Uses $SLURM_CONF if set, else starts a dev cluster
under ~/.hpc_llm/bench-cluster and stops it afterwards.

    .venv/bin/python benchmarks/preemption.py [--preemptions 3]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def attempts(run_dir: Path) -> list[dict]:
    p = run_dir / ".hpc_llm" / "attempts.json"
    return json.loads(p.read_text()) if p.exists() else []


def wait(pred, timeout: float, what: str):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = pred()
        if v:
            return v
        time.sleep(0.5)
    raise SystemExit(f"timed out waiting for {what}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preemptions", type=int, default=3)
    ap.add_argument("--batches", type=int, default=400)
    args = ap.parse_args()
    env = dict(os.environ)
    started = None
    if not env.get("SLURM_CONF"):
        from hpc_llm.slurm import devcluster

        started = devcluster.up(root=Path.home() / ".hpc_llm" / "bench-cluster", nodes=3, ctld_port=26817)
        env.update(started.env())
    runs = Path(tempfile.mkdtemp(prefix="preempt-bench-", dir=str(Path.home() / ".hpc_llm")))
    env.update(HPC_LLM_RUNS=str(runs), HPC_LLM_HOME=str(runs / "home"))
    try:
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "hpc_llm",
                "+experiment=mpt_tiny",
                "hydra/launcher=slurm",
                "resources.nodes=2",
                "resources.tasks_per_node=1",
                "eval=none",
                f"train.max_duration={args.batches}ba",
                f"preemption.max_requeues={args.preemptions + 1}",
            ],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        run_dir = Path(out.split("run dir ")[1].split()[0])
        for i in range(args.preemptions):
            wait(
                lambda i=i: (
                    len(attempts(run_dir)) == i + 1
                    and attempts(run_dir)[-1]["last_batch"] > attempts(run_dir)[-1]["resumed_at_batch"] + 3
                ),
                300,
                f"attempt {i + 1} to train",
            )
            subprocess.run(
                ["sbatch", "-p", "high", "-N", "3", "--exclusive", "--wrap", "sleep 1"],
                env=env,
                check=True,
                capture_output=True,
            )
            wait(lambda i=i: attempts(run_dir)[i]["ended"] == "preempted", 120, f"preemption {i + 1}")
        r = wait(
            lambda: (
                json.loads((run_dir / "results.json").read_text())
                if (run_dir / "results.json").exists()
                and json.loads((run_dir / "results.json").read_text())["status"] in ("completed", "failed")
                else None
            ),
            600,
            "the run to finish",
        )
    finally:
        if started is not None:
            from hpc_llm.slurm import devcluster

            devcluster.down(started.root)
    items = attempts(run_dir)
    print(f"run: mpt_tiny, 2 nodes x 1 rank (CPU, gloo), {args.batches} batches; status {r['status']}")
    print("preemption | signal->requeue s | save s | stopped at batch | next attempt resumed at | restart wait s")
    for i, (a, nxt) in enumerate(zip(items, items[1:], strict=False), 1):
        wait_s = nxt["started_at"] - (a["signal_time"] or nxt["started_at"])
        print(
            f"{i:10d} | {a['signal_to_requeue_s']:17.3f} | {a['save_s']:6.3f} | {a['stopped_at_batch']:16d} | "
            f"{nxt['resumed_at_batch']:23d} | {wait_s:14.1f}"
        )
    print(f"restarts: {r['restarts']}, batches_lost: {r['batches_lost']}, final train loss {r['train_loss']:.6f}")


if __name__ == "__main__":
    main()
