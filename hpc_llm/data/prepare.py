"""``hpc-llm data prepare``: datasets -> files every node can read.

Heavy (imports LLM Foundry / datasets); run where the ``train`` extra is
installed. C4 goes through LLM Foundry's own converters (``convert_dataset_hf``
from the hub, ``convert_dataset_json`` from local files of the same schema),
so the shards are exactly what LLM Foundry's ``text`` loader expects.
Nothing existing is overwritten.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from hpc_llm.errors import ConfigError

#: LLM Foundry's C4 split names -> the Hugging Face split they are cut from
C4_SPLITS = {
    "train": "train",
    "train_small": "train",
    "val": "validation",
    "val_small": "validation",
    "val_xsmall": "validation",
    "val_xxsmall": "validation",
}
C4_DEFAULT_SPLITS = ["train_small", "val_small"]


def _refuse_existing(out: str, splits: list[str]) -> None:
    if out.startswith("s3://"):
        _refuse_existing_in_store(out, splits)
        return
    if "://" in out:
        return  # Streaming's MDSWriter refuses a non-empty remote folder itself
    for split in splits:
        if (Path(out) / split).exists() or (Path(out) / f"{split}.jsonl").exists():
            raise ConfigError(f"{out}: split '{split}' exists already; remove it or choose another --out")


def _refuse_existing_in_store(out: str, splits: list[str]) -> None:
    """--out s3://...: the store takes the credentials and has the bucket, and no split is
    there yet; one line each, before LLM Foundry's converter reads anything (Streaming's
    MDSWriter writes each shard locally, then uploads it, through the same S3_ENDPOINT_URL)."""
    from hpc_llm.job.rank import store_check
    from hpc_llm.job.rank.object_store import Store

    problems = store_check.problems([{"key": "--out", "uri": out, "role": "data", "splits": []}])
    if problems:
        raise ConfigError(problems[0])
    store, loc = Store.of(out)
    for split in splits:
        if store.list(loc.key(split) + "/"):
            raise ConfigError(f"{out}: split '{split}' exists already in the store; remove it or choose another --out")


def copy_mds(mds: Path, out: str, splits: list[str]) -> list[str]:
    """MDS splits already built (``<mds>/<split>/``) copied to ``out``: a directory, or
    ``s3://...`` (each file uploaded as ``<out>/<split>/<file>``); nothing is overwritten."""
    missing = [s for s in splits if not (mds / s / "index.json").is_file()]
    if missing:
        have = ", ".join(sorted(p.name for p in mds.iterdir()))
        raise ConfigError(f"--splits: no split '{missing[0]}'; allowed: {have}")
    if "://" in out and not out.startswith("s3://"):
        raise ConfigError(f"--out {out}: this source copies to a directory or to s3:// only")
    _refuse_existing(out, splits)
    written = []
    for split in splits:
        files = sorted(p for p in (mds / split).iterdir() if p.is_file())
        if out.startswith("s3://"):
            from hpc_llm.job.rank.object_store import Store

            store, loc = Store.of(out)
            for f in files:
                store.put(loc.key(f"{split}/{f.name}"), f)
            written.append(loc.uri(split))
        else:
            import shutil

            shutil.copytree(mds / split, Path(out) / split)
            written.append(str(Path(out) / split))
    return written


def _eos_text(tokenizer: str) -> str:
    """LLM Foundry needs an EOS (or BOS) text between documents when the tokenizer adds none."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer)
    return tok.eos_token or ""


def _local_c4_files(source: Path, hf_split: str) -> list[Path]:
    """C4's own layout: en/c4-train.00000-of-01024.json.gz, c4-validation.*.json.gz (or .jsonl)."""
    return sorted(
        p
        for p in source.rglob("*")
        if p.is_file() and f"-{hf_split}." in p.name and p.name.endswith((".json", ".json.gz", ".jsonl", ".jsonl.gz"))
    )


def c4_to_mds(
    out: str,
    *,
    source: str | None,
    splits: list[str],
    tokenizer: str,
    concat_tokens: int,
    compression: str | None,
) -> list[str]:
    splits = splits or C4_DEFAULT_SPLITS
    bad = [s for s in splits if s not in C4_SPLITS]
    if bad:
        raise ConfigError(f"--splits {' '.join(bad)}: not a C4 split; allowed: {', '.join(C4_SPLITS)}")
    _refuse_existing(out, splits)
    from llmfoundry.command_utils import convert_dataset_hf, convert_dataset_json

    eos = _eos_text(tokenizer)
    if source is None:
        convert_dataset_hf(
            dataset="allenai/c4",
            data_subset="en",
            splits=splits,
            out_root=out,
            compression=compression,
            concat_tokens=concat_tokens,
            tokenizer=tokenizer,
            tokenizer_kwargs={},
            bos_text="",
            eos_text=eos,
            no_wrap=False,
            num_workers=None,
        )
        return [os.path.join(out, s) for s in splits]
    root = Path(source).expanduser()
    written = []
    for split in splits:
        files = _local_c4_files(root, C4_SPLITS[split])
        if not files:
            raise ConfigError(f"--source {root}: no c4-{C4_SPLITS[split]}.*.json[l][.gz] files for split '{split}'")
        with tempfile.TemporaryDirectory() as tmp:
            # convert_dataset_json reads every file of one directory as one split
            for i, f in enumerate(files):
                os.symlink(f.resolve(), Path(tmp) / f"{i:05d}-{f.name}")
            convert_dataset_json(
                path=tmp,
                out_root=os.path.join(out, split),
                compression=compression,
                concat_tokens=concat_tokens,
                split="train",
                tokenizer=tokenizer,
                bos_text="",
                eos_text=eos,
                no_wrap=False,
            )
        written.append(os.path.join(out, split))
    return written


def finetuning_to_jsonl(out: str, name: str, splits: list[str], prompt: str, response: str) -> list[str]:
    """Hub (or local) prompt/response rows -> ``<out>/<split>.jsonl``, for nodes without internet."""
    _refuse_existing(out, splits)
    import datasets

    Path(out).mkdir(parents=True, exist_ok=True)
    written = []
    for split in splits:
        try:
            ds = datasets.load_dataset(name, split=split)
        except datasets.exceptions.DatasetNotFoundError:
            raise ConfigError(f"dataset {name!r} not found (on the hub, or as a local directory)") from None
        except ValueError as exc:
            raise ConfigError(f"{name}: no split '{split}' ({str(exc).splitlines()[0]})") from None
        missing = [c for c in (prompt, response) if c not in ds.column_names]
        if missing:
            raise ConfigError(
                f"{name} split '{split}' has columns {', '.join(ds.column_names)}; "
                f"missing {', '.join(missing)}; set data.options.prompt_column/response_column"
            )
        ds = ds.select_columns([prompt, response])
        if (prompt, response) != ("prompt", "response"):
            ds = ds.rename_columns({prompt: "prompt", response: "response"})
        path = os.path.join(out, f"{split}.jsonl")
        ds.to_json(path, lines=True)
        written.append(path)
    return written
