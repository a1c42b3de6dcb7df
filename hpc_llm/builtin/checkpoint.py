"""Built-in checkpoint backends: a shared-filesystem folder, an object-store URI.

Both map to Composer's ``save_folder`` / ``save_interval`` / ``autoresume``. Composer uploads
to s3/gs/oci/azure/dbfs itself (its RemoteUploader); for ``s3://`` the ``uri`` backend also
does what hpc_llm does around a folder's checkpoints (a folder per run, whose checkpoints a
folder holds, keep-last-K, unfinished saves set aside, ``latest`` linked by the stop that saved
it): the in-job half is :mod:`hpc_llm.job.rank.checkpoint_store`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig

from hpc_llm import hookimpl
from hpc_llm.config import stores
from hpc_llm.config.plan import JobPlan
from hpc_llm.errors import ConfigError, warn_once
from hpc_llm.paths import size_bytes
from hpc_llm.plugins.base import CheckpointBackend, HostPath
from hpc_llm.rundir.layout import CHECKPOINT_NAME, LATEST, LATEST_SHARDED, RunDir, unfinished_checkpoints

if TYPE_CHECKING:
    from hpc_llm.job.rank.context import JobContext

# Object stores Composer's checkpoint saver uploads to and autoresume reads from, by URI
# (composer.utils.remote_uploader, file_helpers.maybe_create_object_store_from_uri; its uploader
# refuses sftp, and libcloud needs settings a URI cannot carry). dbfs is written dbfs:/Volumes/...
URI_SCHEMES = ("s3", "gs", "oci", "azure", "dbfs")

log = logging.getLogger(__name__)


def _common(section: DictConfig) -> dict[str, Any]:
    out: dict[str, Any] = {
        "save_interval": section.interval,
        "save_num_checkpoints_to_keep": section.keep,
        "save_overwrite": False,
        "autoresume": bool(section.autoresume),
    }
    if section.load_path:
        out["load_path"] = section.load_path
    return out


class Folder(CheckpointBackend):
    # any trainer: a folder on the shared filesystem: any trainer saves there
    trainers = None
    name = "folder"
    description = "checkpoints in a folder on the shared filesystem (default <run dir>/checkpoints)"

    def folder(self, section: DictConfig, plan: JobPlan) -> Path:
        return _folder(section, plan.run_dir)

    def prepare(self, section: DictConfig, ctx: JobContext) -> None:
        if section.autoresume:
            folder = _folder(section, ctx.run_dir)
            restore_latest(folder)
            set_aside_unfinished(folder)
            prune(folder, int(section.keep))

    def validate(self, section: DictConfig, plan: JobPlan) -> None:
        super().validate(section, plan)
        if section.location and "://" in str(section.location):
            raise ConfigError(
                f"checkpoint.location={section.location!r} is a URI; use checkpoint=uri for object stores"
            )
        for key, default in (("run_subdir", True), ("resume_other", False)):
            value = section.get(key, default)
            if bool(value) != default:
                raise ConfigError(
                    f"checkpoint.{key}={value} is for object stores (checkpoint=uri); checkpoint=folder keeps "
                    "each run's checkpoints in checkpoint.location as given; allowed: its default, or checkpoint=uri"
                )
        if plan.run_dir is None and not section.location:
            return
        folder = self.folder(section, plan)
        if folder.is_dir() and any(folder.iterdir()) and not section.autoresume:
            raise ConfigError(
                f"checkpoint folder {str(folder)!r} already holds checkpoints; set "
                "checkpoint.autoresume=true to resume from them or choose another checkpoint.location"
            )

    def train_config(self, section: DictConfig, plan: JobPlan) -> dict[str, Any]:
        return {"save_folder": str(self.folder(section, plan)), **_common(section)}

    def host_paths(self, section: DictConfig, plan: JobPlan) -> list[HostPath]:
        paths = super().host_paths(section, plan)
        if section.location:  # the default folder is inside the run dir, which is always there
            folder = str(self.folder(section, plan).resolve())
            paths.append(HostPath(folder, "checkpoint folder", created_by_job=True))
        return paths

    def latest(self, section: DictConfig, plan: JobPlan) -> str | None:
        folder = self.folder(section, plan)
        for name in (LATEST, LATEST_SHARDED):
            link = folder / name
            if link.exists():
                return os.path.realpath(link)
        return None

    def size_bytes(self, section: DictConfig, plan: JobPlan) -> int | None:
        latest = self.latest(section, plan)
        if latest is None:
            return None
        return size_bytes(Path(latest))


def _folder(section: DictConfig, run_dir: str | Path | None) -> Path:
    if section.location:
        return Path(section.location).expanduser()
    if run_dir is None:
        raise ConfigError("checkpoint.location is required when no run directory is known")
    return RunDir(run_dir).checkpoints


def _batch(path: Path) -> int | None:
    m = CHECKPOINT_NAME.match(path.name) or CHECKPOINT_NAME.match(path.parent.name)
    return int(m.group(2)) if m else None


def _complete(path: Path) -> bool:
    """A save that was finished: a sharded one's folder has torch.distributed.checkpoint's
    ``.metadata`` (written last); a ``.pt`` file is a zip (torch.save) that ends with its
    end-of-central-directory record (Composer writes it in place, so a cut-off file lacks it)."""
    if path.is_dir():
        return (path / ".metadata").is_file()
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            f.seek(max(0, size - 65_558))
            return b"PK\x05\x06" in f.read()
    except OSError:
        return False


def _saves(folder: Path) -> dict[int, list[Path]]:
    """batch -> the entries of that save at the folder's top level (a file per rank, or a folder)."""
    out: dict[int, list[Path]] = {}
    for entry in folder.iterdir() if folder.is_dir() else []:
        batch = _batch(entry) if not entry.is_symlink() else None
        if batch is not None:
            out.setdefault(batch, []).append(entry)
    return out


def _latest_batch(folder: Path) -> int | None:
    for name in (LATEST, LATEST_SHARDED):
        if (folder / name).exists():
            return _batch(Path(os.path.realpath(folder / name))) or 0
    return None


def restore_latest(folder: Path) -> Path | None:
    """No ``latest`` link although finished saves are there: Composer replaces the link by
    removing it, then linking anew, and a death in between leaves none (autoresume would then
    train from batch 0). Link the newest finished save again; move nothing."""
    if not folder.is_dir() or _latest_batch(folder) is not None:
        return None
    for batch, entries in sorted(_saves(folder).items(), reverse=True):
        rank0 = next((e for e in entries if e.is_dir() or e.name.endswith("-rank0.pt")), None)
        if rank0 is None or not all(_complete(e) for e in entries):
            continue
        link = folder / (LATEST_SHARDED if rank0.is_dir() else LATEST)
        with contextlib.suppress(FileExistsError):  # another rank linked it
            link.symlink_to(rank0.name)
        log.warning("hpc_llm: no latest checkpoint link in %s; resuming from %s (batch %d)", folder, rank0, batch)
        return link
    return None


def prune(folder: Path, keep: int) -> list[Path]:
    """Keep-last-K over the run's life: Composer's ``save_num_checkpoints_to_keep`` counts only what
    the current process saved (Composer issue #2087), so every attempt would leave up to K behind.
    At each start, finished saves beyond the ``keep`` newest (never the one ``latest`` names) are
    deleted, and ``unfinished/`` keeps only its newest entry."""
    removed: list[Path] = []
    if keep <= 0 or not folder.is_dir():
        return removed
    latest = _latest_batch(folder)
    saves = sorted(_saves(folder).items(), reverse=True)
    kept = 0
    for batch, entries in saves:
        if latest is not None and batch > latest:
            continue  # set aside, not pruned
        if kept < keep or batch == latest:
            kept += 1
            continue
        removed.extend(entries)
    aside = unfinished_checkpoints(folder)
    if aside.is_dir():
        removed.extend(sorted(aside.iterdir(), key=lambda p: p.stat().st_mtime, reverse=True)[1:])
    for path in removed:
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    if removed:
        log.info("hpc_llm: pruned %d old checkpoint file(s) from %s (keep %d)", len(removed), folder, keep)
    return removed


def set_aside_unfinished(folder: Path) -> list[Path]:
    """Move checkpoints newer than the one ``latest`` points at into ``<folder>/unfinished/``.

    Composer moves the ``latest`` link only once a save is written, so a newer file is a
    save the previous attempt did not finish (a node died or SIGTERM came mid-save; seen
    on the dev cluster). The resumed run would recompute those batches and Composer
    refuses to start beside them (FileExistsError "may conflict with a future checkpoint",
    composer.utils.file_helpers), which only looks at the folder's top level. Nothing is
    deleted. Every rank calls this; a file another rank moved first is skipped.
    """
    if not folder.is_dir():
        return []
    found = _latest_batch(folder)
    latest = -1 if found is None else found  # no link (restore_latest found none): no save was finished
    moved = []
    for entry in sorted(folder.iterdir()):
        batch = _batch(entry) if not entry.is_symlink() else None
        if batch is None or batch <= latest:
            continue
        dest_dir = unfinished_checkpoints(folder)
        dest_dir.mkdir(exist_ok=True)
        dest, n = dest_dir / entry.name, 0
        while dest.exists():
            n += 1
            dest = dest_dir / f"{entry.name}.{n}"
        try:
            entry.rename(dest)
        except FileNotFoundError:
            continue  # another rank moved it
        log.warning("hpc_llm: %s is newer than the latest finished checkpoint; moved to %s", entry, dest)
        moved.append(dest)
    return moved


class Uri(CheckpointBackend):
    name = "uri"
    description = "checkpoints in an object store: <location>/<run name> (s3:// managed; gs, oci, azure, dbfs)"
    # torchtitan saves and loads its DCP checkpoints through fsspec itself (s3fs, in its
    # environment): s3:// only, which its trainer checks (hpc_llm.builtin.trainers)
    trainers = ("llmfoundry", "torchtitan")

    def folder(self, section: DictConfig, plan: JobPlan) -> str:
        """The run's checkpoint folder: ``<location>/<run name>`` (``checkpoint.run_subdir``),
        or the location as given (Composer's ``{run_name}`` filled in)."""
        run = RunDir(plan.run_dir).run_name(plan.experiment) if plan.run_dir else None
        return stores.checkpoint_folder(str(section.location), run, bool(section.run_subdir))

    def validate(self, section: DictConfig, plan: JobPlan) -> None:
        super().validate(section, plan)
        location = str(section.location or "")
        scheme = stores.scheme(location)
        if scheme not in URI_SCHEMES or (scheme != "dbfs" and "://" not in location):
            raise ConfigError(
                f"checkpoint.location={location!r}: not an object-store URI Composer can save to; allowed: "
                + ", ".join("dbfs:/Volumes/..." if s == "dbfs" else f"{s}://bucket/path" for s in URI_SCHEMES)
            )
        if location.startswith("s3://") and not location[5:].split("/", 1)[0]:
            raise ConfigError(f"checkpoint.location={location!r}: no bucket; allowed: s3://bucket/path")
        if scheme not in stores.MANAGED:
            warn_once(
                f"checkpoint.location={location!r}: Composer saves and resumes there, but hpc_llm's store checks, "
                "keep-last-K, unfinished saves and the stop's link of latest are for s3:// only"
            )

    def train_config(self, section: DictConfig, plan: JobPlan) -> dict[str, Any]:
        out = {"save_folder": self.folder(section, plan), **_common(section)}
        if stores.scheme(str(section.location)) in stores.MANAGED:
            # Composer keeps K local copies in the node's temp dir (its keep counts only those):
            # each is dropped once staged for upload, and keep-last-K is applied in the store
            out["save_num_checkpoints_to_keep"] = 0
        return out

    def prepare(self, section: DictConfig, ctx: JobContext) -> None:
        from hpc_llm.job.rank import checkpoint_store, store_check

        checkpoint_store.prepare_node(ctx.node_dir, ctx.dist.local_rank)
        if ctx.dist.rank != 0 or stores.scheme(str(section.location)) not in stores.MANAGED:
            return
        # rank 0, before Composer starts: the store check (a store that is down is waited for; a
        # wrong key, a missing bucket is one line), then whose folder it is, unfinished saves, keep
        store_check.wait_for_store("checkpoint.location", self.folder(section, ctx.plan))
        checkpoint_store.start_of_attempt(
            self.folder(section, ctx.plan),
            keep=int(section.keep),
            run=RunDir(ctx.run_dir).run_name(ctx.plan.experiment),
            run_dir=str(ctx.run_dir),
            resume_other=bool(section.resume_other),
        )

    def latest(self, section: DictConfig, plan: JobPlan) -> str | None:
        """The save ``latest`` names, read from the store (s3); else where Composer's link is."""
        folder = self.folder(section, plan)
        if stores.scheme(folder) not in stores.MANAGED:
            return f"{folder}/{LATEST}"
        from hpc_llm.job.rank import checkpoint_store

        return checkpoint_store.latest_uri(folder)

    def size_bytes(self, section: DictConfig, plan: JobPlan) -> int | None:
        folder = self.folder(section, plan)
        if stores.scheme(folder) not in stores.MANAGED:
            return None
        from hpc_llm.job.rank import checkpoint_store

        return checkpoint_store.latest_bytes(folder)


@hookimpl
def hpc_llm_register_checkpoint_backends(register) -> None:
    register(Folder())
    register(Uri())
