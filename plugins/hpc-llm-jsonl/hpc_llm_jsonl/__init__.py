"""A JSONL-file data source for hpc_llm, shipped as a separate package.

Registered through the ``hpc_llm`` entry-point group (see pyproject.toml).
Login-side methods only read the first line of the file; the conversion to
MDS runs inside the job, once, under hpc_llm's cross-process lock.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpc_llm import hookimpl
from hpc_llm.data.loaders import text_loader
from hpc_llm.errors import ConfigError
from hpc_llm.paths import cache_dir
from hpc_llm.plugins.base import DataSource
from hpc_llm.plugins.registry import Registry


class JsonlSource(DataSource):
    name = "jsonl"
    description = "a JSONL file of {text: ...} records, converted to MDS at first use"

    @dataclass
    class Options:
        # Field holding the text of each record.
        text_key: str = "text"
        # Fraction of lines (from the end of the file) held out for evaluation.
        heldout_fraction: float = 0.1

    def _file(self, section) -> Path:
        if not section.path:
            raise ConfigError("data.path is required for data source 'jsonl' (a .jsonl file)")
        return Path(str(section.path)).expanduser().resolve()

    def _mds_dir(self, section) -> Path:
        f = self._file(section)
        st = f.stat()
        key = hashlib.sha256(f"{f}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:12]
        return cache_dir() / "jsonl" / key / "mds"

    def validate(self, section, plan) -> None:
        opts = self.options(section)
        f = self._file(section)
        if not f.is_file():
            raise ConfigError(f"data.path={str(f)!r} does not exist or is not a file")
        if not 0.0 < opts.heldout_fraction < 1.0:
            raise ConfigError(f"data.options.heldout_fraction={opts.heldout_fraction}: must be between 0 and 1")
        with f.open(encoding="utf-8") as fh:
            first = fh.readline()
        try:
            record = json.loads(first)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"data.path={str(f)!r}: line 1 is not JSON ({exc.msg})") from None
        if not isinstance(record, dict) or opts.text_key not in record:
            raise ConfigError(
                f"data.path={str(f)!r}: line 1 has no '{opts.text_key}' field "
                f"(set data.options.text_key); fields: {', '.join(record) if isinstance(record, dict) else '-'}"
            )

    def train_config(self, section, plan) -> dict[str, Any]:
        local = str(self._mds_dir(section))
        return {
            "train_loader": text_loader(section.train_split, local=local, train=True),
            "eval_loader": text_loader(section.eval_split, local=local, train=False),
        }

    def prepare(self, section, ctx) -> None:
        from hpc_llm.plugins.once import build_once

        opts = self.options(section)
        src = self._file(section)

        def convert(out: Path) -> None:
            from streaming import MDSWriter

            texts = [
                str(json.loads(line)[opts.text_key])
                for line in src.read_text(encoding="utf-8").splitlines()
                if line.strip()
            ]
            cut = max(1, int(len(texts) * (1 - opts.heldout_fraction)))
            for split, rows in ((section.train_split, texts[:cut]), (section.eval_split, texts[cut:])):
                with MDSWriter(out=str(out / split), columns={"text": "str"}, compression=None) as w:
                    for text in rows:
                        w.write({"text": text})

        build_once(self._mds_dir(section), convert)


@hookimpl
def hpc_llm_register_data_sources(register: Registry) -> None:
    # this plugin's own registry: `hpc-llm plugins` lists what it takes under hpc-llm-jsonl
    register(JsonlSource())
