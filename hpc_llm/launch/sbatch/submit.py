"""Submitting rendered batch scripts: one job per point, or one job array for points of one shape.

submitit does the submitting: it pickles the job's callable into
``<run dir>/.submitit`` (its API wants one; our script never runs it:
:mod:`hpc_llm.launch.handover`), calls ``sbatch`` and reads the job id back. Our
executor hands it the batch script rendered from ``sbatch_templates/`` instead of
its own. submitit's job arrays
(``SlurmExecutor._internal_process_submissions`` in 1.5.x) build a plain
executor with submitit's own script and one shared folder, so for arrays we do
what it does by hand: one pickle per point in the point's own folder, one
``sbatch`` of a dispatcher script (``sbatch_templates/array.sh.j2``: task i
runs point i's own batch script), then each pickle renamed after its task's
job id (``<array job>_<task>``), which is what ``_submit`` looks for.

Points whose ``#SBATCH`` flags are the same except for the output file are one
shape; a sweep over learning rates is one array, a node-count sweep is one job
per node count. If ``sbatch`` refuses a submission, :class:`Rejected` says which
point, why, and what this invocation had already submitted.
"""

from __future__ import annotations

import contextlib
import io
import shlex
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpc_llm.config.plan import parse_time_limit
from hpc_llm.launch.sbatch.render import SbatchSpec, render_array
from hpc_llm.rundir.layout import RunDir


@dataclass
class Point:
    """One job of a sweep, rendered and ready to submit."""

    num: int
    run_dir: str
    spec: SbatchSpec
    #: the script of this point alone (<run dir>/sbatch.sh)
    script: str
    #: the callable submitit pickles for this point (never run: hpc_llm.launch.handover)
    task: Callable[[], Any]
    #: set once submitted: the job id ("123"), or the array task ("123_4")
    job_id: str | None = None
    #: the array it went out in (its job id), if any
    array_id: str | None = None


class Rejected(Exception):
    """sbatch refused a submission: which point, Slurm's reason, what had been submitted."""

    def __init__(self, point: Point, reason: str, submitted: list[Point]) -> None:
        super().__init__(reason)
        self.point, self.reason, self.submitted = point, reason, submitted


def shape(spec: SbatchSpec) -> tuple[tuple[str, str], ...]:
    """What must be equal for points to share an array: every #SBATCH flag but the output file."""
    return tuple(sorted((k, repr(v)) for k, v in spec.flags.items() if k != "output"))


def groups(points: list[Point]) -> list[list[Point]]:
    """Points by shape, in the order the sweep gave them."""
    by_shape: dict[tuple[tuple[str, str], ...], list[Point]] = {}
    for p in points:
        by_shape.setdefault(shape(p.spec), []).append(p)
    return list(by_shape.values())


def _executor(folder: Path, python: str, script: str, export: str | None) -> Any:
    import submitit

    class TemplateExecutor(submitit.SlurmExecutor):
        # submitit builds its own sbatch text; ours was rendered from sbatch_templates/
        # (its command is the one submitit would run)
        def _make_submission_file_text(self, command: str, uid: str) -> str:
            return script

        # the list of variables the job gets, on sbatch's command line: it wins over
        # SBATCH_EXPORT (a site's NONE) and over the script's own #SBATCH --export
        def _make_submission_command(self, submission_file_path: Path) -> list[str]:
            return ["sbatch", *([f"--export={export}"] if export else []), str(submission_file_path)]

    return TemplateExecutor(folder=str(folder), python=python)


def _reason(exc: BaseException) -> str:
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    errors = [ln for ln in lines if "error" in ln.lower()]
    return (errors or lines or [type(exc).__name__])[-1].removeprefix("sbatch: error: ")


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """submitit prints sbatch's stderr itself when it fails; we report it in one line instead."""
    with contextlib.redirect_stderr(io.StringIO()):
        yield


def submit_one(point: Point, python: str, export: str | None) -> str:
    folder = RunDir(point.run_dir).submitit
    executor = _executor(folder, python, point.script, export)
    res = point.spec.flags
    minutes = max(1, parse_time_limit(str(res.get("time") or "60")) // 60)
    executor.update_parameters(nodes=res.get("nodes", 1), ntasks_per_node=res.get("ntasks_per_node", 1), time=minutes)
    with _quiet():
        job = executor.submit(point.task)
    return str(job.job_id)


def submit_array(points: list[Point], sweep_dir: str, parallelism: int, python: str, export: str | None) -> list[str]:
    """One array for ``points`` (one shape), at most ``parallelism`` tasks running at once."""
    from submitit.core import utils
    from submitit.slurm.slurm import SlurmJob

    first = points[0].spec
    folder = RunDir(sweep_dir).array_logs
    folder.mkdir(parents=True, exist_ok=True)
    flags = {
        **first.flags,
        "array": f"0-{len(points) - 1}%{max(1, parallelism)}",
        "output": str(folder / "slurm-%A_%a.out"),
    }
    script = render_array(flags, [p.run_dir for p in points])
    minutes = max(1, parse_time_limit(str(first.flags.get("time") or "60")) // 60)
    pickles = []
    for p in points:
        pickle = RunDir(p.run_dir).submitit / "array_submission.pkl"
        pickle.parent.mkdir(parents=True, exist_ok=True)
        delayed = utils.DelayedSubmission(p.task)
        delayed.set_timeout(minutes, 0)  # as submitit's own submit does; we requeue ourselves
        delayed.dump(pickle)
        pickles.append(pickle)
    executor = _executor(folder, python, script, export)
    with _quiet():
        array = executor._submit_command("array")  # the command is in the dispatcher; submitit needs a string
    ids = []
    for i, (p, pickle) in enumerate(zip(points, pickles, strict=True)):
        task: Any = SlurmJob(folder=str(RunDir(p.run_dir).submitit), job_id=f"{array.job_id}_{i}")
        task.paths.move_temporary_file(pickle, "submitted_pickle")
        ids.append(task.job_id)
    return ids


def submit_all(points: list[Point], *, sweep_dir: str, parallelism: int, python: str | None = None) -> list[Point]:
    """Submit every point: one array per shape of several points, single jobs for the rest."""
    python = python or shlex.quote(sys.executable)
    done: list[Point] = []
    for group in groups(points):
        export = group[0].spec.flags.get("export")
        try:
            if len(group) == 1:
                group[0].job_id = submit_one(group[0], python, export)
            else:
                for p, job_id in zip(group, submit_array(group, sweep_dir, parallelism, python, export), strict=True):
                    p.job_id, p.array_id = job_id, job_id.split("_")[0]
        except Exception as exc:  # sbatch's refusal (or submitit's), named in one line by the launcher
            raise Rejected(group[0], _reason(exc), done) from None
        done.extend(group)
    return done


def cancel(job_ids: list[str]) -> None:
    """``scancel`` the jobs (or arrays) this toolkit submitted: the inverse of :func:`submit_all`."""
    from hpc_llm.rundir import epoch
    from hpc_llm.slurm import commands, query

    # the person at the login node asked for it (`hpc-llm cancel`, a sweep refused mid-way): no
    # job's epoch is involved, and hpc_llm.slurm.commands refuses a change asked outside one
    with contextlib.suppress(commands.SlurmUnreachable), epoch.as_user(f"scancel {' '.join(job_ids)}"):
        query.cancel(job_ids)
