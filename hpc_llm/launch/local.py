"""``hydra/launcher=local``: each job's ranks as processes on this machine.

The ranks run the same in-job entry point as Slurm tasks
(:mod:`hpc_llm.job.rank.entry`), with the SLURM_* variables a one-node
``srun`` would give them and MASTER_ADDR/PORT resolved here, so the in-job
code cannot tell the difference. Jobs of a sweep run one after another.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from hydra.core.utils import JobReturn, configure_log, run_job
from omegaconf import DictConfig, OmegaConf

from hpc_llm.errors import ConfigError
from hpc_llm.launch.base import BaseLauncher, JobFailed, resource_key, shown
from hpc_llm.launch.job_python import job_python
from hpc_llm.results import console, ledger
from hpc_llm.results.failure import first_failure
from hpc_llm.rundir import provenance
from hpc_llm.rundir.layout import RunDir, job_scratch
from hpc_llm.rundir.payload import read_return, shared_part, write_payload

log = logging.getLogger(__name__)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def slurm_like_env(base: dict[str, str], rank: int, ntasks: int, port: int, threads: int) -> dict[str, str]:
    """The environment ``srun`` would give task ``rank`` of a one-node step."""
    env = {k: v for k, v in base.items() if not k.startswith("SLURM_")}
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK"):
        env.pop(key, None)
    env.update(
        SLURM_PROCID=str(rank),
        SLURM_LOCALID=str(rank),
        SLURM_NODEID="0",
        SLURM_NTASKS=str(ntasks),
        SLURM_STEP_NUM_TASKS=str(ntasks),
        SLURM_STEP_TASKS_PER_NODE=str(ntasks),
        SLURM_TASKS_PER_NODE=str(ntasks),
        SLURM_NNODES="1",
        SLURM_JOB_NUM_NODES="1",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        HPC_LLM_LAUNCHER="local",
        PYTHONUNBUFFERED="1",
    )
    env.setdefault("OMP_NUM_THREADS", str(threads))
    return env


def scratch_dir(cfg: DictConfig, run_dir: Path) -> Path:
    """The node-local working dir the ranks of a local run make (no Slurm job id: named by the
    run dir, hpc_llm.rundir.layout.job_scratch)."""
    return job_scratch(OmegaConf.select(cfg, "cluster.scratch", default=None), None, run_dir)


def rank_command(cfg: DictConfig, run_dir: Path, payload: Path) -> list[str]:
    """The job's python (hydra.launcher.python, trainer.python, else this interpreter), or the
    image's Python under the container runtime."""
    entry = ["-m", "hpc_llm.job.rank.entry", str(payload)]
    container = OmegaConf.select(cfg, "container", default=None)
    if container is None or container.name == "none":
        return [*job_python(cfg), *entry]
    from hpc_llm.config.validate import components

    job = components(cfg, str(run_dir))
    return job.container.wrap(container, job.mounts(cfg), [str(container.python), *entry])


class LocalLauncher(BaseLauncher):
    kind = "local"

    def __init__(
        self,
        resources_key: str = "resources",
        timeout_s: int = 0,
        stream: bool | None = None,
        nodes_key: str | None = None,
        tasks_key: str | None = None,
        python: str | None = None,
    ) -> None:
        super().__init__()
        self.python = python
        self.nodes_key = resource_key(resources_key, nodes_key, "nodes_key", "nodes")
        self.tasks_key = resource_key(resources_key, tasks_key, "tasks_key", "tasks_per_node")
        self.timeout_s = timeout_s
        self.stream = console.verbose() if stream is None else stream

    # -- called by the sweeper on every job before anything is created -----
    def check_job(self, cfg: DictConfig) -> None:
        nodes = OmegaConf.select(cfg, self.nodes_key, default=1)
        if nodes != 1:
            raise ConfigError(
                f"{self.nodes_key}={nodes}: hydra/launcher=local runs one node; "
                "use hydra/launcher=slurm for more (try it with `hpc-llm dev-cluster up`)"
            )

    def ranks(self, cfg: DictConfig) -> int:
        return int(OmegaConf.select(cfg, self.tasks_key, default=1) or 1)

    # -- Hydra Launcher API ------------------------------------------------
    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        self.begin_sweep()
        assert self.config is not None and self.hydra_context is not None
        returns: list[JobReturn] = []
        for offset, overrides in enumerate(job_overrides):
            idx = initial_job_idx + offset
            sweep_config = self.job_config(overrides, idx)
            log.info("job %d: %s", idx, shown(overrides))

            def run_ranks(_cfg: DictConfig, sc: DictConfig = sweep_config) -> Any:
                return self._run_ranks(sc)

            returns.append(
                run_job(
                    hydra_context=self.hydra_context,
                    task_function=run_ranks,
                    config=sweep_config,
                    job_dir_key="hydra.sweep.dir",
                    job_subdir_key="hydra.sweep.subdir",
                )
            )
            # as Hydra's basic launcher: the launcher's own log lines leave the job's log file
            configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        return returns

    # -- the ranks of one job -------------------------------------------------
    def _run_ranks(self, sweep_config: DictConfig) -> Any:
        run_dir = Path(str(sweep_config.hydra.runtime.output_dir))
        run = ledger.record(
            str(run_dir),
            str(sweep_config.hydra.sweep.dir),
            int(sweep_config.hydra.job.num),
            self.experiment(sweep_config),
            "local",
            list(sweep_config.hydra.overrides.task),
            [],
            "RUNNING",
        )
        try:
            value = self._spawn_ranks(sweep_config, run_dir)
        except BaseException as exc:
            ledger.update(run, state="FAILED", error=str(exc))
            raise
        ledger.update(run, state="COMPLETED")
        return value

    def _spawn_ranks(self, sweep_config: DictConfig, run_dir: Path) -> Any:
        ranks = self.ranks(sweep_config)
        provenance.write(run_dir, *self.provenance)
        payload = write_payload(run_dir, sweep_config, shared_part(self.task_function))
        rd = RunDir(run_dir)
        rd.logs.mkdir(exist_ok=True)
        port = free_port()
        threads = max(1, (os.cpu_count() or 1) // ranks)
        command = rank_command(sweep_config, run_dir, payload)
        procs: list[subprocess.Popen[bytes]] = []
        files: list[IO[bytes]] = []
        pumps: list[threading.Thread] = []
        try:
            for rank in range(ranks):
                out = open(rd.rank_log(rank), "wb")  # noqa: SIM115 - closed in finally, after the ranks
                files.append(out)
                stream = self.stream and rank == 0
                proc = subprocess.Popen(
                    command,
                    env=slurm_like_env(dict(os.environ), rank, ranks, port, threads),
                    stdout=subprocess.PIPE if stream else out,
                    stderr=subprocess.STDOUT,
                )
                procs.append(proc)
                if stream:
                    pumps.append(_tee(proc.stdout, out))
            if self.stream:
                failed = self._wait(procs)
            else:
                label = f"job {sweep_config.hydra.job.num}"
                with console.live_progress(lambda: [(label, run_dir, None)]):
                    failed = self._wait(procs)
        except BaseException:
            _stop(procs)
            raise
        finally:
            for t in pumps:
                t.join(timeout=10)
            for f in files:
                f.close()
            # the ranks' node-local working dir: nothing in it outlives the run (on Slurm the
            # job's node agent removes it)
            shutil.rmtree(scratch_dir(sweep_config, run_dir), ignore_errors=True)
        num = sweep_config.hydra.job.num
        results = self.print_summary(run_dir, title=f"job {num}")
        if failed is not None:
            rank, code = failed
            what = first_failure(run_dir, rank, socket.gethostname())
            cause = f"{what.error[:500]}{what.where()}" if what else f"rank {rank} exited with {code}"
            log_rank = what.rank if what is not None and what.rank is not None else rank
            # the last line a user sees: what failed, where, and the log that has the rest
            raise JobFailed(f"job {num} failed: {cause}; log: {rd.rank_log(log_rank)}")
        print(f"job {num}: completed; {rd.results if results is not None else run_dir}", flush=True)
        return read_return(run_dir)[1]

    def _wait(self, procs: list[subprocess.Popen[bytes]]) -> tuple[int, int] | None:
        deadline = time.monotonic() + self.timeout_s if self.timeout_s else None
        while True:
            codes = [p.poll() for p in procs]
            bad = [(r, c) for r, c in enumerate(codes) if c not in (None, 0)]
            if bad:
                # A dead rank leaves the others blocked in a collective: stop them.
                _stop(procs)
                return bad[0]
            if all(c == 0 for c in codes):
                return None
            if deadline is not None and time.monotonic() > deadline:
                _stop(procs)
                return (0, -int(signal.SIGTERM))
            time.sleep(0.2)


def _tee(src: IO[bytes] | None, dst: IO[bytes]) -> threading.Thread:
    def pump() -> None:
        if src is None:
            return
        for line in iter(src.readline, b""):
            dst.write(line)
            dst.flush()
            sys.stdout.buffer.write(line)
            sys.stdout.flush()

    t = threading.Thread(target=pump, daemon=True)
    t.start()
    return t


def _stop(procs: list[subprocess.Popen[bytes]], grace_s: float = 10.0) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    deadline = time.monotonic() + grace_s
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
