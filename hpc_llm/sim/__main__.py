"""``python -m hpc_llm.sim --seed N``: replay one seed, print its scenario, trace and verdict."""

from __future__ import annotations

import argparse
import sys

from hpc_llm.sim.run import run_seed


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m hpc_llm.sim", description=__doc__)
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--quiet", action="store_true", help="the verdict only, no trace")
    a = p.parse_args(argv)
    out = run_seed(a.seed)
    print(out.scenario.describe())
    if not a.quiet:
        print(out.trace.render())
    print(f"-- {out.events} events, {out.sim_s:.1f} simulated s; results.json: {(out.results or {}).get('status')}")
    for v in out.violations:
        print(f"VIOLATION {v}")
    return 1 if out.violations else 0


if __name__ == "__main__":
    sys.exit(main())
