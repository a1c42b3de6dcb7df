"""LLM Foundry dataloader sections, for data-source plugins (pure)."""

from __future__ import annotations

from typing import Any

#: dataloader worker processes per rank on GPU nodes (LLM Foundry's yamls use 8)
GPU_WORKERS = 8
#: attempts at each shard download from a remote (Streaming's ``download_retry``, default 2;
#: docs/upstream-fixes.md, upstream fix 19): Streaming waits 1, 2, 4, ... s between them, so 10 rides
#: out a store that is down or frozen for about 8 minutes instead of failing the run after 3 s
REMOTE_DOWNLOAD_RETRY = 10


def workers_for(device: str) -> int:
    """Workers > 0 fork per rank: worth it on GPU nodes, not for CPU test runs."""
    return GPU_WORKERS if device == "gpu" else 0


def _loader(dataset: dict[str, Any], name: str, *, train: bool, workers: int) -> dict[str, Any]:
    return {
        "name": name,
        "dataset": dataset,
        "drop_last": train,
        "num_workers": workers,
        # torch rejects a prefetch_factor without workers
        "prefetch_factor": 2 if workers else None,
        "persistent_workers": bool(workers),
        "pin_memory": bool(workers),
        "timeout": 0,
    }


def text_loader(split: str, *, local: str, remote: str | None = None, train: bool, workers: int = 0) -> dict[str, Any]:
    """An LLM Foundry ``text`` dataloader section over MDS shards."""
    dataset: dict[str, Any] = {
        "local": local,
        "split": split,
        "shuffle": train,
        "shuffle_seed": "${seed}",
        "max_seq_len": "${max_seq_len}",
    }
    if remote:
        dataset["remote"] = remote
        dataset["download_retry"] = REMOTE_DOWNLOAD_RETRY
    return _loader(dataset, "text", train=train, workers=workers)


def text_loaders(section: Any, *, local: str, remote: str | None = None, workers: int = 0) -> dict[str, Any]:
    """``train_loader`` and ``eval_loader`` over the data section's two MDS splits."""
    return {
        "train_loader": text_loader(section.train_split, local=local, remote=remote, train=True, workers=workers),
        "eval_loader": text_loader(section.eval_split, local=local, remote=remote, train=False, workers=workers),
    }


def tokenizer_section(name: str) -> dict[str, Any]:
    """An LLM Foundry ``tokenizer`` section whose context follows ``max_seq_len``."""
    return {"name": name, "kwargs": {"model_max_length": "${max_seq_len}"}}


def finetuning_loader(
    split: str,
    *,
    hf_name: str,
    train: bool,
    workers: int = 0,
    preprocessing_fn: Any = None,
    packing_ratio: Any = None,
    hf_kwargs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """An LLM Foundry ``finetuning`` dataloader section (prompt/response or chat rows)."""
    dataset: dict[str, Any] = {
        "hf_name": hf_name,
        "split": split,
        "max_seq_len": "${max_seq_len}",
        "decoder_only_format": True,
        "allow_pad_trimming": False,
        "shuffle": train,
        "shuffle_seed": "${seed}",
    }
    if preprocessing_fn is not None:
        dataset["preprocessing_fn"] = preprocessing_fn
    if packing_ratio is not None:
        dataset["packing_ratio"] = packing_ratio
    if hf_kwargs:
        dataset["hf_kwargs"] = hf_kwargs
    return _loader(dataset, "finetuning", train=train, workers=workers)
