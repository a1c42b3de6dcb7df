"""``hpc-llm model fetch ID --out DIR``: a Hugging Face hub model's weights, config and
tokenizer into a local directory the compute nodes read.

Compute nodes of most clusters cannot reach the hub, so an ``hf_causal_lm`` yaml points
``model.pretrained_model_name_or_path`` and ``tokenizer.name`` at a directory. This runs
where the hub is reachable (a login or transfer node) and fills that directory with
exactly what ``transformers`` reads: pinned to one commit, weights as safetensors when the
repo has them (``*.bin`` only when it has none), no ``original/`` consolidated checkpoints
(Llama repos ship the weights twice), remote code files kept (``trust_remote_code`` models
such as MPT need them). The download is huggingface_hub's own ``snapshot_download`` (its
resumable, parallel, checksummed transfer): what is written here is the choice of files,
the all-or-nothing directory and the one-line errors.

Nothing existing is overwritten: the files land in ``DIR.partial`` (kept across an
interrupted fetch, so a retry resumes) and the directory is renamed to ``DIR`` only when
complete. ``DIR/hpc_llm_fetch.json`` records the repo, the commit and the files.
No torch: runs on a login node with only ``huggingface_hub`` installed.
"""

from __future__ import annotations

import fnmatch
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from hpc_llm.errors import ConfigError

#: what transformers reads from a model repo (config, weights, tokenizer, remote code)
WANTED = [
    "*.json",
    "*.safetensors",
    "*.py",
    "tokenizer.model",
    "*.tiktoken",
    "*.txt",
]
#: the weights of a repo without safetensors
LEGACY_WEIGHTS = ["*.bin"]
#: copies of the weights for other frameworks (original/consolidated.*.pth of Llama repos)
SKIPPED = ["original/*", "*.pth", "*.msgpack", "*.h5", "*.onnx", "*.gguf"]
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "tiktoken.model")
RECORD = "hpc_llm_fetch.json"


@dataclass(frozen=True)
class Fetched:
    repo_id: str
    commit: str
    out: Path
    files: list[str]
    bytes: int
    has_tokenizer: bool


def choose_files(repo_files: list[str]) -> list[str]:
    """The files of a repo listing that a local ``hf_causal_lm`` needs (see module doc)."""
    wanted = list(WANTED)
    if not any(f.endswith(".safetensors") for f in repo_files):
        wanted += LEGACY_WEIGHTS
    return sorted(
        f
        for f in repo_files
        if any(fnmatch.fnmatch(f, p) for p in wanted) and not any(fnmatch.fnmatch(f, p) for p in SKIPPED)
    )


def _hub():
    try:
        import huggingface_hub
    except ImportError:
        raise ConfigError(
            "hpc-llm model fetch needs huggingface_hub; install it with: pip install huggingface_hub"
        ) from None
    return huggingface_hub


def _one_line(exc: Exception, repo_id: str, revision: str | None) -> ConfigError:
    """huggingface_hub's errors (multi-line, with request ids) as one line saying what to do."""
    from huggingface_hub import errors

    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    if isinstance(exc, errors.GatedRepoError):
        return ConfigError(
            f"{repo_id} is gated: accept its license on {endpoint}/{repo_id} and log in "
            "(huggingface-cli login, or HF_TOKEN=...), then fetch again"
        )
    if isinstance(exc, errors.RepositoryNotFoundError):
        return ConfigError(f"{repo_id}: no such model on {endpoint} (or it is private: log in with HF_TOKEN=...)")
    if isinstance(exc, errors.RevisionNotFoundError):
        return ConfigError(f"{repo_id}: no revision {revision!r}; allowed: a branch, tag or commit of the repo")
    if isinstance(exc, errors.OfflineModeIsEnabled):
        return ConfigError("HF_HUB_OFFLINE is set: hpc-llm model fetch downloads from the hub; unset it")
    import requests

    if isinstance(exc, requests.ConnectionError):
        first = "could not connect"
    else:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
    return ConfigError(
        f"the hub ({endpoint}) did not answer for {repo_id}: {first}; run hpc-llm model fetch on a machine "
        "that reaches it (a login or transfer node), then point the yaml at --out"
    )


def _drop_if_empty(partial: Path) -> None:
    import shutil

    if partial.is_dir() and not any(p.is_file() and ".cache" not in p.parts for p in partial.rglob("*")):
        shutil.rmtree(partial)


def fetch(repo_id: str, out: str | Path, revision: str | None = None, token: str | None = None) -> Fetched:
    """Download ``repo_id`` (at ``revision``: a branch, tag or commit; default main) into
    ``out``, which must not exist yet."""
    out = Path(out).expanduser().resolve()
    if out.exists():
        raise ConfigError(f"--out {out} exists already; remove it or choose another --out (nothing is overwritten)")
    hub = _hub()
    api = hub.HfApi(token=token)
    partial = out.with_name(out.name + ".partial")
    try:
        info = api.model_info(repo_id, revision=revision)
        assert info.sha and info.siblings is not None, "the hub's answer has no commit or file list"
        files = choose_files([s.rfilename for s in info.siblings])
        if not any(f == "config.json" for f in files):
            raise ConfigError(f"{repo_id} has no config.json: not a transformers model; allowed: a model repo")
        hub.snapshot_download(repo_id, revision=info.sha, local_dir=partial, allow_patterns=files, token=token)
    except Exception as exc:  # noqa: BLE001  (huggingface_hub and requests errors: one line each)
        _drop_if_empty(partial)  # a fetch that got files keeps them: the next one resumes
        raise exc if isinstance(exc, ConfigError) else _one_line(exc, repo_id, revision) from None
    missing = [f for f in files if not (partial / f).is_file()]
    if missing:
        raise ConfigError(f"{repo_id}: {len(missing)} files did not arrive ({missing[0]}, ...); fetch again to resume")
    size = sum((partial / f).stat().st_size for f in files)
    record = {
        "repo_id": repo_id,
        "revision": revision or "main",
        "commit": info.sha,
        "endpoint": os.environ.get("HF_ENDPOINT", "https://huggingface.co"),
        "files": files,
        "bytes": size,
        "fetched_at": time.time(),
    }
    (partial / RECORD).write_text(json.dumps(record, indent=2) + "\n")
    # huggingface_hub keeps its download metadata in <local_dir>/.cache: not part of the model
    cache = partial / ".cache"
    if cache.is_dir():
        import shutil

        shutil.rmtree(cache)
    partial.rename(out)
    has_tokenizer = any(Path(f).name in TOKENIZER_FILES for f in files)
    return Fetched(repo_id, info.sha, out, files, size, has_tokenizer)


def summary(f: Fetched) -> str:
    lines = [
        f"fetched {f.repo_id} at {f.commit[:12]} into {f.out}: {len(f.files)} files, {f.bytes / 2**30:.2f} GiB",
        "in your LLM Foundry yaml (or as train.* overrides):",
        f"  model.pretrained_model_name_or_path: {f.out}",
    ]
    if f.has_tokenizer:
        lines.append(f"  tokenizer.name: {f.out}")
    else:
        lines.append("  (the repo has no tokenizer files: set tokenizer.name to a local tokenizer directory)")
    return "\n".join(lines) + "\n"
