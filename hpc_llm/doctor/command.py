"""``hpc-llm doctor``'s arguments and what the command does with them: compose the job, gather
the facts, print the rows, write a profile with ``--write-profile``. The CLI builds its parser
for every command, so the rest of the package is imported only when doctor runs."""

from __future__ import annotations

import argparse
import getpass
import os
import sys
from typing import Any

from hpc_llm.errors import ConfigError
from hpc_llm.slurm import parse, query


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """``hpc-llm doctor``'s arguments (``sub``: the CLI's subparsers)."""
    p = sub.add_parser(
        "doctor",
        help="what hpc_llm needs from this Slurm cluster, and whether it has it (a table; exit 1 if not)",
    )
    p.add_argument(
        "overrides",
        nargs="*",
        help="Hydra overrides of the job to check (+experiment=mpt_tiny resources.nodes=2); partition=NAME",
    )
    p.add_argument("--run", metavar="RUN_DIR", help="a run dir whose measured checkpoint saves to compare with")
    p.add_argument("--image", metavar="PATH", help="a container image the nodes must see (and Apptainer)")
    p.add_argument("--json", action="store_true", help="the rows as JSON")
    p.add_argument("--no-probe", action="store_true", help="no probe job: skip the checks made from a node")
    p.add_argument("--probe-wait", type=int, default=120, metavar="S", help="seconds the probe job may wait to start")
    p.add_argument(
        "--write-profile",
        metavar="NAME",
        help="write a cluster profile (cluster=NAME) from what was found, to DIR/cluster/NAME.yaml",
    )
    p.add_argument("--dir", help="with --write-profile: the site config directory (default: the user's)")
    p.add_argument("--force", action="store_true", help="with --write-profile: replace an existing profile")
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    """``hpc-llm doctor``: the table (or JSON); 1 when a must-have is missing."""
    from hpc_llm.doctor import profile
    from hpc_llm.doctor.checks import evaluate, exit_code
    from hpc_llm.doctor.checks_node import enroot_found, gpu_model
    from hpc_llm.doctor.facts import partition_name
    from hpc_llm.doctor.gather import compose_job, gather, needs_of
    from hpc_llm.doctor.table import as_json, render

    if args.write_profile:
        target = profile.target(args.write_profile, args.dir)
        if target.exists() and not args.force:
            raise ConfigError(f"profile {target} exists already; pass --force to replace it")
    run_arg = os.path.abspath(args.run) if args.run else None
    if run_arg is not None and not os.path.isdir(run_arg):
        raise ConfigError(f"--run {args.run}: no such run dir")
    overrides = list(args.overrides)
    with_container = any(o.startswith("container=") and o != "container=none" for o in overrides)
    if args.image and with_container and not any(o.startswith("container.image=") for o in overrides):
        overrides.append(f"container.image={os.path.abspath(args.image)}")  # the image to check is the job's
    job = compose_job(overrides)
    needs = needs_of(job, run=run_arg, image=args.image)
    facts = gather(job, needs, probe=not args.no_probe, probe_wait_s=args.probe_wait)
    rows = evaluate(facts, needs)
    part = partition_name(facts, needs)
    if args.json:
        sys.stdout.write(as_json(rows) + "\n")
    else:
        title = (
            f"hpc-llm doctor: cluster {facts.config.get('ClusterName', '?')} "
            f"(Slurm {facts.config.get(parse.VERSION_KEY, '?')}), partition {part or '?'}"
        )
        sys.stdout.write(render(rows, title))
    if args.write_profile:
        if part is None:
            raise ConfigError("no partition to write a profile for; name one with partition=NAME")
        text = profile.build(
            args.write_profile,
            config=facts.config,
            partition=part,
            partition_info=facts.partition_info.get(part, {}),
            nodes=facts.nodes,
            assoc=query.associations(getpass.getuser()),
            gpu_model=gpu_model(facts.probe),
            pyxis=facts.pyxis,
            enroot=enroot_found(facts.probe),
            image=needs.image if needs.container == "pyxis" else None,
        )
        written = profile.write(args.write_profile, text, args.dir, force=args.force)
        print(f"wrote {written}; use it with cluster={args.write_profile}", file=sys.stderr)
    return exit_code(rows)
