"""Object stores a job uses, as the login side sees them (pure: no boto3, no training stack).

- :data:`CLIENT_VARIABLES`: the environment variables each store's clients read (Composer's
  object stores, Streaming's downloaders, boto3 itself); a job whose data or checkpoints
  use a store gets them exported to its ranks by name (:func:`client_variables`), whatever
  the cluster profile passes.
- :func:`checkpoint_folder`: where a run's checkpoints live in a store, by default
  ``<checkpoint.location>/<run name>`` (two runs never share one by accident).
- :func:`targets` and :func:`check_before_submit`: what the store check asks of each store
  (credentials, bucket, the data's index files, whose checkpoints a folder holds), run before
  anything is submitted in a subprocess of the job's own Python
  (``python -m hpc_llm.job.rank.store_check``): boto3 belongs to the job's environment, and
  the login process never imports it.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator, Sequence
from typing import Any

from omegaconf import DictConfig, OmegaConf

from hpc_llm.errors import ConfigError
from hpc_llm.rundir.layout import RunDir

#: what each store's clients read from the environment. S3: boto3's own variables (keys, session
#: token, profile and its files, region, endpoint, CA bundle, retries, web identity), plus
#: ``S3_ENDPOINT_URL``, which Composer's S3ObjectStore and Streaming's S3 downloader read, and
#: Composer's ``S3_CANNED_ACL``. The others as Composer and Streaming read them.
CLIENT_VARIABLES: dict[str, tuple[str, ...]] = {
    "s3": (
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AWS_PROFILE",
        "AWS_CONFIG_FILE",
        "AWS_SHARED_CREDENTIALS_FILE",
        "AWS_DEFAULT_REGION",
        "AWS_REGION",
        "AWS_ENDPOINT_URL",
        "AWS_ENDPOINT_URL_S3",
        "S3_ENDPOINT_URL",
        "AWS_CA_BUNDLE",
        "AWS_MAX_ATTEMPTS",
        "AWS_RETRY_MODE",
        "AWS_ROLE_ARN",
        "AWS_WEB_IDENTITY_TOKEN_FILE",
        "AWS_ROLE_SESSION_NAME",
        "S3_CANNED_ACL",
    ),
    "gs": ("GOOGLE_APPLICATION_CREDENTIALS", "GCS_KEY", "GCS_SECRET"),
    "oci": ("OCI_CONFIG_FILE", "OCI_CLI_PROFILE"),
    "azure": ("AZURE_ACCOUNT_NAME", "AZURE_ACCOUNT_ACCESS_KEY"),
    "azure-dl": ("AZURE_ACCOUNT_NAME", "AZURE_ACCOUNT_ACCESS_KEY"),
    "dbfs": ("DATABRICKS_HOST", "DATABRICKS_TOKEN"),
    "hf": ("HF_TOKEN",),
}
#: the stores hpc_llm checks before submitting and manages checkpoints in (the rest: Composer's own)
MANAGED = ("s3",)

_URI = re.compile(r"^(?P<scheme>[a-z][a-z0-9+.-]*):/")


def scheme(value: Any) -> str | None:
    """The store scheme of a URI (``s3://b/x`` -> s3, ``dbfs:/Volumes/..`` -> dbfs); None for a path."""
    m = _URI.match(str(value)) if isinstance(value, str) else None
    return m["scheme"] if m and m["scheme"] in CLIENT_VARIABLES else None


def _strings(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for v in node.values():
            yield from _strings(v)
    elif isinstance(node, list):
        for v in node:
            yield from _strings(v)
    elif isinstance(node, str):
        yield node


def schemes_used(cfg: DictConfig) -> set[str]:
    """Every store scheme named in the job's data, checkpoint and train sections (a yaml's
    loaders and save_folder included)."""
    found: set[str] = set()
    for key in ("data", "checkpoint", "train"):
        node = OmegaConf.select(cfg, key, default=None)
        if node is None:
            continue
        for text in _strings(OmegaConf.to_container(node, resolve=False)):
            s = scheme(text)
            if s is not None:
                found.add(s)
    return found


def client_variables(cfg: DictConfig) -> list[str]:
    """The variables the job's store clients read, to pass to its ranks by name."""
    return sorted({v for s in schemes_used(cfg) for v in CLIENT_VARIABLES[s]})


# -- where a run's checkpoints live in a store ----------------------------------------------------

#: Composer's placeholder for the run name in a save_folder (a yaml's ``s3://b/{run_name}/ckpt``)
RUN_NAME = "{run_name}"


def checkpoint_folder(location: str, run_name: str | None, run_subdir: bool) -> str:
    """``<location>/<run name>`` (``run_subdir``), ``location`` with Composer's ``{run_name}``
    filled in, or ``location`` as it is."""
    base = str(location).rstrip("/")
    if RUN_NAME in base:
        return base.replace(RUN_NAME, run_name) if run_name else base
    if run_subdir and run_name:
        return f"{base}/{run_name}"
    return base


def run_name_of(cfg: DictConfig, run_dir: str | None) -> str | None:
    return RunDir(run_dir).run_name(str(cfg.experiment)) if run_dir else None


# -- the store check, in the job's environment ----------------------------------------------------


def targets(cfg: DictConfig, run_dir: str | None) -> list[dict[str, Any]]:
    """What the store check asks of each store the job uses (managed schemes only): for a
    checkpoint folder, the run it is for; for data, the MDS splits whose index it reads."""
    out: list[dict[str, Any]] = []
    ck = cfg.checkpoint
    if ck.name == "uri" and ck.location and scheme(str(ck.location)) in MANAGED:
        run = run_name_of(cfg, run_dir)
        folder = checkpoint_folder(str(ck.location), run, bool(ck.run_subdir))
        # a folder named after this run is new by construction: asking whose checkpoints it
        # holds can wait for the job's start, and every point of a sweep asks the same of the
        # location (credentials, bucket, writes), once
        fresh = run is not None and folder != checkpoint_folder(str(ck.location), None, bool(ck.run_subdir))
        out.append(
            {
                "key": "checkpoint.location",
                "uri": str(ck.location).rstrip("/") if fresh else folder,
                "role": "checkpoint_folder",
                "owner": None if fresh else run,
                "resume_other": bool(ck.resume_other),
            }
        )
    if ck.load_path and scheme(str(ck.load_path)) in MANAGED:
        out.append({"key": "checkpoint.load_path", "uri": str(ck.load_path), "role": "object"})
    data = cfg.data
    if data.get("remote") and scheme(str(data.remote)) in MANAGED:
        splits = [str(data.train_split)]
        if "heldout" in cfg.eval.evaluators and data.eval_split not in splits:
            splits.append(str(data.eval_split))
        out.append({"key": "data.remote", "uri": str(data.remote), "role": "data", "splits": splits})
    train = OmegaConf.to_container(cfg.train, resolve=False) if cfg.get("train") is not None else {}
    for loader in ("train_loader", "eval_loader"):
        dataset = ((train or {}).get(loader) or {}).get("dataset") or {}  # type: ignore[union-attr]
        remote = dataset.get("remote") if isinstance(dataset, dict) else None
        if isinstance(remote, str) and scheme(remote) in MANAGED and "${" not in remote:
            split = dataset.get("split")
            key = f"train.{loader}.dataset.remote"
            out.append({"key": key, "uri": remote, "role": "data", "splits": [split] if split else []})
    return out


def check_key(target: dict[str, Any]) -> str:
    """Targets that are the same question have the same answer."""
    return json.dumps(target, sort_keys=True)


def check_in_job_env(python: Sequence[str], checks: list[dict[str, Any]], timeout_s: float = 120) -> list[str]:
    """Run the store check in the job's Python; its problems, one line each."""
    if not checks:
        return []
    cmd = [*python, "-m", "hpc_llm.job.rank.store_check", json.dumps({"targets": checks})]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return [f"the store check ({' '.join(cmd[:3])} ...) did not answer within {timeout_s:.0f} s"]
    except OSError as exc:
        return [f"the store check could not start the job's Python {python[0]!r}: {exc.strerror}"]
    problems = [line.split("\t", 1)[1] for line in out.stdout.splitlines() if line.startswith("fail\t")]
    if out.returncode != 0 and not problems:
        last = (out.stderr.strip().splitlines() or [f"exit status {out.returncode}"])[-1]
        problems.append(f"the store check failed in the job's Python ({last})")
    return problems


class StoreVerdicts:
    """The store check before submitting, asked once per distinct question of a sweep."""

    def __init__(self) -> None:
        self._answers: dict[str, list[str]] = {}
        #: checkpoint folder -> the job of this sweep that writes it
        self._folders: dict[str, object] = {}

    def check_sweep(self, cfg: DictConfig, run_dir: str | None) -> None:
        """Two jobs of one sweep never share a checkpoint folder (pure: a config error, also in a
        dry run)."""
        ck = cfg.checkpoint
        if ck.name == "uri" and ck.location:
            folder = checkpoint_folder(str(ck.location), run_name_of(cfg, run_dir), bool(ck.run_subdir))
            num = OmegaConf.select(cfg, "hydra.job.num", default=None)
            other = self._folders.setdefault(folder, num)
            if other != num:
                raise ConfigError(
                    f"checkpoint.location={ck.location!r}: jobs {other} and {num} of this sweep would write "
                    f"their checkpoints to one folder ({folder}); allowed: checkpoint.run_subdir=true (a folder "
                    "per run); nothing was submitted"
                )

    def check(self, cfg: DictConfig, run_dir: str | None, python: Sequence[str]) -> None:
        """The job's stores, asked from its Python (each distinct question once per sweep)."""
        todo = []
        for t in targets(cfg, run_dir):
            key = check_key(t)
            if key not in self._answers:
                todo.append((key, t))
        if todo:
            problems = check_in_job_env(python, [t for _k, t in todo])
            for key, t in todo:
                self._answers[key] = [p for p in problems if p.startswith(f"{t['key']}=")] or []
            unplaced = [p for p in problems if not any(p in self._answers[k] for k, _t in todo)]
            if unplaced:
                raise ConfigError(f"{unplaced[0]}; nothing was submitted")
        for t in targets(cfg, run_dir):
            found = self._answers.get(check_key(t)) or []
            if found:
                raise ConfigError(f"{found[0]}; nothing was submitted")
