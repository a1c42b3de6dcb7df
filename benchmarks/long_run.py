"""A 70B pretraining run of two months on 64 H100 nodes, simulated: does the fault policy finish it?

Drives **the same decision function the supervisor runs** (``hpc_llm.job.supervisor.policy.decide``,
imported, not copied) through a simulated run, event by event: every stop of a
training step becomes the facts the supervisor would gather (``policy.Stop``), the
decision is carried out (restart in the allocation, requeue, fail), and time,
checkpoints, exclusions and disk are accounted. "Before" is the same function with
the rules of before behind its ``legacy_*`` flags (lifetime failure budget, blame on
the first signal-killed srun line, a SIGTERM at the time limit read as a crash, the
end time read once at start) plus keep-last-K per attempt on disk; "after" is the
policy as it ships.

Fixed inputs:

* 64 nodes needed, a partition of 72; 60 days of training; a 24 h time limit.
* Node MTBF 264 node-days (the Llama 3 report: 419 interruptions in 54 days on 2,048
  nodes); of the failures, 40 % kill the node (Slurm NODE_FAIL, repaired in 2 days),
  50 % raise on one rank (ECC, Xid, NCCL: the rank exits 1, the others are
  ``Terminated``), 10 % hang (found after ``fault.hang_timeout_s`` = 30 min).
* One flaky node: it raises an Xid every 12 h of use until it is left out.
* Preemptions: one every 3 days on average (saved at the signal); one in ten lands
  during start-up, before the attempt's first save.
* Slow saves: one time limit in five finds the filesystem slow, and the save is still
  running when Slurm's SIGTERM comes.
* An admin shortens the time limit once (day 30): the job ends an hour later.
* A 70B sharded save and load at the estimator's bandwidth (840 GB at 2 GB/s per
  node: 6.6 s), every Young's interval sqrt(2 x save x job MTBF); keep the last 3.
* Restart in place 5 min; queue wait after a requeue 30 min; start-up 3 min.

The optimum it compares with is Young/Daly's for the same rates: the checkpoint
cost plus half an interval and a recovery per failure, plus the unavoidable costs of
the time limits and preemptions (a save, a queue wait, a start-up each): the
physical limit of checkpoint/restart. Event-driven: 100 seeds take seconds.

    .venv/bin/python benchmarks/long_run.py [--seeds 100] [--before]
"""

from __future__ import annotations

import argparse
import math
import random
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hpc_llm.job.failures import RankFailure, TaskError  # noqa: E402
from hpc_llm.job.supervisor import policy  # noqa: E402
from hpc_llm.results.estimate import CHECKPOINT_BYTES_PER_PARAM, GB, NODE_MTBF_DAYS, WRITE_GBPS_PER_NODE  # noqa: E402
from hpc_llm.rundir.record import Attempt  # noqa: E402

H, DAY = 3600.0, 86400.0
NODES, SPARES = 64, 8
WORK_S = 60 * DAY
LIMIT_S = 24 * H
SAVE_S = 70e9 * CHECKPOINT_BYTES_PER_PARAM / (NODES * WRITE_GBPS_PER_NODE * GB)
LOAD_S = SAVE_S
MTBF_JOB_S = NODE_MTBF_DAYS * DAY / NODES
INTERVAL_S = math.sqrt(2 * SAVE_S * MTBF_JOB_S)
RESTART_S, QUEUE_S, STARTUP_S = 5 * 60.0, 30 * 60.0, 3 * 60.0
HANG_S = 30 * 60.0
PREEMPT_MEAN_S = 3 * DAY
FLAKY_MEAN_S = 12 * H
REPAIR_S = 2 * DAY
KEEP = 3
ECC = "CUDA error: uncorrectable ECC error encountered"
LEAD_S = 2 * SAVE_S + 30


@dataclass
class Run:
    seed: int
    legacy: bool
    completed: bool = False
    t: float = 0.0
    work: float = 0.0  # checkpointed work (training seconds)
    productive: float = 0.0
    waste: dict[str, float] = field(default_factory=dict)
    failures_charged: int = 0
    max_ckpts_on_disk: int = 0
    healthy_excluded: int = 0
    reason: str = ""

    def lose(self, cause: str, seconds: float) -> None:
        self.waste[cause] = self.waste.get(cause, 0.0) + seconds


def simulate(seed: int, legacy: bool) -> Run:
    rng = random.Random(seed)
    # the policy's own "before" rules left the production code (issue #29); --before now only
    # changes this simulation's own modelling (keep-last-K per attempt, lost preemptions)
    s = policy.Settings(nodes=NODES, max_preemptions=None)
    r = Run(seed, legacy)
    names = [f"n{i:02d}" for i in range(NODES + SPARES)]
    flaky = names[7]
    down: dict[str, float] = {}  # node -> back at
    faulty: set[str] = {flaky}  # nodes that failed themselves (the rest are healthy)
    excluded: set[str] = set()
    history: list[Attempt] = []
    earlier: list[RankFailure] = []
    ckpts_on_disk = 0
    shortened = False
    alloc_end = 0.0
    in_alloc = False
    next_preempt = rng.expovariate(1 / PREEMPT_MEAN_S)
    step = 0
    while r.work < WORK_S:
        if r.t > 200 * DAY:
            r.reason = "did not finish in 200 days"
            r.healthy_excluded = len(excluded - faulty)
            return r
        for n, back in list(down.items()):
            if back <= r.t:
                del down[n]
        if not in_alloc:
            usable = [n for n in names if n not in excluded and n not in down]
            if len(usable) < NODES:
                r.reason = f"pending forever: {len(usable)} usable nodes"
                return r
            nodes = usable[:NODES]
            alloc_end = r.t + LIMIT_S
            in_alloc, step = True, 0
        start = r.t
        a = Attempt("1", len(history), start, step=step, nodes=list(nodes), resumed_at_batch=int(r.work))
        overhead = STARTUP_S + LOAD_S
        # what ends this attempt first
        rate = (NODES - (flaky in nodes)) / (NODE_MTBF_DAYS * DAY) + ((1 / FLAKY_MEAN_S) if flaky in nodes else 0)
        fail_at = start + rng.expovariate(rate)
        if not shortened and start >= 30 * DAY:
            shortened = True
            alloc_end = min(alloc_end, start + H)
            admin = True
        else:
            admin = False
        limit_at = alloc_end - LEAD_S
        done_at = start + overhead + (WORK_S - r.work) * (1 + SAVE_S / INTERVAL_S)
        preempt_at = next_preempt if next_preempt > start else start + overhead / 2
        ev = min(fail_at, limit_at, preempt_at, done_at)
        # work done and checkpointed up to ev
        train_wall = max(0.0, ev - start - overhead)
        segments = int(train_wall // (INTERVAL_S + SAVE_S))
        saved_work = segments * INTERVAL_S
        tail = train_wall - segments * (INTERVAL_S + SAVE_S)
        unsaved = min(tail, INTERVAL_S)
        r.t = ev
        r.lose("start-up and load", min(overhead, ev - start))
        r.lose("periodic saves", segments * SAVE_S)
        # before: each attempt's Composer keeps its own K and forgets earlier attempts' saves;
        # after: every start prunes to the K newest, plus at most one unfinished save
        ckpts_on_disk = ckpts_on_disk + min(segments, KEEP) if legacy else min(ckpts_on_disk + segments, KEEP)
        if segments:
            a.checkpoint_batch = int(r.work + saved_work)
        a.last_batch = int(r.work + saved_work + unsaved)
        facts: dict = {"now": ev, "end_time": alloc_end}
        if ev == done_at:
            r.productive += saved_work + unsaved
            r.work = WORK_S
            r.completed = True
            break
        if ev == fail_at:
            victim = flaky if (flaky in nodes and rng.random() < (1 / FLAKY_MEAN_S) / rate) else rng.choice(nodes)
            kind = rng.random()
            faulty.add(victim)
            rank = nodes.index(victim) * 8
            bystander = next(n for n in nodes if n != victim)
            if victim == flaky or 0.4 <= kind < 0.9:
                f = RankFailure(rank, victim, "RuntimeError", ECC, int(r.work + saved_work + unsaved), ev)
                facts.update(
                    returncode=1,
                    failures=(f,),
                    task_errors=(
                        TaskError(victim, str(rank), "Exited with exit code 1"),
                        TaskError(bystander, "0-7", "Terminated"),
                    ),
                )
                earlier_now = f
            elif kind < 0.4:
                down[victim] = ev + REPAIR_S
                facts.update(returncode=1, failed_nodes=(victim,))
                earlier_now = None
            else:
                r.t += HANG_S
                r.lose("hang detection", HANG_S)
                facts.update(returncode=137, hang=(f"rank {rank} silent", (victim,)))
                earlier_now = None
            r.lose("work lost", unsaved)
            r.productive += saved_work
            r.work += saved_work
            d = policy.decide(history, a, policy.Stop(**facts), s, earlier)
            if earlier_now is not None:
                earlier.append(earlier_now)
        elif ev == preempt_at:
            next_preempt = ev + rng.expovariate(1 / PREEMPT_MEAN_S)
            if ev - start < overhead:  # during start-up: no save yet
                a.state = "failed"
                cause = "lost" if legacy else policy.lost_cause("PREEMPTED")
                d = policy.Decision("requeue", cause, "preempted during start-up", "lost")
                if legacy and sum(1 for x in history if x.cause in policy.FAILURE_CAUSES) + 1 > s.max_failures:
                    d = policy.Decision("fail", cause, "fault.max_failures reached", "lost")
            else:
                a.state, a.stopped_at_batch = "stopped", int(r.work + saved_work + unsaved)
                r.t += SAVE_S
                r.lose("saves at a stop", SAVE_S)
                r.productive += saved_work + unsaved
                r.work += saved_work + unsaved
                ckpts_on_disk += 1
                d = policy.decide(history, a, policy.Stop(returncode=0, stop_cause="preemption", **facts), s)
        else:  # the time limit
            slow = rng.random() < 0.2
            if admin and legacy:
                # the end time read at start: no stop was forwarded, SIGTERM at the new limit
                facts.update(returncode=143, sigterm_at=alloc_end, end_time=alloc_end + 23 * H)
                r.lose("work lost", unsaved)
                r.productive += saved_work
                r.work += saved_work
            elif slow:
                facts.update(
                    returncode=143,
                    stop_cause="time_limit",
                    sigterm_at=alloc_end,
                    task_errors=(TaskError(nodes[0], "0-7", "Terminated"), TaskError(nodes[1], "8-15", "Terminated")),
                )
                r.lose("work lost", unsaved)
                r.productive += saved_work
                r.work += saved_work
            else:
                a.state, a.stopped_at_batch = "stopped", int(r.work + saved_work + unsaved)
                facts.update(returncode=0, stop_cause="time_limit")
                r.productive += saved_work + unsaved
                r.work += saved_work + unsaved
                ckpts_on_disk += 1
            r.t = alloc_end
            r.lose("time-limit lead", LEAD_S)
            d = policy.decide(history, a, policy.Stop(**facts), s)
        if not legacy:
            unfinished = 1 if (d.cause in ("time_limit", "preemption") and a.state != "stopped") else 0
            ckpts_on_disk = min(ckpts_on_disk, KEEP) + unfinished
        r.max_ckpts_on_disk = max(r.max_ckpts_on_disk, ckpts_on_disk)
        if d.cause in policy.FAILURE_CAUSES:
            r.failures_charged += 1
        history.append(replace(a, cause=d.cause, action=d.action, suspects=list(d.suspects), ended_at=r.t))
        if d.action == "fail":
            r.reason = d.reason
            r.healthy_excluded = len(excluded - faulty)
            return r
        if d.action == "restart":
            r.t += RESTART_S
            r.lose("restart in place", RESTART_S)
            step += 1
        else:
            excluded = set(d.exclude)
            in_alloc = False
            r.t += QUEUE_S
            r.lose("queue wait", QUEUE_S)
    r.healthy_excluded = len(excluded - faulty)
    return r


def optimum_goodput() -> float:
    """Young/Daly's goodput for the same rates, with the unavoidable stops' costs."""
    recover = (
        0.4 * (QUEUE_S + STARTUP_S + LOAD_S)
        + 0.5 * (RESTART_S + STARTUP_S + LOAD_S)
        + 0.1 * (HANG_S + RESTART_S + STARTUP_S + LOAD_S)
    )
    waste = SAVE_S / (INTERVAL_S + SAVE_S) + (INTERVAL_S / 2 + recover) / MTBF_JOB_S
    per_stop = SAVE_S + QUEUE_S + STARTUP_S + LOAD_S
    waste += per_stop / LIMIT_S + per_stop / PREEMPT_MEAN_S
    return 1 - waste


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=100)
    ap.add_argument(
        "--before", action="store_true", help="the rules before hpc_llm.job.supervisor.policy (legacy flags)"
    )
    args = ap.parse_args(argv)
    runs = [simulate(seed, args.before) for seed in range(args.seeds)]
    done = [r for r in runs if r.completed]
    goodput = sum(r.productive / r.t for r in done) / len(done) if done else 0.0
    best = optimum_goodput()
    label = "before" if args.before else "after"
    print(f"{label}: 70B on {NODES} nodes, {WORK_S / DAY:.0f} days of training, {len(runs)} seeds")
    print(f"  save {SAVE_S:.1f}s every {INTERVAL_S / 60:.1f} min (Young), job MTBF {MTBF_JOB_S / DAY:.1f} days")
    ends: dict[str, list[float]] = {}
    for r in runs:
        if not r.completed:
            key = r.reason.split(";")[0][:90]
            ends.setdefault(key, []).append(r.t / DAY)
    for reason, days in sorted(ends.items(), key=lambda x: -len(x[1])):
        print(f"  {len(days)} run(s) ended early, on day {sum(days) / len(days):.1f} on average: {reason}")
    waste: dict[str, float] = {}
    for r in runs:
        for k, v in r.waste.items():
            waste[k] = waste.get(k, 0.0) + v / r.t / len(runs)
    print("  waste by cause (share of wall clock): " + ", ".join(f"{k} {v:.4f}" for k, v in sorted(waste.items())))
    charged = sum(r.failures_charged for r in runs) / len(runs)
    ckpts = max(r.max_ckpts_on_disk for r in runs)
    healthy = max(r.healthy_excluded for r in runs)
    print(f"  failures charged per run {charged:.1f}")
    print(
        f"long run: {len(done)}/{len(runs)} completed, goodput {goodput:.3f} (optimum {best:.3f}, ratio "
        f"{goodput / best:.3f}), checkpoints on disk at most {ckpts}, healthy nodes excluded {healthy}"
    )


if __name__ == "__main__":
    main()
