"""``hpc-llm``: the login-node commands around a run.

    hpc-llm plugins                 every registered plugin, per kind, with its package
    hpc-llm config [overrides]      the LLM Foundry train config a run would get (YAML)

Training itself is ``python -m hpc_llm [overrides]``. Nothing here imports
torch, composer or llmfoundry.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from omegaconf import DictConfig


def compose(overrides: Sequence[str]) -> DictConfig:
    """The job config ``python -m hpc_llm <overrides>`` would compose (one point, no sweep)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from hpc_llm.config.store import register_configs
    from hpc_llm.paths import conf_dir

    register_configs()
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        return hydra_compose(config_name="config", overrides=list(overrides), return_hydra_config=True)


def cmd_plugins(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from hpc_llm.plugins.base import KINDS
    from hpc_llm.plugins.manager import get_plugins

    plugins = get_plugins(args.block or ())
    collisions = plugins.collisions()
    table = Table(title="hpc_llm plugins", show_lines=False)
    for col in ("kind", "name", "package", "plugin", "description"):
        table.add_column(col)
    for entry in plugins.entries():
        name = entry.name
        if (entry.kind, entry.name) in collisions:
            name = f"{name} [bold red](COLLISION)[/]"
        table.add_row(KINDS[entry.kind].kind, name, entry.package, entry.plugin, entry.component.description)
    console = Console(width=max(120, Console().width))
    console.print(table)
    for (kind, name), entries in sorted(collisions.items()):
        who = ", ".join(f"{e.package} [{e.plugin}]" for e in entries)
        console.print(f"[red]collision:[/] {KINDS[kind].kind} '{name}' is registered by {who}")
    for blocked in plugins.blocked:
        console.print(f"blocked: {blocked}")
    return 1 if collisions else 0


def cmd_config(args: argparse.Namespace) -> int:
    import yaml

    from hpc_llm.config.validate import resolve_job
    from hpc_llm.trainconfig import build_train_config

    cfg = compose(args.overrides)
    job = resolve_job(cfg, run_dir="<run dir>")
    train = build_train_config(cfg, job, run_name=f"{job.plan.experiment}-<run>")
    sys.stdout.write(yaml.safe_dump(train, sort_keys=False))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hpc-llm", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("plugins", help="list registered plugins per kind, with their packages")
    p.add_argument("--block", action="append", help="block a plugin by entry-point or package name")
    p.set_defaults(func=cmd_plugins)
    p = sub.add_parser("config", help="print the resolved LLM Foundry train config")
    p.add_argument("overrides", nargs="*", help="Hydra overrides, as for python -m hpc_llm")
    p.set_defaults(func=cmd_config)
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    from hpc_llm.errors_cli import one_line_errors

    args = build_parser().parse_args(argv)
    with one_line_errors():
        code = args.func(args)
    raise SystemExit(code)
