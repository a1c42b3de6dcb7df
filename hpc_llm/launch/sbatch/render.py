"""A job's resources -> the exact sbatch script, from ``sbatch_templates/``.

Deterministic: flags sorted, every value shell-quoted, no timestamps or
versions in the text, so ``hpc-llm render`` output can be diffed and kept as a
golden file. The same function renders what the Slurm launcher submits.
"""

from __future__ import annotations

import functools
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import jinja2

from hpc_llm.config.ports import PORT_BASE, PORT_SPAN
from hpc_llm.errors import ConfigError
from hpc_llm.paths import templates_dir
from hpc_llm.rundir.layout import RunDir

ENV_NAME_OK = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_")


@dataclass(frozen=True)
class SbatchSpec:
    """Everything a batch script says, before it is text."""

    run_dir: str
    cluster: str
    template: str
    flags: Mapping[str, Any]
    srun_args: Sequence[str]
    command: Sequence[str]
    env: Mapping[str, str] = field(default_factory=dict)
    passthrough: Sequence[str] = ()
    setup: Sequence[str] = ()
    #: lines from the container runtime (staging, per-node check), already shell
    container_lines: Sequence[str] = ()
    #: the command the batch script runs to run srun (hpc_llm.job.supervisor)
    supervisor: Sequence[str] = ()
    #: the stop signal Slurm sends the batch shell (B:), which it passes on to the supervisor
    stop_signal: str | None = None
    #: put first on PYTHONPATH: the code copied at submit time (hydra.launcher.snapshot)
    code_dir: str | None = None


def sbatch_flag(key: str, value: Any) -> str:
    key = key.replace("_", "-")
    if value is True:
        return f"--{key}"
    return f"--{key}={shlex.quote(str(value))}"


def _check_env_name(name: str) -> str:
    if not name or not set(name) <= ENV_NAME_OK or name[0].isdigit():
        raise ConfigError(f"environment variable name {name!r} is not valid in a shell script")
    return name


@functools.lru_cache(maxsize=16)  # a sweep renders one template per point: parse it once
def _template(name: str) -> jinja2.Template:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir())),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
    )
    env.filters["q"] = lambda v: shlex.quote(str(v))
    try:
        return env.get_template(name)
    except jinja2.TemplateNotFound:
        names = sorted(p.name for p in templates_dir().glob("*.j2"))
        raise ConfigError(f"sbatch template {name!r} not found; allowed: {', '.join(names)}") from None


def _flags(flags: Mapping[str, Any]) -> list[str]:
    return [sbatch_flag(k, v) for k, v in sorted(flags.items()) if v is not None and v is not False]


ARRAY_TEMPLATE = "array.sh.j2"
#: times the batch script starts a supervisor that died of a signal again, in one allocation
SUPERVISOR_RESTARTS = 3


def render_array(flags: Mapping[str, Any], run_dirs: Sequence[str]) -> str:
    """The batch script of a job array whose task i runs ``run_dirs[i]/sbatch.sh``."""
    return _template(ARRAY_TEMPLATE).render(
        template=ARRAY_TEMPLATE, sbatch_flags=_flags(flags), run_dirs=[shlex.quote(d) for d in run_dirs]
    )


def render(spec: SbatchSpec) -> str:
    template = _template(spec.template)
    flags = _flags(spec.flags)
    return template.render(
        template=spec.template,
        cluster=spec.cluster,
        run_dir=spec.run_dir,
        logs_dir=shlex.quote(str(RunDir(spec.run_dir).logs)),
        sbatch_flags=flags,
        setup=list(spec.setup),
        container_lines=list(spec.container_lines),
        env=[(_check_env_name(k), shlex.quote(str(v))) for k, v in sorted(spec.env.items())],
        passthrough=[_check_env_name(n) for n in sorted(spec.passthrough)],
        srun_args=[shlex.quote(a) for a in spec.srun_args],
        command=[shlex.quote(a) for a in spec.command],
        supervisor=[shlex.quote(a) for a in spec.supervisor],
        stop_signal=spec.stop_signal,
        supervisor_restarts=SUPERVISOR_RESTARTS,
        code_dir=shlex.quote(spec.code_dir) if spec.code_dir else None,
        port_base=PORT_BASE,
        port_span=PORT_SPAN,
    )
