"""Task functions that tests/test_agents.py runs in ranks forked by real agents, off Slurm.

``train`` stands for a training run: each rank "trains" ``cfg.batches`` batches of
``cfg.batch_s`` seconds, beating its progress (hpc_llm.job.heartbeat), stops at a
batch boundary on the stop signal (hpc_llm.job.rank.preemption), and after every
batch writes what it did to ``<out>/g<generation>.r<rank>`` through the fence
(hpc_llm.job.rank.fence), as a checkpoint save would. Rank 0 keeps the run's
record (hpc_llm.rundir.record) as hpc_llm's task does, so the supervisor decides
on it. ``cfg.crash`` makes a rank fail at a batch; ``cfg.stall`` (batch, seconds)
makes every rank stop there, its heartbeat going on, as ranks waiting on a
stuck collective do; both in generation 0 only. ``stack`` runs what a rank forked from a warm agent must be
able to run: multi-threaded torch (OpenMP), the tokenizers library's thread pool
and a gloo process group.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from hpc_llm.config.plan import JobPlan
from hpc_llm.job import heartbeat
from hpc_llm.job.env import JobEnv
from hpc_llm.job.rank import fence, preemption
from hpc_llm.rundir.record import RunRecord


def _record(cfg: Any, env: JobEnv) -> RunRecord | None:
    if env.rank != 0:
        return None
    run_dir = Path(cfg.run_dir)
    world = env.ntasks
    plan = JobPlan("agent_test", int(cfg.nodes), world // int(cfg.nodes), 0, 1, world, "cpu", "ddp", 3600, str(run_dir))
    resumed = int(cfg.get("resume", 0))
    record = RunRecord.open(
        run_dir, plan, {}, job_id=env.job_id, restart=env.restart, started_at=time.time(), generation=env.generation
    )
    record.note(resumed_at_batch=resumed, forked_at=env.forked_at)
    return record


def train(cfg: Any) -> dict[str, Any]:
    env = JobEnv.current()
    out = Path(cfg.out)
    record = _record(cfg, env)
    heartbeat.phase("train")
    mine = out / f"g{env.generation}.r{env.rank}"
    for b in range(1, int(cfg.batches) + 1):
        got = preemption.received()
        if got:
            fence.check("the stop's record")
            (out / f"stopped.g{env.generation}.r{env.rank}").write_text(str(b - 1))
            if record is not None:
                record.note(signal=got.get("signal"), signal_time=got.get("time"))
                record.stopped({}, batch=b - 1, cause=None)
            raise SystemExit(0)
        time.sleep(float(cfg.batch_s))
        if env.generation == 0 and cfg.get("crash") and [env.rank, b] == list(cfg.crash):
            raise RuntimeError(f"CUDA error: uncorrectable ECC error encountered (rank {env.rank}, batch {b})")
        if env.generation == 0 and cfg.get("stall") and b == int(cfg.stall[0]):
            time.sleep(float(cfg.stall[1]))  # the main thread stuck; the heartbeat thread beats on
        heartbeat.progress(b)
        if record is not None and b == 1:
            record.note(first_batch_at=time.time())
        fence.check("a checkpoint")
        mine.write_text(f"{b} {time.time()}")
    if record is not None:
        record.completed({"batches_done": int(cfg.batches)}, batch=int(cfg.batches))
    return {"rank": env.rank}


def stack(cfg: Any) -> dict[str, Any]:
    """torch's OpenMP threads, the tokenizers thread pool and a gloo all-reduce, in a rank forked
    from an agent that imported them all (HPC_LLM_AGENT_WARM)."""
    import torch
    import torch.distributed as tdist
    from tokenizers import Tokenizer, models, pre_tokenizers

    env = JobEnv.current()
    out = Path(cfg.out)
    torch.set_num_threads(2)
    a = torch.randn(512, 512)
    for _ in range(20):
        a = torch.tanh(a @ a / 512)
    vocab = {f"w{i}": i for i in range(100)} | {"[UNK]": 100}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    encoded = tok.encode_batch([" ".join(f"w{(i + j) % 100}" for j in range(64)) for i in range(2000)])
    dist = env.dist()
    tdist.init_process_group(
        "gloo",
        init_method=f"tcp://{dist.master_addr}:{dist.master_port}",
        rank=dist.rank,
        world_size=dist.world_size,
    )
    t = torch.tensor([float(dist.rank + 1)])
    tdist.all_reduce(t)
    tdist.destroy_process_group()
    threads = torch.get_num_threads()
    (out / f"stack.g{env.generation}.r{env.rank}").write_text(
        f"{t.item()} {len(encoded)} {threads} {float(a.sum()):.3f}"
    )
    if env.rank == 0:
        record = _record(cfg, env)
        if record is not None:
            record.completed({}, batch=0)
    return {"rank": env.rank}
