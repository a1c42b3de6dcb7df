"""Login-side checks of local finetuning files (pure: json/csv only).

LLM Foundry finds out that a column is missing only after the job has started
and tokenized; reading the first row of each split here turns that into one
line before anything is submitted.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

from hpc_llm.errors import ConfigError

SUFFIXES = (".jsonl", ".json", ".csv", ".parquet")


def split_files(root: Path, split: str) -> list[Path]:
    """Files Hugging Face ``datasets`` would assign to ``split`` in a local directory."""
    if root.is_file():
        return [root]
    return sorted(
        p
        for p in root.iterdir()
        if p.is_file()
        and p.name.endswith(SUFFIXES)
        and (p.name.split(".")[0] == split or p.name.startswith((f"{split}-", f"{split}_")))
    )


def first_row_columns(path: Path) -> list[str] | None:
    """Column names of the first row, or None where reading needs pyarrow (parquet)."""
    if path.suffix == ".parquet":
        return None
    with path.open(encoding="utf-8") as f:
        if path.suffix == ".csv":
            return next(csv.reader(f), [])
        head = f.read(1 << 20).lstrip()
    if head.startswith("["):  # a JSON array of rows
        try:
            rows = json.loads(head if head.rstrip().endswith("]") else Path(path).read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise ConfigError(f"data.path: {path} is not valid JSON ({exc.msg} at line {exc.lineno})") from None
        return list(rows[0]) if rows and isinstance(rows[0], dict) else []
    line = next((ln for ln in head.splitlines() if ln.strip()), "")
    try:
        row = json.loads(line) if line else {}
    except json.JSONDecodeError as exc:
        raise ConfigError(f"data.path: {path} is not JSON lines ({exc.msg} in its first row)") from None
    return list(row) if isinstance(row, dict) else []


def check_prompt_response(root: Path, split: str, prompt: str, response: str) -> None:
    if not root.exists():
        raise ConfigError(f"data.path={str(root)!r} does not exist")
    files = split_files(root, split)
    if not files:
        found = ", ".join(sorted(p.name for p in root.iterdir())[:8]) if root.is_dir() else "-"
        raise ConfigError(
            f"data.path={str(root)!r} has no file for split '{split}' "
            f"(expected {split}.jsonl, .json, .csv or .parquet); found: {found or '(empty)'}"
        )
    columns = first_row_columns(files[0])
    if columns is None or "messages" in columns:
        return
    missing = [c for c in (prompt, response) if c not in columns]
    if missing:
        raise ConfigError(
            f"data.path: {files[0]} has columns {', '.join(columns) or '(none)'} but no "
            f"{' or '.join(repr(m) for m in missing)}; a finetuning dataset needs prompt and response columns "
            "(or messages); map yours with data.options.prompt_column=NAME data.options.response_column=NAME"
        )
