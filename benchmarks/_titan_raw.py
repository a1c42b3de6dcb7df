"""torchtitan without hpc_llm, for benchmarks/titan.py (run in .venv-torchtitan).

``torchrun --nproc-per-node 2 benchmarks/_titan_raw.py train SPEC.json``: torchtitan's own
``Trainer`` on the config hpc_llm gives a run (SPEC: ``hpc-llm config``'s keys, the model, the
data's files), with no agent, supervisor, heartbeat or step duties: the CPU fixes (upstream
fixes 23-25) are applied, as torchtitan cannot train on CPU without them. Prints the tokens/s
of the last 10 steps (as hpc_llm's StepDuties measures them) and over the whole of
``Trainer.train()`` (as hpc_llm's ``train_s`` times it).

``python benchmarks/_titan_raw.py save``: one rank, a ~100M-parameter Llama 3; the time each
``checkpointer.save`` blocks the loop, async (``checkpoint.async_mode=async``) against
synchronous, five saves each (the median of the last four: the first async save also starts
the process group its background writes use).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from types import SimpleNamespace
from typing import Any


def _setup() -> Any:
    from hpc_llm.job.rank.titan import compat, run

    compat.apply()
    return run


def train(spec_path: str) -> None:
    run = _setup()
    from torchtitan.tools.logging import init_logger
    from torchtitan.trainer import Trainer

    with open(spec_path) as f:
        spec = json.load(f)
    data = SimpleNamespace(**spec["data"])
    run._register_datasets(data)
    config = run.build_config(dict(spec["flat"]), spec["model"], data, heldout=False, heldout_batches=1)
    config.dump_folder = tempfile.mkdtemp(prefix="titan-raw-")
    init_logger()
    trainer = Trainer(config)
    ends: list[tuple[int, float]] = []
    step_fn = trainer.train_step

    def timed(it: Any) -> None:
        if not ends:
            ends.append((trainer.step - 1, time.time()))
        step_fn(it)
        ends.append((trainer.step, time.time()))

    trainer.train_step = timed
    started = time.time()
    trainer.train()
    train_s = time.time() - started
    (s0, t0), (s1, t1) = ends[-11], ends[-1]
    tokens = int(config.training.global_batch_size) * int(config.training.seq_len)
    if int(os.environ.get("RANK", "0")) == 0:
        out = {"tokens_per_sec": (s1 - s0) * tokens / (t1 - t0), "loop_tokens_per_sec": s1 * tokens / train_s}
        print(json.dumps(out), flush=True)
    trainer.close()


def save() -> None:
    run = _setup()
    import torch.distributed as tdist
    from torchtitan.tools.logging import init_logger
    from torchtitan.trainer import Trainer

    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT="29612")
    data = SimpleNamespace(**json.loads(sys.argv[2]))
    run._register_datasets(data)
    model = {
        "name": "torchtitan_llama3",
        "hidden_size": 1024,
        "num_hidden_layers": 8,
        "num_attention_heads": 16,
        "num_key_value_heads": 16,
        "intermediate_size": 4096,
        "vocab_size": 512,
    }
    init_logger()
    blocking: dict[str, list[float]] = {"async": [], "disabled": []}
    params = 0
    for mode in blocking:  # one trainer at a time: each starts its own process group
        flat = {
            "training.global_batch_size": 1,
            "training.local_batch_size": 1,
            "training.seq_len": 32,
            "training.steps": 100,
            run.titan_config.ADAMW: {"lr": 1e-4, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.0},
            "checkpoint.enable": True,
            "checkpoint.folder": tempfile.mkdtemp(prefix=f"titan-save-{mode}-"),
            "checkpoint.interval": 1,
            "checkpoint.keep_latest_k": 0,
            "checkpoint.async_mode": mode,
            "checkpoint.last_save_model_only": False,
        }
        config = run.build_config(flat, model, data, heldout=False, heldout_batches=1)
        config.dump_folder = tempfile.mkdtemp(prefix="titan-save-")
        trainer = Trainer(config)
        params = sum(p.numel() for p in trainer.model_parts[0].parameters())
        for i in range(1, 6):
            t0 = time.perf_counter()
            trainer.checkpointer.save(i, last_step=False)
            blocking[mode].append(time.perf_counter() - t0)
            trainer.checkpointer.maybe_wait_for_saving()  # the next save starts from a quiet disk
        trainer.close()
        if tdist.is_initialized():
            tdist.destroy_process_group()
    out = {mode: statistics.median(v) for mode, v in blocking.items()}
    print(
        json.dumps({"params": params, "blocking_s": blocking, "median_s": out, "ratio": out["async"] / out["disabled"]})
    )


if __name__ == "__main__":
    {"train": lambda: train(sys.argv[2]), "save": save}[sys.argv[1]]()
