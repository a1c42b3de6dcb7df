"""The bundled tiny corpus: a byte-level BPE tokenizer and MDS shards, built at first use.

The text ships in ``hpc_llm/assets/tiny_corpus.txt`` (one paragraph per line,
the last 10% held out). The tokenizer is trained locally with ``tokenizers``
and saved with ``PreTrainedTokenizerFast.save_pretrained`` so LLM Foundry's
``build_tokenizer`` loads it like any hub tokenizer; the splits are written
with ``streaming.MDSWriter`` as a ``text`` column, which LLM Foundry's
``text`` dataloader tokenizes on the fly.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from hpc_llm.paths import assets_dir
from hpc_llm.plugins.once import build_once

CORPUS_FILE = "tiny_corpus.txt"
VOCAB_SIZE = 512
EOS = "<|endoftext|>"
HELDOUT_FRACTION = 0.1
# Paragraphs are cut into chunks of about this many characters so that each
# sample fills a 128-token context after tokenization.
CHUNK_CHARS = 600


def corpus_lines() -> list[str]:
    text = (assets_dir() / CORPUS_FILE).read_text(encoding="utf-8")
    return [ln for ln in text.splitlines() if ln and not ln.startswith("#")]


def version_key() -> str:
    """Changes whenever the corpus or the build recipe changes."""
    h = hashlib.sha256((assets_dir() / CORPUS_FILE).read_bytes())
    h.update(f"{VOCAB_SIZE}:{CHUNK_CHARS}:{HELDOUT_FRACTION}".encode())
    return h.hexdigest()[:12]


def root(cache: Path) -> Path:
    return Path(cache) / "tiny_corpus" / version_key()


def split_lines() -> dict[str, list[str]]:
    lines = corpus_lines()
    cut = int(len(lines) * (1 - HELDOUT_FRACTION))
    return {"train": lines[:cut], "val": lines[cut:]}


def _chunks(lines: list[str]) -> list[str]:
    out: list[str] = []
    for line in lines:
        for i in range(0, len(line), CHUNK_CHARS):
            piece = line[i : i + CHUNK_CHARS]
            if len(piece) > CHUNK_CHARS // 4:
                out.append(piece)
    return out


def _build_tokenizer(out: Path) -> None:
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(split_lines()["train"], vocab_size=VOCAB_SIZE, min_frequency=2, special_tokens=[EOS])
    tok = PreTrainedTokenizerFast(
        tokenizer_object=bpe._tokenizer,
        eos_token=EOS,
        bos_token=EOS,
        unk_token=EOS,
        pad_token=EOS,
        model_max_length=2048,
    )
    tok.save_pretrained(str(out))  # type: ignore[attr-defined]  # defined on its base class


def _build_mds(out: Path) -> None:
    from streaming import MDSWriter

    for split, lines in split_lines().items():
        with MDSWriter(out=str(out / split), columns={"text": "str"}, compression=None) as w:
            for chunk in _chunks(lines):
                w.write({"text": chunk})


def ensure(cache: Path) -> tuple[Path, Path]:
    """(tokenizer dir, MDS dir) under ``cache``, building them if needed."""
    base = root(cache)
    return build_once(base / "tokenizer", _build_tokenizer), build_once(base / "mds", _build_mds)


def _build_text_tokenizer(out: Path) -> None:
    """The same byte-level BPE, written with ``tokenizers`` alone (``tokenizer.json`` and the
    special tokens in ``tokenizer_config.json``): what a stack without transformers reads
    (torchtitan's ``HuggingFaceTokenizer``)."""
    import json

    from tokenizers import ByteLevelBPETokenizer

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(split_lines()["train"], vocab_size=VOCAB_SIZE, min_frequency=2, special_tokens=[EOS])
    out.mkdir(parents=True, exist_ok=True)
    bpe._tokenizer.save(str(out / "tokenizer.json"))
    special = {"bos_token": EOS, "eos_token": EOS, "unk_token": EOS, "pad_token": EOS, "model_max_length": 2048}
    (out / "tokenizer_config.json").write_text(json.dumps(special, indent=2), encoding="utf-8")


def _build_jsonl(out: Path) -> None:
    import json

    out.mkdir(parents=True, exist_ok=True)
    for split, lines in split_lines().items():
        with open(out / f"{split}.jsonl", "w", encoding="utf-8") as f:
            for chunk in _chunks(lines):
                f.write(json.dumps({"text": chunk}) + "\n")


def ensure_text(cache: Path) -> tuple[Path, Path]:
    """(tokenizer dir, dir of ``train.jsonl`` and ``val.jsonl``) under ``cache``: the same
    corpus, split and chunks as the MDS shards, as JSON lines of ``text`` (a trainer that reads
    Hugging Face datasets: torchtitan)."""
    base = root(cache) / "text"
    return build_once(base / "tokenizer", _build_text_tokenizer), build_once(base / "jsonl", _build_jsonl)
