"""Checkpoints and data in an object store: what a save blocks, and what streaming costs.

Against a real S3 server started here (SeaweedFS, ``hpc_llm.devcluster.s3_server``; it shares this
machine's cores with the training), in one run:

1. **A save's blocking time** on the shared folder and on the S3 server, for mpt_tiny and for
   MPT-125M (fixed sequence length and batch; CPU, fp32, Adam state included). A Composer
   Trainer of each model trains one batch between saves, and the saver's own save path is timed
   (``CheckpointSaver._save_checkpoint``, what a periodic save or a stop runs): on the folder,
   ``torch.save`` and the ``latest`` link; on S3, ``torch.save`` plus the staging of each file for
   its background upload, with Composer's own staging (a copy) and with hpc_llm's (a hard link,
   docs/upstream-fixes.md, upstream fix 13), alternated. It also prints how long the upload itself takes
   (the part of a stop that waits for it, and what ``checkpoint_save_s`` includes for a store).
2. **Streaming from S3**: ``python -m hpc_llm +experiment=mpt_tiny`` (local ranks) reading
   pre-tokenized MDS shards (64 of them: enough for the downloads to overlap training) either
   streamed from the S3 server into an empty node-local cache (``data=remote_mds``) or from a
   local copy (``data=mds``), repeats alternated; the ratio of tokens/s (goal >= 0.98).

    .venv/bin/python benchmarks/object_store.py [--repeats 3] [--skip-125m] [--batches 300]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

MODELS = {
    # name: (MPT config, sequence length, batch)
    "mpt_tiny": (dict(d_model=64, n_heads=4, n_layers=2, expansion_ratio=4, vocab_size=512), 128, 8),
    "mpt-125m": (dict(d_model=768, n_heads=12, n_layers=12, expansion_ratio=4, vocab_size=50368), 512, 2),
}


def free_port_block(n: int) -> int:
    import random
    import socket

    from hpc_llm.devcluster.s3_server import GRPC_OFFSET

    for _ in range(200):
        base = random.randrange(30000, 45000)
        socks = []
        try:
            for p in [*range(base, base + n), *range(base + GRPC_OFFSET, base + n + GRPC_OFFSET)]:
                s = socket.socket()
                s.bind(("127.0.0.1", p))
                socks.append(s)
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
        return base
    raise RuntimeError("no free port block")


# -- 1. what a save blocks ------------------------------------------------------------------------


def trainer_for(model: str, save_folder: str) -> Any:
    import torch
    from composer import Trainer
    from composer.optim import DecoupledAdamW
    from llmfoundry.models.mpt import ComposerMPTCausalLM

    cfg, seq, batch = MODELS[model]
    net = ComposerMPTCausalLM(
        **cfg, max_seq_len=seq, attn_config={"attn_impl": "torch"}, loss_fn="torch_crossentropy", init_device="cpu"
    )
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, cfg["vocab_size"], (batch * 64, seq), generator=g)
    samples = [{"input_ids": row, "labels": row} for row in ids]
    return Trainer(
        model=net,
        train_dataloader=torch.utils.data.DataLoader(samples, batch_size=batch),  # type: ignore[arg-type]
        optimizers=DecoupledAdamW(net.parameters(), lr=1e-4),
        max_duration="1ba",
        save_folder=save_folder,
        save_interval=lambda state, event: False,  # saves are made by hand below
        save_num_checkpoints_to_keep=0 if "://" in save_folder else -1,
        progress_bar=False,
        log_to_console=False,
        device="cpu",
    )


def time_saves(model: str, folder: str, s3_uri: str, repeats: int) -> dict[str, list[float]]:
    """Each backend's blocking times (and S3's upload times), with repeats alternated."""
    from composer.callbacks import CheckpointSaver
    from composer.utils.remote_uploader import RemoteUploader

    from hpc_llm.job.rank import compat

    composers_own = RemoteUploader.upload_file_async
    compat.apply()
    hpc_llms = RemoteUploader.upload_file_async
    trainers = {"folder": trainer_for(model, folder), "s3": trainer_for(model, s3_uri)}
    for t in trainers.values():
        t.fit()  # one batch: the optimizer's state exists, as in any real save
        # as in an hpc_llm job, no polling for Composer's own link (it would count in the upload's wait)
        next(cb for cb in t.state.callbacks if isinstance(cb, CheckpointSaver)).latest_remote_file_name = None
    out: dict[str, list[float]] = {}
    for _ in range(repeats):
        for name, staging in (("folder", None), ("s3, Composer's copy", composers_own), ("s3, hard link", hpc_llms)):
            t = trainers["folder" if staging is None else "s3"]
            t.fit(duration="1ba")  # a new batch: a new save's name
            saver = next(cb for cb in t.state.callbacks if isinstance(cb, CheckpointSaver))
            if staging is not None:
                RemoteUploader.upload_file_async = staging  # type: ignore[method-assign]
            t0 = time.perf_counter()
            saver._save_checkpoint(t.state, t.logger)
            out.setdefault(name, []).append(time.perf_counter() - t0)
            if staging is not None:
                t1 = time.perf_counter()
                saver.remote_uploader.wait()
                out.setdefault("s3, upload after the save", []).append(time.perf_counter() - t1)
    RemoteUploader.upload_file_async = hpc_llms  # type: ignore[method-assign]
    for t in trainers.values():
        t.close()
    return out


def checkpoint_bytes(folder: str) -> int:
    sizes = [p.stat().st_size for p in Path(folder).rglob("*.pt") if p.is_file() and not p.is_symlink()]
    return max(sizes) if sizes else 0


# -- 2. streaming from S3 -------------------------------------------------------------------------


def write_shards(out: Path, samples: int, seq: int, vocab: int) -> None:
    """Pre-tokenized samples (a ``tokens`` column of int32s, as ``hpc-llm data prepare c4``
    writes them), in 64 shards of ``samples // 64``."""
    import numpy as np
    from streaming import MDSWriter

    rng = np.random.default_rng(0)
    per_shard = samples // 64
    shard_bytes = per_shard * (seq * 4 + 64) + 1024
    for split, n in (("train", samples), ("val", 64)):
        with MDSWriter(out=str(out / split), columns={"tokens": "ndarray:int32"}, size_limit=shard_bytes) as w:
            for _ in range(n):
                w.write({"tokens": rng.integers(0, vocab, seq, dtype=np.int32)})


def one_run(args: list[str], env: dict[str, str], runs: Path) -> float:
    before = set(runs.rglob("results.json")) if runs.exists() else set()
    proc = subprocess.run([sys.executable, "-m", "hpc_llm", *args], env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"run failed: {' '.join(args)}\n{proc.stderr[-3000:]}")
    [new] = set(runs.rglob("results.json")) - before
    return float(json.loads(new.read_text())["tokens_per_sec"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batches", type=int, default=300, help="batches per streaming run")
    ap.add_argument("--skip-125m", action="store_true", help="the save figures for mpt_tiny only")
    a = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from hpc_llm.data import tiny_corpus
    from hpc_llm.devcluster import s3_server
    from hpc_llm.paths import cache_dir

    work = Path(tempfile.mkdtemp(prefix="hpc_llm-bench-store-", dir=os.environ.get("HPC_LLM_BENCH_DIR")))
    server = s3_server.start(work / "s3", free_port_block(5))
    os.environ.update(server.env())
    try:
        print(f"S3 server: SeaweedFS at {server.endpoint} (this machine, {os.cpu_count()} cores)\n")
        print("1. what a save blocks training for (seconds; median of", a.repeats, "alternated repeats)")
        for model in ["mpt_tiny"] + ([] if a.skip_125m else ["mpt-125m"]):
            folder = str(work / f"folder-{model}")
            times = time_saves(model, folder, server.uri(f"bench/{model}"), a.repeats)
            _cfg, seq, batch = MODELS[model]
            size = checkpoint_bytes(folder)
            print(f"  {model} (seq {seq}, batch {batch}, checkpoint {size / 1e6:.1f} MB):")
            base = statistics.median(times["folder"])
            for name, values in times.items():
                med = statistics.median(values)
                print(f"    {name:28s} {med:8.3f}   ({med / base:5.2f} x the folder's)")
        print()
        _tokenizer, _ = tiny_corpus.ensure(cache_dir())
        tokenizer = _tokenizer
        samples = a.batches * 8 + 8 * 64
        local = work / "mds"
        write_shards(local, samples, 128, 512)
        from hpc_llm.data.prepare import copy_mds

        remote = server.uri("bench/stream")
        copy_mds(local, remote, ["train", "val"])
        shards = len(list((local / "train").glob("*.mds")))
        common = [
            "+experiment=mpt_tiny",
            "eval=none",
            f"train.max_duration={a.batches}ba",
            f"+train.tokenizer.name={tokenizer}",
        ]
        runs = work / "runs"
        env = {**os.environ, "HPC_LLM_RUNS": str(runs), "PYTHONPATH": f"{ROOT}:{os.environ.get('PYTHONPATH', '')}"}
        streamed, copied = [], []
        for _ in range(a.repeats):
            streamed.append(one_run([*common, "data=remote_mds", f"data.remote={remote}"], env, runs))
            copied.append(one_run([*common, "data=mds", f"data.path={local}"], env, runs))
        s, c = statistics.median(streamed), statistics.median(copied)
        print(f"2. mpt_tiny, {a.batches} batches, {shards} shards, 2 local ranks: tokens/s (median of {a.repeats})")
        print(f"    streamed from S3 into an empty cache   {s:10,.0f}   {[round(x) for x in streamed]}")
        print(f"    from a local copy                      {c:10,.0f}   {[round(x) for x in copied]}")
        print(f"    ratio streamed / local                 {s / c:10.3f}   (goal >= 0.98)")
    finally:
        s3_server.stop(work / "s3")


if __name__ == "__main__":
    main()
