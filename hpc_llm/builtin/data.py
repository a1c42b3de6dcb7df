"""Built-in data sources: the bundled tiny corpus, local MDS, remote streaming.

Fragments may use ``${max_seq_len}`` and ``${seed}``: they are resolved
against the merged LLM Foundry train config.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from omegaconf import DictConfig

from hpc_llm import hookimpl
from hpc_llm.data.loaders import text_loader
from hpc_llm.errors import ConfigError, require_scheme
from hpc_llm.paths import cache_dir
from hpc_llm.plan import JobPlan
from hpc_llm.plugins.base import DataSource

# Schemes mosaicml-streaming can download from (streaming.base.storage).
REMOTE_SCHEMES = ("s3", "gs", "oci", "azure", "azure-dl", "dbfs", "sftp", "hf", "http", "https")


class TinyCorpus(DataSource):
    name = "tiny_corpus"
    description = "bundled corpus + byte-level BPE tokenizer, built locally at first use"

    @dataclass
    class Options:
        # Where the tokenizer and MDS shards are built; None: $HPC_LLM_CACHE or ~/.cache/hpc_llm.
        cache_dir: Optional[str] = None

    def _root(self, section: DictConfig) -> Path:
        from hpc_llm.data import tiny_corpus

        opts = self.options(section)
        return tiny_corpus.root(Path(opts.cache_dir) if opts.cache_dir else cache_dir())

    def train_config(self, section: DictConfig, plan: JobPlan) -> dict[str, Any]:
        root = self._root(section)
        mds = str(root / "mds")
        return {
            "tokenizer": {"name": str(root / "tokenizer"), "kwargs": {"model_max_length": "${max_seq_len}"}},
            "train_loader": text_loader(section.train_split, local=mds, train=True),
            "eval_loader": text_loader(section.eval_split, local=mds, train=False),
        }

    def prepare(self, section: DictConfig, ctx: Any) -> None:
        from hpc_llm.data import tiny_corpus

        opts = self.options(section)
        tiny_corpus.ensure(Path(opts.cache_dir) if opts.cache_dir else cache_dir())


def _require(section: DictConfig, key: str, source: str, what: str) -> str:
    value = section.get(key)
    if not value:
        raise ConfigError(f"data.{key} is required for data source '{source}' ({what})")
    return str(value)


class LocalMds(DataSource):
    name = "mds"
    description = "MDS shards in a directory every node sees (<path>/<split>/index.json)"

    def validate(self, section: DictConfig, plan: JobPlan) -> None:
        super().validate(section, plan)
        path = Path(_require(section, "path", self.name, "a directory of MDS splits")).expanduser()
        if not path.is_dir():
            raise ConfigError(f"data.path={str(path)!r} does not exist or is not a directory")
        for split in (section.train_split, section.eval_split):
            if not (path / split / "index.json").is_file():
                raise ConfigError(
                    f"data.path={str(path)!r} has no MDS split '{split}' "
                    f"(expected {path / split / 'index.json'})"
                )

    def train_config(self, section: DictConfig, plan: JobPlan) -> dict[str, Any]:
        local = str(Path(section.path).expanduser().resolve())
        return {
            "train_loader": text_loader(section.train_split, local=local, train=True),
            "eval_loader": text_loader(section.eval_split, local=local, train=False),
        }


class RemoteStreaming(DataSource):
    name = "hf"
    description = "remote MDS (s3/gs/oci/azure/hf/...) streamed by mosaicml-streaming"

    def validate(self, section: DictConfig, plan: JobPlan) -> None:
        super().validate(section, plan)
        remote = _require(section, "remote", self.name, "a remote MDS location")
        require_scheme("data.remote", remote, REMOTE_SCHEMES, "a location Streaming can read")

    def train_config(self, section: DictConfig, plan: JobPlan) -> dict[str, Any]:
        # Without data.path, shards are cached node-locally (cwd is node-local scratch).
        local = str(section.path) if section.path else "streaming_cache"
        return {
            "train_loader": text_loader(section.train_split, local=local, remote=section.remote, train=True),
            "eval_loader": text_loader(section.eval_split, local=local, remote=section.remote, train=False),
        }


@hookimpl
def hpc_llm_register_data_sources(register) -> None:
    register(TinyCorpus())
    register(LocalMds())
    register(RemoteStreaming())
