"""Built-in data sources: the bundled tiny corpus, local MDS, remote streaming.

Fragments may use ``${max_seq_len}`` and ``${seed}``: they are resolved
against the merged LLM Foundry train config.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from omegaconf import DictConfig

from hpc_llm import hookimpl
from hpc_llm.config.plan import JobPlan
from hpc_llm.data.loaders import finetuning_loader, text_loaders, tokenizer_section, workers_for
from hpc_llm.errors import ConfigError, require_scheme
from hpc_llm.paths import cache_dir
from hpc_llm.plugins.base import DataSource, HostPath, TextData, local_path

# Schemes mosaicml-streaming can download from (streaming.base.storage).
REMOTE_SCHEMES = ("s3", "gs", "oci", "azure", "azure-dl", "dbfs", "sftp", "hf", "http", "https")

#: where shards streamed from a remote are cached: relative, so under each rank's working
#: directory, which is node-local scratch (hpc_llm.job.rank.task.node_local_dir)
NODE_LOCAL_CACHE = "streaming_cache"


class TinyCorpus(DataSource):
    # any trainer: LLM Foundry loaders, or its text files (text_data) for any other trainer
    trainers = None
    name = "tiny_corpus"
    description = "bundled corpus + byte-level BPE tokenizer, built locally at first use (or streamed: data.remote)"

    @dataclass
    class Options:
        # Where the tokenizer and MDS shards are built; None: $HPC_LLM_CACHE or ~/.cache/hpc_llm.
        cache_dir: Optional[str] = None

    def _root(self, section: DictConfig) -> Path:
        from hpc_llm.data import tiny_corpus

        opts = self.options(section)
        return tiny_corpus.root(Path(opts.cache_dir) if opts.cache_dir else cache_dir())

    def validate(self, section: DictConfig, plan: JobPlan) -> None:
        super().validate(section, plan)
        if section.remote:
            require_scheme("data.remote", str(section.remote), REMOTE_SCHEMES, "a location Streaming can read")

    def train_config(self, section: DictConfig, plan: JobPlan) -> dict[str, Any]:
        root = self._root(section)
        tokenizer = tokenizer_section(str(root / "tokenizer"))
        if section.remote:
            # its shards streamed from where `hpc-llm data prepare tiny_corpus --out URI` put them
            local = f"{NODE_LOCAL_CACHE}/tiny_corpus"
            loaders = text_loaders(section, local=local, remote=str(section.remote), workers=workers_for(plan.device))
            return {"tokenizer": tokenizer, **loaders}
        return {"tokenizer": tokenizer, **text_loaders(section, local=str(root / "mds"))}

    def host_paths(self, section: DictConfig, plan: JobPlan) -> list[HostPath]:
        return [HostPath(str(self._root(section).expanduser().resolve()), "tiny corpus cache", created_by_job=True)]

    def prepare(self, section: DictConfig, ctx: Any) -> None:
        from hpc_llm.data import tiny_corpus

        opts = self.options(section)
        tiny_corpus.ensure(Path(opts.cache_dir) if opts.cache_dir else cache_dir())

    def text_data(self, section: DictConfig, ctx: Any) -> TextData:
        from hpc_llm.data import tiny_corpus

        opts = self.options(section)
        tokenizer, text = tiny_corpus.ensure_text(Path(opts.cache_dir) if opts.cache_dir else cache_dir())
        return TextData(
            str(tokenizer), str(text / f"{section.train_split}.jsonl"), str(text / f"{section.eval_split}.jsonl")
        )

    def prepare_data(self, section: DictConfig, out: str, source: str | None, splits: list[str]) -> list[str]:
        """Its MDS splits (built here if needed) copied to ``out``: a directory, or ``s3://...``."""
        from hpc_llm.data import prepare, tiny_corpus

        if source:
            raise ConfigError("--source: the tiny corpus is bundled with hpc_llm; it takes none")
        opts = self.options(section)
        _tokenizer, mds = tiny_corpus.ensure(Path(opts.cache_dir) if opts.cache_dir else cache_dir())
        return prepare.copy_mds(mds, out, splits or [section.train_split, section.eval_split])


def _require(section: DictConfig, key: str, source: str, what: str) -> str:
    value = section.get(key)
    if not value:
        raise ConfigError(f"data.{key} is required for data source '{source}' ({what})")
    return str(value)


def _check_mds_splits(path: Path, section: DictConfig, missing: str) -> None:
    """Each split is <path>/<split>/index.json; ``missing`` ends the error (what to do)."""
    for split in (section.train_split, section.eval_split):
        if not (path.expanduser() / split / "index.json").is_file():
            raise ConfigError(f"data.path={str(path)!r} has no MDS split '{split}'; " + missing.format(split=split))


class LocalMds(DataSource):
    name = "mds"
    description = "MDS shards in a directory every node sees (<path>/<split>/index.json)"

    def validate(self, section: DictConfig, plan: JobPlan) -> None:
        super().validate(section, plan)
        path = Path(_require(section, "path", self.name, "a directory of MDS splits")).expanduser()
        if not path.is_dir():
            raise ConfigError(f"data.path={str(path)!r} does not exist or is not a directory")
        _check_mds_splits(path, section, f"expected {path}/{{split}}/index.json")

    def train_config(self, section: DictConfig, plan: JobPlan) -> dict[str, Any]:
        local = str(Path(section.path).expanduser().resolve())
        return text_loaders(section, local=local, workers=workers_for(plan.device))


class FromYaml(DataSource):
    name = "yaml"
    description = "the loaders of an LLM Foundry train yaml (yaml=PATH), as written"

    @dataclass
    class Options:
        # The local paths the yaml reads (data, tokenizer, model), set when it is read
        # (hpc_llm/config/foundry_yaml.py): a container binds them.
        paths: list[str] = field(default_factory=list)
        # The key the user sets for each (train.variables.data_local where a variable gives it).
        user_keys: list[str] = field(default_factory=list)
        # The yaml they come from, for messages.
        yaml: Optional[str] = None

    def validate(self, section: DictConfig, plan: JobPlan) -> None:
        """Every local path the yaml reads exists: one rule with the presets' data.path (an error
        on submit, a warning in ``hpc-llm config`` / ``render`` / ``estimate``)."""
        from hpc_llm.config.foundry_yaml import missing_path

        super().validate(section, plan)
        opts = self.options(section)
        for i, p in enumerate(opts.paths):
            if not Path(p).expanduser().exists():
                key = opts.user_keys[i] if i < len(opts.user_keys) else "a path"
                raise ConfigError(missing_path(str(opts.yaml), key, p))

    def train_config(self, section: DictConfig, plan: JobPlan) -> dict[str, Any]:
        # the yaml's train_loader / eval_loader / tokenizer are the train config's own keys; its
        # local paths were checked when the yaml was read
        return {}

    def host_paths(self, section: DictConfig, plan: JobPlan) -> list[HostPath]:
        return [
            HostPath(str(Path(p).expanduser().resolve()), "a path the yaml reads") for p in self.options(section).paths
        ]


def cache_beside_remote(path: Any, default: str) -> str:
    """The ``local`` of a loader that streams from a remote: a relative path stays relative, so
    node-local (each node downloads and caches its own shards, as Streaming expects); an
    absolute one is the user's explicit choice of a shared cache."""
    return str(path) if path else default


class RemoteMds(DataSource):
    name = "remote_mds"
    description = "MDS shards in an object store (s3/gs/oci/azure/hf/...), streamed by mosaicml-streaming"

    def validate(self, section: DictConfig, plan: JobPlan) -> None:
        super().validate(section, plan)
        remote = _require(section, "remote", self.name, "a remote MDS location")
        require_scheme("data.remote", remote, REMOTE_SCHEMES, "a location Streaming can read")

    def train_config(self, section: DictConfig, plan: JobPlan) -> dict[str, Any]:
        local = cache_beside_remote(section.path, NODE_LOCAL_CACHE)
        return text_loaders(section, local=local, remote=section.remote, workers=workers_for(plan.device))

    def host_paths(self, section: DictConfig, plan: JobPlan) -> list[HostPath]:
        local = local_path(section.path)  # a shared cache of the streamed shards, filled by the job
        return [HostPath(local, "data.path (cache of data.remote)", created_by_job=True)] if local else []


class C4(DataSource):
    name = "c4"
    description = "C4 as MDS (hpc-llm data prepare c4), local or streamed from data.remote"

    @dataclass
    class Options:
        # Tokenizer the shards are built with and the model trains with.
        tokenizer: str = "EleutherAI/gpt-neox-20b"
        # Tokens per MDS sample when preparing (LLM Foundry's --concat_tokens).
        concat_tokens: int = 2048
        # MDS shard compression when preparing.
        compression: Optional[str] = "zstd"

    def validate(self, section: DictConfig, plan: JobPlan) -> None:
        self.options(section)
        if section.remote:
            require_scheme("data.remote", str(section.remote), REMOTE_SCHEMES, "a location Streaming can read")
            return
        path = Path(_require(section, "path", self.name, "the MDS directory `hpc-llm data prepare c4` wrote"))
        _check_mds_splits(
            path,
            section,
            f"build it with `hpc-llm data prepare c4 --out {path} --splits {{split}}` (or set data.remote)",
        )

    def train_config(self, section: DictConfig, plan: JobPlan) -> dict[str, Any]:
        opts = self.options(section)
        remote = str(section.remote) if section.remote else None
        # streamed shards are cached node-locally (the rank's cwd is node-local scratch), never in
        # data.path: that is where `hpc-llm data prepare c4` writes a shared copy (conf/data/c4.yaml)
        local = f"{NODE_LOCAL_CACHE}/c4" if remote else str(Path(section.path).expanduser().resolve())
        return {
            "tokenizer": tokenizer_section(opts.tokenizer),
            **text_loaders(section, local=local, remote=remote, workers=workers_for(plan.device)),
        }

    def host_paths(self, section: DictConfig, plan: JobPlan) -> list[HostPath]:
        # streamed from data.remote: data.path (the shared copy's default place) is not read
        return [] if section.remote else super().host_paths(section, plan)

    def prepare_data(self, section: DictConfig, out: str, source: str | None, splits: list[str]) -> list[str]:
        from hpc_llm.data import prepare

        opts = self.options(section)
        return prepare.c4_to_mds(
            out,
            source=source,
            splits=splits,
            tokenizer=opts.tokenizer,
            concat_tokens=opts.concat_tokens,
            compression=opts.compression,
        )


class Finetuning(DataSource):
    name = "finetuning"
    description = "prompt/response rows from the hub (datasets) or local .json[l]/.csv/.parquet files"

    @dataclass
    class Options:
        # Hugging Face dataset name (mosaicml/dolly_hhrlhf); ignored when data.path is set.
        hf_name: Optional[str] = None
        # Columns holding the prompt and the response (renamed for LLM Foundry).
        prompt_column: str = "prompt"
        response_column: str = "response"
        # Tokenizer (hub name or local directory); None: train.tokenizer decides.
        tokenizer: Optional[str] = None
        # LLM Foundry packing_ratio (null, a number >= 1, or auto).
        packing_ratio: Optional[Any] = None

    def validate(self, section: DictConfig, plan: JobPlan) -> None:
        from hpc_llm.data import schema

        opts = self.options(section)
        if section.path:
            for split in (section.train_split, section.eval_split):
                schema.check_prompt_response(
                    Path(section.path).expanduser(), split, opts.prompt_column, opts.response_column
                )
        elif not opts.hf_name:
            raise ConfigError(
                "data source 'finetuning' needs data.options.hf_name (a Hugging Face dataset) "
                "or data.path (a directory of <split>.jsonl files)"
            )

    def train_config(self, section: DictConfig, plan: JobPlan) -> dict[str, Any]:
        opts = self.options(section)
        hf_name = str(Path(section.path).expanduser().resolve()) if section.path else str(opts.hf_name)
        # Always map the columns: it also drops extra ones (LLM Foundry rejects them).
        fn = {"prompt": opts.prompt_column, "response": opts.response_column}
        w = workers_for(plan.device)
        out: dict[str, Any] = {
            "train_loader": finetuning_loader(
                section.train_split,
                hf_name=hf_name,
                train=True,
                workers=w,
                preprocessing_fn=fn,
                packing_ratio=opts.packing_ratio,
            ),
            "eval_loader": finetuning_loader(
                section.eval_split,
                hf_name=hf_name,
                train=False,
                workers=w,
                preprocessing_fn=fn,
                packing_ratio=opts.packing_ratio,
            ),
        }
        if opts.tokenizer:
            out["tokenizer"] = tokenizer_section(opts.tokenizer)
        return out

    def prepare_data(self, section: DictConfig, out: str, source: str | None, splits: list[str]) -> list[str]:
        from hpc_llm.data import prepare

        opts = self.options(section)
        name = source or opts.hf_name
        if not name:
            raise ConfigError("nothing to prepare: set data.options.hf_name or pass --source DIR")
        return prepare.finetuning_to_jsonl(
            out, name, splits or [section.train_split, section.eval_split], opts.prompt_column, opts.response_column
        )


@hookimpl
def hpc_llm_register_data_sources(register) -> None:
    register(TinyCorpus())
    register(LocalMds())
    register(RemoteMds())
    register(C4())
    register(Finetuning())
    register(FromYaml())
