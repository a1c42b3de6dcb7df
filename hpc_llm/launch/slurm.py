"""``hydra/launcher=slurm``: each job of a sweep as one sbatch job, through submitit.

A general Hydra launcher (any task function runs under it, as with
hydra-submitit-launcher), with per-job resources: each job reads its own
``resources.*`` from its composed config, so ``-m resources.nodes=1,2,4,8``
submits four jobs of 1, 2, 4 and 8 nodes (Hydra cannot sweep
``hydra.launcher.*``). The batch script is rendered from
``sbatch_templates/`` (hpc_llm.launch.sbatch.render) instead of submitit's built-in
one; submitit still pickles the callable, runs it in every srun task
(``python -m submitit.core._submit``) and collects per-task results.

Bad input (no Slurm, unknown partition, more nodes or CPUs than the partition
has, an object store that refuses the job's credentials or lacks its bucket) is
reported by ``check_job``, which the hpc_llm sweeper calls on every job before
anything is created or submitted.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.core.utils import JobReturn, JobStatus
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from hpc_llm.config import stores
from hpc_llm.errors import ConfigError, warn_once
from hpc_llm.launch.base import BaseLauncher, JobFailed, LazyJobReturn, copy_config, hydra_node_copy, shown
from hpc_llm.launch.handover import RankEntry
from hpc_llm.launch.hydra_files import HydraFiles
from hpc_llm.launch.sbatch import checks, submit
from hpc_llm.launch.sbatch.render import render
from hpc_llm.launch.sbatch.spec import build_spec, job_resources, python_command
from hpc_llm.launch.sweeper import job_run_dir
from hpc_llm.results import console, ledger
from hpc_llm.results.failure import final_failure
from hpc_llm.rundir import provenance, snapshot
from hpc_llm.rundir.layout import PRIVATE, RunDir
from hpc_llm.rundir.payload import read_return, shared_part, write_payload
from hpc_llm.slurm import accounting, parse, query
from hpc_llm.slurm.commands import SlurmUnreachable

log = logging.getLogger(__name__)


class SlurmLauncher(BaseLauncher):
    kind = "slurm"

    def __init__(self, **options: Any) -> None:
        super().__init__()
        self.opts = OmegaConf.create(options)
        self._partitions: dict[str, parse.Partition] | None = None
        self._unreachable: str | None = None  # why Slurm did not answer, once it did not
        self._verdicts = checks.SchedulerVerdicts()
        self._stores = stores.StoreVerdicts()
        self._shared: bytes | None = None  # the pickled part of the payload all jobs share
        #: each job's config without the hydra node, by id of the job config (kept alive with it)
        self._task_cfgs: dict[int, tuple[DictConfig, DictConfig]] = {}
        self._hydra_cfgs: dict[int, tuple[DictConfig, Any]] = {}
        self._hydra_files = HydraFiles()

    # -- checks, before anything is created (called by the sweeper) ----------
    def partitions(self) -> dict[str, parse.Partition]:
        if self._partitions is None:
            if self._unreachable is not None:
                # asked once a sweep: a controller that does not answer costs each sinfo its
                # MessageTimeout, and a dry run goes on to check every point without it
                raise SlurmUnreachable(self._unreachable)
            try:
                self._partitions = query.partitions()
            except SlurmUnreachable as exc:
                self._unreachable = str(exc)
                raise
        return self._partitions

    def check_job(self, cfg: DictConfig) -> None:
        res = job_resources(cfg, self.opts)  # raises on an unparsable time limit
        container = OmegaConf.select(cfg, "container.name", default="none")
        if self.opts.snapshot and container != "none":
            raise ConfigError(
                f"hydra.launcher.snapshot=true copies the code for the host's Python, but container={container} "
                "runs the image's copy; allowed: snapshot with container=none, or a new image per code change"
            )
        try:
            self._check_partition(cfg, res)
            if self.opts.test_only:
                self._verdicts.check(build_spec(cfg, self.opts, job_run_dir(cfg)), cfg.hydra.job.num)
        except SlurmUnreachable as exc:
            if not self.opts.dry_run:
                raise
            # a dry run checks all a submit would, where Slurm answers; without one it still
            # writes the scripts (rendering for another cluster is a use of it), and says so
            warn_once(f"{exc}; dry run: the partition and sbatch --test-only were not checked")
        self._check_stores(cfg, container)

    def _check_stores(self, cfg: DictConfig, container: str) -> None:
        """The job's object stores, asked from its own Python (boto3 is the job's, not ours)."""
        self._stores.check_sweep(cfg, job_run_dir(cfg))
        if not stores.targets(cfg, job_run_dir(cfg)):
            return
        if container != "none":
            # the image's Python answers at job start (and in hpc-llm doctor) instead
            warn_once(f"container={container}: the object stores are checked when the job starts, not before")
            return
        try:
            self._stores.check(cfg, job_run_dir(cfg), python_command(self.opts, cfg))
        except ConfigError as exc:
            if not self.opts.dry_run:
                raise
            # a dry run writes the scripts all the same (one for another site's store is a use of it)
            warn_once(f"{str(exc).removesuffix('; nothing was submitted')}; dry run: a submit would stop here")

    def _check_partition(self, cfg: DictConfig, res: Any) -> None:
        cluster = OmegaConf.select(cfg, str(self.opts.cluster_key), default=None) or {}
        checks.placement(
            self.partitions(), self.opts.partition or cluster.get("partition"), res, self.opts.resources_key
        )
        checks.spare_nodes(res, self.opts.resources_key)

    # -- Hydra Launcher API ------------------------------------------------
    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        sweep_dir = str(self.begin_sweep())
        points: list[tuple[DictConfig, list[str], submit.Point]] = []
        code_dir = str(snapshot.take(RunDir(sweep_dir).code_snapshot)) if self.opts.snapshot else None
        for offset, overrides in enumerate(job_overrides):
            idx = initial_job_idx + offset
            cfg = self.job_config(overrides, idx)
            run_dir = self._prepare_run_dir(cfg, last=offset == len(job_overrides) - 1)
            provenance.write(run_dir, *self.provenance)
            spec = build_spec(cfg, self.opts, run_dir, code_dir=code_dir)
            script = render(spec)
            RunDir(run_dir).sbatch_script.write_text(script)
            # submitit's API wants a callable; our script never runs it (hpc_llm.launch.handover)
            task = RankEntry(str(RunDir(run_dir).payload))
            points.append((cfg, list(overrides), submit.Point(idx, run_dir, spec, script, task)))
        if self.opts.dry_run:
            for cfg, overrides, p in points:
                print(
                    f"job {p.num}: dry run, batch script {RunDir(p.run_dir).sbatch_script}  [{shown(overrides)}]",
                    flush=True,
                )
                ledger.record(p.run_dir, sweep_dir, p.num, self.experiment(cfg), "slurm", overrides, [], "DRY_RUN")
            return [self._job_return(cfg, p.run_dir, {"run_dir": p.run_dir, "job_id": None}) for cfg, _o, p in points]
        try:
            submit.submit_all(
                [p for _c, _o, p in points],
                sweep_dir=sweep_dir,
                parallelism=int(self.opts.array_parallelism),
                python=self.opts.python,
            )
        except submit.Rejected as rejected:
            self._after_rejection(rejected, points, sweep_dir)
        submitted: list[tuple[DictConfig, str, str, ledger.Run | None]] = []
        announced: set[str] = set()
        with ledger.connect() as conn:  # one transaction for the whole sweep
            for cfg, overrides, p in points:
                if p.array_id and p.array_id not in announced:
                    announced.add(p.array_id)
                    tasks = sum(1 for _c, _o, q in points if q.array_id == p.array_id)
                    print(
                        f"Slurm job array {p.array_id}: {tasks} points of one shape, at most "
                        f"{self.opts.array_parallelism} running at once",
                        flush=True,
                    )
                run = self._record_submitted(cfg, overrides, p, sweep_dir, conn=conn)
                print(
                    f"job {p.num}: submitted Slurm job {p.job_id}, run dir {p.run_dir}  [{shown(overrides)}]",
                    flush=True,
                )
                submitted.append((cfg, p.run_dir, str(p.job_id), run))
        if not self.opts.wait:
            return [self._job_return(cfg, d, {"run_dir": d, "job_id": j}) for cfg, d, j, _ in submitted]
        return self._wait_all(submitted)

    def _record_submitted(
        self, cfg: DictConfig, overrides: list[str], p: submit.Point, sweep_dir: str, conn: Any = None
    ) -> ledger.Run:
        return ledger.record(
            p.run_dir,
            sweep_dir,
            p.num,
            self.experiment(cfg),
            "slurm",
            overrides,
            [str(p.job_id)],
            "SUBMITTED",
            conn=conn,
        )

    def _after_rejection(
        self, rejected: submit.Rejected, points: list[tuple[DictConfig, list[str], submit.Point]], sweep_dir: str
    ) -> None:
        """sbatch refused a point mid-sweep: cancel (or keep) what this invocation submitted,
        remove the run dirs of what is not running, and say so in one line."""
        done = {p.num for p in rejected.submitted}
        refs = sorted({p.array_id or str(p.job_id) for p in rejected.submitted})
        if self.opts.keep_on_reject and refs:
            for cfg, overrides, p in points:
                if p.num in done:
                    self._record_submitted(cfg, overrides, p, sweep_dir)
            what = f"kept the {len(done)} point(s) already submitted (Slurm job(s) {', '.join(refs)})"
        else:
            if refs:
                submit.cancel(refs)
            done = set()
            what = f"cancelled the {len(refs)} job(s) it had submitted" if refs else "nothing had been submitted"
        for _cfg, _o, p in points:
            if p.num not in done:
                shutil.rmtree(p.run_dir, ignore_errors=True)
        leftovers = {x.name for x in Path(sweep_dir).iterdir()} if Path(sweep_dir).is_dir() else set()
        if leftovers <= {"multirun.yaml", PRIVATE}:
            shutil.rmtree(sweep_dir, ignore_errors=True)
        point = next(o for _c, o, p in points if p.num == rejected.point.num)
        raise ConfigError(f"Slurm refused job {rejected.point.num} [{shown(point)}]: {rejected.reason}; {what}")

    # -- helpers -------------------------------------------------------------
    def _prepare_run_dir(self, cfg: DictConfig, last: bool = True) -> str:
        """What Hydra's run_job does on the way in: output dir, .hydra/ configs."""
        run_dir = job_run_dir(cfg)
        with read_write(cfg.hydra.runtime), open_dict(cfg.hydra.runtime):
            cfg.hydra.runtime.output_dir = run_dir
        if self._shared is None or last:
            # Hydra's run_job sets HydraConfig to each job in turn: the payload's singleton state
            # (pickled once, with the first job) and the state this process is left in are
            # those of the same jobs as there; the other jobs only get the read-only flag it sets
            HydraConfig.instance().set_config(cfg)
            # set_config made a copy of the hydra node: the job's JobReturn gets that one
            self._hydra_cfgs[id(cfg)] = (cfg, HydraConfig.instance().cfg)
        else:
            # its copy of the hydra node (a deep copy, ~30 ms) is made if the JobReturn's is read;
            # till the next job, ${hydra:...} (in what is rendered for this one) resolves against
            # this job's own hydra node, as against set_config's copy of it
            OmegaConf.set_readonly(cfg.hydra, True)
            HydraConfig.instance().cfg = cfg  # type: ignore[assignment]
        RunDir(run_dir).logs.mkdir(parents=True, exist_ok=True)
        if cfg.hydra.output_subdir is not None:
            # what Hydra's run_job saves (the config without its hydra node, the hydra node,
            # the overrides), from one conversion of the config instead of a copy per file
            content = OmegaConf.to_container(cfg, resolve=False, enum_to_str=True)
            assert isinstance(content, dict)
            self._hydra_files.write(content, Path(run_dir) / str(cfg.hydra.output_subdir))
        # the ranks run Hydra's run_job (job logging, env_set, callbacks), as in any Hydra launcher
        if self._shared is None:  # once per sweep
            self._shared = shared_part(self.task_function, self.hydra_context)
        write_payload(run_dir, cfg, self._shared)
        return run_dir

    def _task_cfg(self, cfg: DictConfig) -> DictConfig:
        """The job's config without its hydra node, as Hydra's run_job makes it, once per job."""
        key = id(cfg)
        if key not in self._task_cfgs:
            task_cfg = copy_config(cfg)
            with read_write(task_cfg), open_dict(task_cfg):
                del task_cfg["hydra"]
            self._task_cfgs[key] = (cfg, task_cfg)
        return self._task_cfgs[key][1]

    def _job_return(
        self, cfg: DictConfig, run_dir: str, value: Any, status: JobStatus = JobStatus.COMPLETED
    ) -> JobReturn:
        """A JobReturn as Hydra's run_job fills it, for a job whose own one we do not have
        (submitted without waiting, or ended without a result)."""
        # the config is copied when first read (~10 ms a job; a no-wait sweep of 100 points
        # returns 100 JobReturns that Hydra itself never reads)
        ret = LazyJobReturn(lambda: self._task_cfg(cfg))
        made = self._hydra_cfgs.get(id(cfg))
        if made is not None:
            ret.hydra_cfg = made[1]
        else:
            ret.make_hydra_cfg = lambda: hydra_node_copy(cfg)
        ret.overrides = list(cfg.hydra.overrides.task)
        ret.working_dir = run_dir if cfg.hydra.job.chdir else os.getcwd()
        ret.task_name = str(cfg.hydra.job.name)
        ret.status = status
        ret.return_value = value
        return ret

    def _wait_all(self, submitted: list[tuple[DictConfig, str, str, ledger.Run | None]]) -> list[JobReturn]:
        """Every job of the sweep until it leaves the queue (one live line each), then their
        results. A failed squeue is "unknown", never "finished": we keep waiting."""
        ids = [job_id for _cfg, _d, job_id, _run in submitted]
        states: dict[str, str] = {}

        def rows() -> list[tuple[str, Path, str | None]]:
            return [
                (f"job {cfg.hydra.job.num} (Slurm {jid})", Path(d), states.get(jid))
                for (cfg, d, _j, _r), jid in zip(submitted, ids, strict=True)
            ]

        runs = {jid: run for (_c, _d, _j, run), jid in zip(submitted, ids, strict=True)}
        watching = contextlib.nullcontext() if console.verbose() else console.live_progress(rows)
        with watching:
            pending = set(ids)
            while pending:
                now = query.job_states(sorted(pending))
                if now is not None:
                    for jid in sorted(pending):
                        if jid not in now:
                            pending.discard(jid)
                            continue
                        states[jid] = now[jid]
                        run = runs[jid]
                        if run is not None and run.state != now[jid]:
                            runs[jid] = ledger.update(run, state=now[jid])
                if pending:
                    time.sleep(float(self.opts.poll_s))
        returns = [
            self._finished(cfg, d, job, runs[jid]) for (cfg, d, job, _r), jid in zip(submitted, ids, strict=True)
        ]
        for (cfg, d, _j, _r), jid in zip(submitted, ids, strict=True):
            self.print_summary(d, title=f"job {cfg.hydra.job.num} (Slurm job {jid})")
        return returns

    def _finished(self, cfg: DictConfig, run_dir: str, job_id: str, run: ledger.Run | None) -> JobReturn:
        found, value = read_return(run_dir)
        if found:
            if run is not None:
                ledger.update(run, state="COMPLETED")
            # rank 0 ran Hydra's run_job: its JobReturn is the job's own
            return value if isinstance(value, JobReturn) else self._job_return(cfg, run_dir, value)
        final = accounting.final_states([job_id]).get(job_id, "FAILED")
        what = final_failure(run_dir)  # the run's last word, not its first attempt's
        if run is not None:
            error = f"{what.error}{what.where()}" if what else None
            ledger.update(run, state=final if final != "COMPLETED" else "FAILED", error=error)
        if what is not None:
            # the last line a user sees: what ended the run (its last attempt), the node, then the log
            log_at = RunDir(run_dir).rank_log(what.rank) if what.rank is not None else RunDir(run_dir).logs
            err = JobFailed(
                f"job {cfg.hydra.job.num} (Slurm job {job_id}) failed: {what.error[:500]}{what.where()}; log: {log_at}"
            )
        else:
            err = JobFailed(
                f"job {cfg.hydra.job.num} (Slurm job {job_id}) ended without a result; logs: {RunDir(run_dir).logs}"
            )
        return self._job_return(cfg, run_dir, err, JobStatus.FAILED)
