"""LLM Foundry dataloader sections, for data-source plugins (pure)."""

from __future__ import annotations

from typing import Any


def text_loader(split: str, *, local: str, remote: str | None = None, train: bool) -> dict[str, Any]:
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
    return {
        "name": "text",
        "dataset": dataset,
        "drop_last": train,
        # Workers > 0 fork per rank; 0 keeps CPU runs light. prefetch_factor must
        # then be null (torch rejects a prefetch_factor without workers).
        "num_workers": 0,
        "prefetch_factor": None,
        "persistent_workers": False,
        "pin_memory": False,
    }
