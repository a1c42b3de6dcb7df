"""The control plane against thousands of fault schedules: seeds run, violations found, seeds a minute.

Each seed is one run of the real supervisor, agents and takeover code against the simulated Slurm
and fabric (hpc_llm.sim; docs/design/simulation.md): a world and faults drawn from the seed, the
job run to its end, the checker's verdict. Seeds are shared out over ``--workers`` processes (one
a core by default); the figures printed are the whole run's:

    python benchmarks/simulate.py --seeds 10000
    10000 seeds, V violations, R seeds/min (seeds 0-9999, W workers, M simulated min a seed)

A seed with a violation prints its verdict and the command that replays it with its trace; the
exit status is 1 if any seed had one. A seed that runs over ``--seed-timeout-s`` of wall time (a
livelock of the simulation or of the code under it) counts as a violation too.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import signal
import sys
import time
from dataclasses import dataclass


@dataclass
class Verdict:
    seed: int
    violations: list[str]
    sim_s: float
    events: int


def _timeout(signum: int, frame: object) -> None:
    raise TimeoutError


def run_one(seed: int, limit_s: float) -> Verdict:
    """One seed's verdict, in this worker process (its own imports, its own temporary run dir)."""
    from hpc_llm.sim.run import run_seed

    signal.signal(signal.SIGALRM, _timeout)
    signal.alarm(max(1, int(limit_s)))
    try:
        out = run_seed(seed)
    except TimeoutError:
        return Verdict(seed, [f"ran over {limit_s:.0f} s of wall time (a livelock?)"], 0.0, 0)
    except Exception as exc:  # a crash of the simulator itself is a seed that found something
        return Verdict(seed, [f"the simulation crashed: {type(exc).__name__}: {exc}"], 0.0, 0)
    finally:
        signal.alarm(0)
    return Verdict(seed, list(out.violations), out.sim_s, out.events)


def _run(args: tuple[int, float]) -> Verdict:
    return run_one(*args)


def simulate(first: int, count: int, workers: int, limit_s: float, out=sys.stdout) -> list[Verdict]:
    seeds = [(s, limit_s) for s in range(first, first + count)]
    if workers <= 1:
        return [run_one(*s) for s in seeds]
    # fork: the workers share the parent's imports; each seed still builds its own world
    with multiprocessing.get_context("fork").Pool(workers, maxtasksperchild=500) as pool:
        verdicts = []
        for v in pool.imap_unordered(_run, seeds, chunksize=8):
            verdicts.append(v)
            if v.violations:
                print(f"seed {v.seed}: {v.violations[0]}", file=out, flush=True)
        return sorted(verdicts, key=lambda v: v.seed)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, default=1000, help="how many seeds (default 1000)")
    p.add_argument("--first", type=int, default=0, help="the first seed (default 0)")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    p.add_argument("--seed-timeout-s", type=float, default=60.0, help="wall time one seed may take")
    a = p.parse_args(argv)
    started = time.monotonic()
    verdicts = simulate(a.first, a.seeds, a.workers, a.seed_timeout_s)
    took = time.monotonic() - started
    bad = [v for v in verdicts if v.violations]
    for v in bad:
        print(f"\nseed {v.seed}:")
        for line in v.violations:
            print(f"  {line}")
        print(f"  replay: python -m hpc_llm.sim --seed {v.seed}")
    ran = [v for v in verdicts if v.events]
    sim_min = sum(v.sim_s for v in ran) / len(ran) / 60 if ran else 0.0
    print(
        f"{a.seeds} seeds, {len(bad)} violations, {a.seeds / took * 60:.0f} seeds/min "
        f"(seeds {a.first}-{a.first + a.seeds - 1}, {a.workers} workers, {sim_min:.1f} simulated min a seed)"
    )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
