"""What each kind of fault costs a run on the dev cluster, phase by phase; and what the agents cost a run with none.

For each fault kind one mpt_tiny run (2 nodes x 1 rank, paced to 10 batches a
second so every machine reaches the fault mid-run) is submitted, hit once
mid-run, and left to finish, ``--repeats`` times. Printed per kind, as the
median over the repeats, the phases of the recovery, from the run's own
record (attempts.json):

  detect      fault -> the supervisor saw it (a rank's exit, a dead node, a hang)
  decide      seen -> the fault policy's decision
  stop        seen -> every rank of the generation gone
  start       decided -> the next generation forked by the agents
  rendezvous  forked -> LLM Foundry's process group and first barrier
  load        rendezvous -> the checkpoint loaded (Composer's fit start)
  first batch loaded -> the first batch trained
  total       fault -> training again

``--fabric``: ``cut`` (a worker's link down for good), ``cut-host`` (the batch host's), ``slow``
(a worker's link slowed to 8 mbit/s by tbf for 30 s) and ``partition`` (``--only partition``: a
3-node run's batch host partitioned from its other two, all still reaching slurmctld; 4 nodes)
on a multi-host dev cluster (``dev-cluster
up --hosts``, SlurmdTimeout=10; with ``--spares`` Slurm 24.11 and a spare node), measured to
training again (issue #42's targets: a worker cut off with a spare <= 10 s; the batch host cut
off without one <= SlurmdTimeout + 30 s, with spares <= 30 s; a slowed link: no verdict).

Kinds: ``kill`` (a rank SIGKILLed), ``freeze`` (a rank SIGSTOPped), ``node`` (a
node's slurmd, slurmstepds and tasks killed), ``frozen`` (a node frozen:
SIGSTOP of its slurmd and every process on it, thawed once the job gave up on
it), ``preempt``, ``time`` (a 1-minute limit). ``node`` and ``frozen`` run on a
cluster of their own with Slurm's default SlurmdTimeout=300, so whatever the
job sees, Slurm does not see in time. Without a spare node a dead node means a
requeue, which waits for Slurm to release the node (minutes): those runs are
measured to the job's decision, then cancelled.

``--spares``: ``node`` and ``frozen`` with ``resources.spare_nodes=1`` (2 training nodes
and a spare, ``--no-kill``) on a Slurm 24.11 cluster with SlurmdTimeout=300: the spare takes
the node's rank in the same job, so those runs are measured to training again and to the end
(issue #30's targets: a node killed -> training again <= 10 s, frozen <= 15 s).

``--baseline DIR``: a checkout of an older hpc_llm (e.g. ``git worktree add
/tmp/before b91bb50``); each kind runs once more with it (PYTHONPATH=DIR), as
"today's path" beside the agents. ``--throughput N [--together]``: N alternated pairs (or
pairs run at once, a node each) of
fault-free runs of 2,000 batches, the agents against the baseline: tokens/s
ratio (target >= 0.99). ``--json FILE`` writes every figure.

CPU figures on a 2-core machine where the "nodes" are slurmd processes on one
host: the times are Slurm's and hpc_llm's plumbing, not a GPU cluster's. Needs
root and slurm-wlm, and the test plugins on PYTHONPATH (tests/plugins/hpc-llm-pace;
``pip install --target DIR tests/plugins/hpc-llm-pace``, then ``--site DIR``).

    .venv/bin/python benchmarks/faults.py --site DIR [--only kill,node,frozen] [--repeats 5]
        [--baseline DIR] [--throughput 2] [--spares] [--json faults.json]
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
    "++train.callbacks.hpc_llm_test_pace.batch_s=0.1",
]
#: ``--trainer torchtitan``: the same runs with torchtitan's tiny Llama 3 (its own venv; unpaced:
#: a step takes ~0.15 s on one CPU rank)
TITAN_RUN = ["+experiment=llama3_tiny", "hydra/launcher=slurm", "checkpoint.interval=20ba"]
#: hangs named after 20 s: the agents' setting, and the same in the keys of the design before them
HANG = {"agents": ["fault.hang_floor_s=20"], "baseline": ["fault.heartbeat_s=2", "fault.hang_timeout_s=20"]}
TWO_NODES = ["resources.nodes=2", "resources.tasks_per_node=1"]
#: 3 ranks: a global batch they divide (mpt_tiny's 8 does not)
THREE_NODES = [
    "resources.nodes=3",
    "resources.tasks_per_node=1",
    "train.global_train_batch_size=6",
    "train.device_train_microbatch_size=2",
]
ALONE = ["resources.nodes=1", "resources.tasks_per_node=1", "hydra.launcher.exclusive=true"]
PHASES = ("detect", "decide", "stop", "start", "rendezvous", "load", "first batch", "total")


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
        time.sleep(0.1)
    raise SystemExit(f"timed out waiting for {what}")


def submit(args: list[str], env: dict[str, str]) -> tuple[str, Path]:
    # from the runs dir: `python -m` puts its working directory first on sys.path, and run from
    # a checkout that is the checkout's hpc_llm, whatever PYTHONPATH names (--baseline)
    cwd = Path(env["HPC_LLM_RUNS"])
    cwd.mkdir(parents=True, exist_ok=True)
    out = subprocess.run(
        [sys.executable, "-m", "hpc_llm", *args], env=env, cwd=cwd, capture_output=True, text=True, check=True
    ).stdout
    line = next(ln for ln in out.splitlines() if "submitted Slurm job" in ln)
    return line.split("submitted Slurm job ")[1].split(",")[0], Path(line.split("run dir ")[1].split()[0])


def beat(run_dir: Path, rank: int) -> dict:
    from hpc_llm.job import heartbeat

    found = heartbeat.read_all(run_dir).get(rank)
    return dataclasses.asdict(found) if found else {}


def at_batch(run_dir: Path, rank: int, batch: int) -> dict:
    return wait(lambda: beat(run_dir, rank).get("batch", -1) >= batch and beat(run_dir, rank), 300, f"rank {rank}")


def done(run_dir: Path, timeout: float = 1200) -> dict:
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


#: what a scenario must undo once its run is over: nodes to revive, pids to thaw
AFTER: list[Any] = []


def fault_kill(run_dir: Path, job_id: str, env: dict[str, str], cluster: Any) -> float:
    os.kill(at_batch(run_dir, 1, 30)["pid"], signal.SIGKILL)
    return time.time()


def fault_freeze(run_dir: Path, job_id: str, env: dict[str, str], cluster: Any) -> float:
    os.kill(at_batch(run_dir, 1, 30)["pid"], signal.SIGSTOP)
    return time.time()


def fault_node(run_dir: Path, job_id: str, env: dict[str, str], cluster: Any) -> float:
    from hpc_llm.devcluster import cluster as devcluster

    victim = at_batch(run_dir, 1, 30)
    devcluster.kill_node(cluster, victim["node"])
    # never revived (a node's daemons are not restarted before Slurm calls it DOWN, 5 minutes
    # here): the cluster has a node for each repeat, and is stopped at the end
    return time.time()


def fault_frozen(run_dir: Path, job_id: str, env: dict[str, str], cluster: Any) -> float:
    from hpc_llm.devcluster import cluster as devcluster

    victim = at_batch(run_dir, 1, 30)
    frozen = devcluster.freeze_node(cluster, victim["node"])
    t = time.time()
    # thawed once the job has decided (or after 60 s: a run that never decides is the result)
    wait(
        lambda: (
            any(a.get("decided_at") for a in read(run_dir / ".hpc_llm" / "attempts.json") or []) or time.time() - t > 60
        ),
        120,
        "the decision",
    )
    devcluster.thaw_node(frozen)
    return t


def fault_preempt(run_dir: Path, job_id: str, env: dict[str, str], cluster: Any) -> float:
    at_batch(run_dir, 0, 30)
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


def _victim(run_dir: Path, job_id: str, env: dict[str, str], batch_host: bool) -> str:
    """The node to cut: the batch host, or node rank 1 (a training node, never a spare)."""
    worker = at_batch(run_dir, 1, 30)["node"]
    if not batch_host:
        return str(worker)
    out = subprocess.run(["scontrol", "show", "job", "-o", job_id], env=env, capture_output=True, text=True)
    return next(kv.split("=", 1)[1] for kv in out.stdout.split() if kv.startswith("BatchHost="))


def _cut(run_dir: Path, job_id: str, env: dict[str, str], cluster: Any, batch_host: bool) -> float:
    from hpc_llm.devcluster import fabric

    victim = _victim(run_dir, job_id, env, batch_host)
    fabric.cut(cluster, victim)
    AFTER.append(lambda: healed(cluster, victim, job_id))  # healed once the run is measured
    return time.time()


def healed(cluster: Any, node: str, job_id: str, timeout_s: float = 180) -> None:
    """Heal ``node``, then wait until none of the job's steps lives on anywhere: a healed node's
    slurmstepd retries its step-completion message with a back-off, and a node cut again while one
    still retries (the next run's batch host is the same node) misses its UnkillableStepTimeout and
    is drained "Kill task failed" (seen once in 5 runs, 2026-11-28): the bench's, not the product's."""
    from hpc_llm.devcluster import fabric

    fabric.heal(cluster, node)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        out = subprocess.run(["pgrep", "-f", f"slurmstepd: \\[{job_id}\\."], capture_output=True, text=True)
        if not out.stdout.strip():
            return
        time.sleep(2)


def fault_cut(run_dir: Path, job_id: str, env: dict[str, str], cluster: Any) -> float:
    return _cut(run_dir, job_id, env, cluster, batch_host=False)


def fault_cut_host(run_dir: Path, job_id: str, env: dict[str, str], cluster: Any) -> float:
    return _cut(run_dir, job_id, env, cluster, batch_host=True)


def fault_partition(run_dir: Path, job_id: str, env: dict[str, str], cluster: Any) -> float:
    """The batch host and the job's other nodes no longer reach each other; all reach slurmctld."""
    from hpc_llm.devcluster import fabric

    host = _victim(run_dir, job_id, env, batch_host=True)
    others = [n for n in nodes_of(job_id, env) if n != host]
    fabric.partition(cluster, host, others)
    AFTER.append(lambda: fabric.mend(cluster, host, others))
    return time.time()


def fault_slow(run_dir: Path, job_id: str, env: dict[str, str], cluster: Any) -> float:
    from hpc_llm.devcluster import fabric

    victim = _victim(run_dir, job_id, env, batch_host=False)
    fabric.slow(cluster, victim)
    t = time.time()
    time.sleep(30)
    fabric.unslow(cluster, victim)
    return t


#: kind -> (what, args, fault, needs the SlurmdTimeout=300 cluster)
SCENARIOS = {
    "kill": ("a rank SIGKILLed", [*TWO_NODES, "train.max_duration=300ba"], fault_kill, False),
    "freeze": ("a rank frozen (SIGSTOP)", [*TWO_NODES, "train.max_duration=300ba"], fault_freeze, False),
    "node": (
        "a node killed (SlurmdTimeout=300)",
        [*TWO_NODES, "train.max_duration=300ba", "hydra.launcher.exclusive=true"],
        fault_node,
        True,
    ),
    "frozen": (
        "a node frozen (SlurmdTimeout=300)",
        [*TWO_NODES, "train.max_duration=300ba", "hydra.launcher.exclusive=true"],
        fault_frozen,
        True,
    ),
    "preempt": ("a preemption", [*ALONE, "train.max_duration=600ba"], fault_preempt, False),
    # the fabric (--fabric: a multi-host cluster, SlurmdTimeout=10)
    "cut": ("a worker cut off", [*TWO_NODES, "train.max_duration=300ba"], fault_cut, False),
    "cut-host": ("the batch host cut off", [*TWO_NODES, "train.max_duration=300ba"], fault_cut_host, False),
    "slow": ("a link slowed (tbf 8 mbit/s) for 30 s", [*TWO_NODES, "train.max_duration=600ba"], fault_slow, False),
    "partition": (
        "the batch host partitioned from the 2 other nodes",
        [*THREE_NODES, "train.max_duration=300ba"],
        fault_partition,
        False,
    ),
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
        False,
    ),
}


def phases(full: list[dict], t_fault: float) -> dict[str, float | None]:
    """The recovery's phases (seconds) from attempts.json: the first stop after the fault and
    the attempt after it."""
    stop = next((a for a in full if a.get("cause") not in (None, "completed")), None)
    nxt = full[full.index(stop) + 1] if stop is not None and full.index(stop) + 1 < len(full) else None

    def gap(a: float | None, b: float | None) -> float | None:
        return round(b - a, 3) if a is not None and b is not None else None

    detected = (stop or {}).get("detected_at") or (stop or {}).get("decided_at")
    decided = (stop or {}).get("decided_at")
    forked = (nxt or {}).get("forked_at") or (nxt or {}).get("started_at")
    return {
        "detect": gap(t_fault, detected),
        "decide": gap(detected, decided),
        "stop": gap(detected, (stop or {}).get("stopped_at")),
        "start": gap(decided, forked),
        "rendezvous": gap(forked, (nxt or {}).get("rendezvous_at")),
        "load": gap((nxt or {}).get("rendezvous_at"), (nxt or {}).get("loaded_at")),
        "first batch": gap((nxt or {}).get("loaded_at"), (nxt or {}).get("first_batch_at")),
        "total": gap(t_fault, (nxt or {}).get("first_batch_at")),
    }


def decided(run_dir: Path, env: dict[str, str], job_id: str) -> dict[str, Any]:
    """Without a spare, a dead node's run waits for Slurm (SlurmdTimeout=300 and more) before it
    trains again: the job's own part ends with its decision; the job is then cancelled."""
    wait(
        lambda: any(a.get("decided_at") for a in read(run_dir / ".hpc_llm" / "attempts.json") or []),
        300,
        "the decision",
    )
    time.sleep(2)
    subprocess.run(["scancel", job_id], env=env, capture_output=True)
    return {"status": "decided, then cancelled (Slurm holds a requeue until the node is DOWN)"}


#: with a spare: 2 training nodes and one warm spare in the same job (resources.spare_nodes)
SPARE = ["resources.spare_nodes=1"]


class NotStarted(Exception):
    """A run whose job (or spare's agent) never started: not a measurement of recovery."""


#: the dev cluster's Slurm 24.11 sometimes launches a step on a node before the job's container
#: is there (job_container/tmpfs): "container_p_join: open failed for .../<job>/.ns"
CONTAINER_RACE = "container_p_join"


def all_agents_warm(run_dir: Path, job_id: str, env: dict[str, str], agents: int) -> None:
    """Every agent of the allocation warm (a spare's too), before the fault is injected; raises
    NotStarted (the job cancelled) when a step never entered the job's container."""
    logs = run_dir / "logs"
    end = time.monotonic() + 600
    while time.monotonic() < end:
        texts = [p.read_text(errors="replace") for p in logs.glob("*") if p.is_file()] if logs.exists() else []
        if any(CONTAINER_RACE in t for t in texts):
            subprocess.run(["scancel", job_id], env=env, capture_output=True)
            raise NotStarted(f"job {job_id}: a step never entered the job's container ({CONTAINER_RACE})")
        if sum("hpc_llm agent on" in t and "warm in" in t for t in texts) >= agents:
            return
        time.sleep(0.2)
    raise SystemExit(f"timed out waiting for {agents} warm agents of job {job_id}")


def measure(kind: str, env: dict[str, str], cluster: Any, path: str = "agents", spares: bool = False) -> dict[str, Any]:
    what, args, inject, slow = SCENARIOS[kind]
    if spares:
        what, args = f"{what}, with a spare", [*args, *SPARE]
    job_id, run_dir = submit([*RUN, *HANG[path], *args], env)
    if spares:
        all_agents_warm(run_dir, job_id, env, 3)
    t_fault = inject(run_dir, job_id, env, cluster)
    try:
        # with a spare the job trains on without Slurm: measured to the end
        r = decided(run_dir, env, job_id) if slow and not spares else done(run_dir)
    finally:
        while AFTER:
            AFTER.pop()()
    full = read(run_dir / ".hpc_llm" / "attempts.json") or []
    stop = next((a for a in full if a.get("cause") not in (None, "completed")), {})
    return {
        "fault": what,
        "status": r["status"],
        "cause": stop.get("cause"),
        "action": stop.get("action"),
        "suspects": stop.get("suspects"),
        "phases": phases(full, t_fault),
        "recomputed": sum((r.get("batches_recomputed") or {}).values()),
        "goodput": r.get("goodput"),
        "total_s": r.get("total_wallclock_s"),
    }


def median_row(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out = dict(rows[0])
    out["phases"] = {
        p: (statistics.median(v) if (v := [r["phases"][p] for r in rows if r["phases"][p] is not None]) else None)
        for p in PHASES
    }
    out["runs"] = len(rows)
    out["causes"] = sorted({str(r["cause"]) for r in rows})
    return out


def throughput(env: dict[str, str], base_env: dict[str, str], pairs: int, together: bool = False) -> dict[str, Any]:
    """Fault-free runs of 2,000 batches, the agents and the baseline alternated: tokens/s over
    the whole run (``tokens_done / train_s``; Composer's ``throughput/tokens_per_sec`` is its
    speed monitor's last window of 100 batches, five checkpoint saves and whatever the machine
    did then: it spread 3x between two runs of the same code). The ratio is the median of the
    pairs' ratios: a pair's two runs meet the same load, more or less."""
    tps: dict[str, list[float]] = {"agents": [], "baseline": []}
    window: dict[str, list[float]] = {"agents": [], "baseline": []}
    args = [a for a in RUN if "hpc_llm_test_pace" not in a] + [*ALONE, "train.max_duration=2000ba"]
    for i in range(pairs):
        order = [("agents", env), ("baseline", base_env)][:: 1 if i % 2 == 0 else -1]
        # --together: the pair's two runs at once, each on a node of its own: both meet the
        # machine's load at the same moments (on a shared machine, load moves more between two
        # runs in turn than between two at once)
        runs = []
        for name, e in order:
            runs.append((name, submit([*args, *HANG[name]], e)[1]))
            if not together:
                done(runs[-1][1], 3600)
            else:
                # the run dir is named to the second (Hydra's ${now:...}): the baseline's code
                # (before 0c34230) gave two submits of one experiment within a second one dir,
                # and the second resumed the first's run
                time.sleep(1.1)
        for name, run_dir in runs:
            r = done(run_dir, 3600)
            tps[name].append(round(float(r["tokens_done"]) / float(r["train_s"]), 1))
            window[name].append(float(r["tokens_per_sec"]))
    ratios = [a / b for a, b in zip(tps["agents"], tps["baseline"], strict=True)]
    return {
        "tokens_per_sec": tps,
        "last_window_tokens_per_sec": window,
        "pair_ratios": [round(x, 4) for x in ratios],
        "ratio": round(statistics.median(ratios), 4),
        "together": together,
    }


def table(rows: dict[str, dict[str, Any]], baseline: dict[str, dict[str, Any]]) -> None:
    print("| fault | path | cause | action | " + " | ".join(f"{p} s" for p in PHASES) + " | recomputed | status |")
    print("|---" * (len(PHASES) + 6) + "|")
    for kind, r in rows.items():
        for path, row in (("agents", r), ("before", baseline.get(kind))):
            if row is None:
                continue
            ph = " | ".join("-" if row["phases"][p] is None else f"{row['phases'][p]:.2f}" for p in PHASES)
            runs = f" (median of {row['runs']})" if row.get("runs", 1) > 1 else ""
            print(
                f"| {row['fault']} | {path}{runs} | {','.join(row.get('causes', [row['cause']]))} | {row['action']} | "
                f"{ph} | {row['recomputed']} | {row['status']} |"
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default="kill,node,frozen", help="comma-separated: " + ",".join(SCENARIOS))
    ap.add_argument("--repeats", type=int, default=5, help="runs per kind (the median is printed)")
    ap.add_argument("--site", required=True, help="a pip --target dir holding tests/plugins/hpc-llm-pace")
    ap.add_argument("--baseline", default=None, help="a checkout of the previous design, run once per kind beside")
    ap.add_argument("--throughput", type=int, default=0, help="alternated pairs of fault-free 2,000-batch runs")
    ap.add_argument("--together", action="store_true", help="--throughput: a pair's two runs at once, a node each")
    ap.add_argument("--spares", action="store_true", help="node/frozen with a spare node, on Slurm 24.11")
    ap.add_argument("--json", default=None, help="write every figure to this file")
    ap.add_argument(
        "--fabric",
        action="store_true",
        help="cut,cut-host,slow on a multi-host cluster (dev-cluster up --hosts; with --spares: 24.11, a spare)",
    )
    ap.add_argument("--trainer", default="llmfoundry", choices=("llmfoundry", "torchtitan"), help="the runs' trainer")
    args = ap.parse_args()
    if args.trainer == "torchtitan":
        RUN[:] = TITAN_RUN
        os.environ.setdefault(
            "HPC_LLM_TORCHTITAN_PYTHON", str(Path(__file__).resolve().parents[1] / ".venv-torchtitan/bin/python")
        )
    if args.fabric:
        return fabric_main(args)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _cluster import dev_cluster

    kinds = [k for k in args.only.split(",") if k]
    rows: dict[str, dict[str, Any]] = {}
    before: dict[str, dict[str, Any]] = {}
    every: dict[str, Any] = {"runs": {}, "baseline": {}}
    (Path.home() / ".hpc_llm").mkdir(exist_ok=True)  # not /tmp: every job gets a private one
    runs = Path(tempfile.mkdtemp(prefix="faults-bench-", dir=str(Path.home() / ".hpc_llm")))

    def envs(env: dict[str, str]) -> tuple[dict[str, str], dict[str, str]]:
        ours = dict(env, HPC_LLM_RUNS=str(runs), HPC_LLM_HOME=str(runs / "home"), PYTHONPATH=args.site)
        base = dict(ours, PYTHONPATH=os.pathsep.join([args.baseline, args.site])) if args.baseline else ours
        return ours, base

    for slow, name, port in ((False, "bench-cluster", 26817), (True, "bench-cluster-300", 26917)):
        chosen = [k for k in kinds if SCENARIOS[k][3] == slow]
        if not chosen and not (args.throughput and not slow):
            continue
        # the slow cluster loses a node to each "node" run: one each, and two to train on
        nodes = 3 + (args.repeats + 1 if "node" in chosen else 0)
        # spares need Slurm >= 23.02.6: the slow cluster runs 24.11 then
        slurm = "24.11" if slow and args.spares else None
        with dev_cluster(name, nodes=nodes, ctld_port=port, slurmd_timeout_s=300 if slow else 10, slurm=slurm) as (
            cluster,
            env,
        ):
            ours, base = envs(env)
            for kind in chosen:
                spares = args.spares and slow
                measured: list[dict[str, Any]] = []
                not_started: list[str] = []
                while len(measured) < args.repeats and len(not_started) < args.repeats:
                    try:
                        measured.append(measure(kind, ours, cluster, spares=spares))
                    except NotStarted as exc:
                        print(f"not counted: {exc}", file=sys.stderr)
                        not_started.append(str(exc))
                every["runs"][kind] = measured
                every.setdefault("not_started", {})[kind] = not_started
                rows[kind] = median_row(measured)
                if args.baseline:
                    before[kind] = measure(kind, base, cluster, "baseline")
                    every["baseline"][kind] = before[kind]
            if args.throughput and not slow:
                every["throughput"] = throughput(ours, base, args.throughput, args.together)
    print(
        ("llama3_tiny (torchtitan)" if args.trainer == "torchtitan" else "mpt_tiny")
        + ", 2 nodes x 1 rank on the dev cluster (CPU, gloo; 10 batches/s; checkpoint every 20 batches)"
        + ("; node/frozen with 1 spare node on Slurm 24.11" if args.spares else "")
    )
    table(rows, before)
    if "throughput" in every:
        t = every["throughput"]
        print(
            f"\nfault-free tokens/s over 2,000 batches, alternated: agents {t['tokens_per_sec']['agents']}, "
            f"before {t['tokens_per_sec']['baseline']}: pair ratios {t['pair_ratios']}, "
            f"median {t['ratio']:.4f} (target >= 0.99)"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(every, indent=2, default=str))


FABRIC = ("cut", "cut-host", "slow")


def fabric_main(args: argparse.Namespace) -> None:
    """The fabric's faults on a multi-host dev cluster (its nodes hosts of their own, SlurmdTimeout
    10 s), each measured to training again; with ``--spares`` on Slurm 24.11 with a spare node."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _cluster import dev_cluster

    kinds = [k for k in (args.only.split(",") if args.only != "kill,node,frozen" else FABRIC) if k]
    (Path.home() / ".hpc_llm").mkdir(exist_ok=True)  # not /tmp: every job gets a private one
    runs = Path(tempfile.mkdtemp(prefix="faults-bench-", dir=str(Path.home() / ".hpc_llm")))
    rows: dict[str, dict[str, Any]] = {}
    every: dict[str, Any] = {"runs": {}}
    slurm = "24.11" if args.spares else "22.05"
    # a partition's 3-node run is requeued without its batch host: a fourth node takes its place
    nodes = 4 if "partition" in kinds else 3
    with dev_cluster("bench-hosts", nodes=nodes, ctld_port=27017, slurm=slurm, hosts=True) as (cluster, env):
        ours = dict(env, HPC_LLM_RUNS=str(runs), HPC_LLM_HOME=str(runs / "home"), PYTHONPATH=args.site)
        for kind in kinds:
            measured = []
            for _ in range(args.repeats):
                measured.append(measure(kind, ours, cluster, spares=args.spares))
                # the cut node back in service before the next run (ReturnToService=2)
                time.sleep(15 if kind.startswith("cut") else 0)
            every["runs"][kind] = measured
            rows[kind] = median_row(measured)
    print(
        f"mpt_tiny, 2 nodes x 1 rank (partition: 3 of 4 nodes) on a multi-host dev cluster (Slurm {slurm}, "
        "SlurmdTimeout=10)" + ("; 1 spare node" if args.spares else "")
    )
    table(rows, {})
    for kind, ms in every["runs"].items():
        print(
            f"{kind}: totals {[m['phases']['total'] for m in ms]}, causes {[m['cause'] for m in ms]}, "
            f"suspects {[m['suspects'] for m in ms]}"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(every, indent=2, default=str))


if __name__ == "__main__":
    main()
