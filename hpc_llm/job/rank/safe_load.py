"""Checkpoints that cannot run code: every pickle a resume or ``load_path`` reads is restricted
(docs/upstream-fixes.md, upstream fixes 21 and 22; in-job only).

A checkpoint is a pickle, and unpickling calls whatever the pickle names: Composer 0.32 loads a
monolithic checkpoint with ``torch.load(weights_only=False)``, and a sharded one goes through
torch DCP, which reads ``.metadata`` with ``pickle.load`` and every non-tensor entry with
``torch.load(weights_only=False)``. Tried here: a ``checkpoint.load_path`` whose pickle ran
``touch`` ran it. Here every one of those reads allows only what a checkpoint holds:

* ``torch.load(weights_only=True)`` (tensors, containers, numbers, strings) plus
  :func:`allowed_globals`: the types a Composer state holds beyond those (a ``timedelta`` in its
  timestamp, NumPy's RNG state, the torch version), as Composer's own fix does (its PR #3937,
  April 2026, never released);
* for DCP's ``.metadata``, :class:`MetadataUnpickler`: DCP's own metadata classes, torch's
  ``Size``, dtypes and layouts, and paths; the list was read off real ``.metadata`` files.

Anything else is refused before it is called, with :class:`UnsafeCheckpoint`: one line naming
the file and what it tried to load. Hand-written because no well-kept library restricts these
reads for Composer 0.32 and torch 2.7.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import io
import pickle
import re
import warnings
from collections.abc import Callable
from pathlib import PurePath
from typing import Any


class UnsafeCheckpoint(pickle.UnpicklingError):
    """A checkpoint whose pickle names something no checkpoint holds: refused, nothing called."""

    def __init__(self, where: str, what: str) -> None:
        self.where, self.what = where, what
        super().__init__(
            f"refused to load {where}: it names {what}, which no checkpoint holds (a pickle that would run "
            "code); allowed: tensors, containers, numbers, strings and the types Composer and torch DCP save"
        )


@functools.cache
def allowed_globals() -> list[Any]:
    """Beyond torch's own weights-only set: what a Composer checkpoint holds (read off real ones:
    ``datetime.timedelta``, NumPy arrays and dtypes, ``TorchVersion``)."""
    import datetime

    import numpy as np
    from torch.torch_version import TorchVersion

    out: list[Any] = [datetime.timedelta, np.ndarray, np.dtype, TorchVersion]
    out += [t for t in vars(getattr(np, "dtypes", object)).values() if isinstance(t, type) and issubclass(t, np.dtype)]
    for module in ("numpy._core.multiarray", "numpy.core.multiarray"):  # NumPy 2's name, then 1's
        with contextlib.suppress(ImportError, AttributeError), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # numpy.core is deprecated in NumPy 2
            out.append(importlib.import_module(module)._reconstruct)
    return out


def _what(exc: BaseException) -> str:
    """The global a weights-only load refused, from torch's message."""
    # torch 2.7: "Unsupported global: GLOBAL posix.system was not an allowed global by default",
    # or "Trying to load unsupported GLOBAL posix.system whose module posix is blocked"
    found = re.search(r"GLOBAL ([\w.]+)", str(exc))
    lines = [ln for ln in str(exc).splitlines() if ln.strip()]
    return found.group(1) if found else (lines[-1][:200] if lines else type(exc).__name__)


def unwrap(exc: BaseException) -> BaseException:
    """The :class:`UnsafeCheckpoint` inside torch DCP's ``CheckpointException`` (which carries every
    rank's exception and traceback in its message), else ``exc``: the refusal stays one line."""
    # CheckpointException.failures: rank -> (its exception, its traceback)
    by_rank = getattr(exc, "failures", None) or {}
    for wrapped in by_rank.values():
        inner = wrapped[0] if isinstance(wrapped, tuple) else wrapped
        if isinstance(inner, UnsafeCheckpoint):
            return inner
    return exc


def named(path: str, refused: UnsafeCheckpoint) -> UnsafeCheckpoint:
    """``refused`` naming the checkpoint the run was given (``path``: a ``load_path``, a store's
    URI, the folder autoresume found) beside the local copy Composer read."""
    if refused.where == path or refused.where.startswith(f"{path}/") or refused.where.startswith(f"{path} "):
        return refused
    return UnsafeCheckpoint(f"{path} (read from {refused.where})", refused.what)


def torch_load(source: Any, where: str, map_location: Any = None) -> Any:
    """``torch.load`` of a checkpoint, weights only, with :func:`allowed_globals`."""
    import torch

    try:
        with torch.serialization.safe_globals(allowed_globals()):
            return torch.load(source, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:
        raise UnsafeCheckpoint(where, _what(exc)) from None


class MetadataUnpickler(pickle.Unpickler):
    """DCP's ``.metadata``: only DCP's metadata classes, torch's Size, dtypes and layouts, paths."""

    def __init__(self, file: Any, where: str) -> None:
        super().__init__(file)
        self.where = where

    def find_class(self, module: str, name: str) -> Any:
        import torch

        found = super().find_class(module, name) if _metadata_global(module, name) else None
        ok = found is not None and (
            (module != "torch" or name == "Size" or isinstance(found, torch.dtype))
            # DCP's modules: only what they define (not a name they import)
            and (not module.startswith("torch.distributed.") or getattr(found, "__module__", None) == module)
        )
        if not ok:
            raise UnsafeCheckpoint(self.where, f"{module}.{name}")
        return found


def _metadata_global(module: str, name: str) -> bool:
    if module in ("torch.distributed.checkpoint.metadata", "torch.distributed.checkpoint.filesystem"):
        return not name.startswith("__") and (name[:1].isupper() or name in ("_StorageInfo", "_MEM_FORMAT_ENCODING"))
    if module == "torch":
        return True  # Size or a dtype only: checked on the object (find_class)
    if module == "torch.serialization":
        return name == "_get_layout"
    if module in ("pathlib", "collections"):
        return name in ("PosixPath", "PurePosixPath", "OrderedDict")
    return False


def read_metadata(path: PurePath | str, stream: Any) -> Any:
    """DCP's ``.metadata`` at ``path``, from the open ``stream``, unpickled under :class:`MetadataUnpickler`."""
    return MetadataUnpickler(stream, str(path)).load()


def load_bytes(value: io.BytesIO, where: str) -> Any:
    """A DCP non-tensor entry (a Composer timestamp, RNG state, run name)."""
    return torch_load(value, where)


def patch_dcp_reads(metadata_path: Callable[[Any, dict[str, Any]], Any]) -> None:
    """torch DCP's two unpickling reads through this module: ``FileSystemReader.read_metadata``
    (``.metadata``) and ``DefaultLoadPlanner.load_bytes`` (every non-tensor entry). The bodies
    around them are torch's own, which torch 2.7 (LLM Foundry's) and 2.14 (torchtitan's) share
    but for how the reader names ``.metadata``: ``metadata_path(reader, kwargs)`` says.

    Both are methods of the classes every reader and planner derives from (Composer's
    ``FileSystemReaderWithValidation`` calls the base ``read_metadata``)."""
    from torch.distributed.checkpoint import default_planner, filesystem
    from torch.distributed.checkpoint._traverse import set_element
    from torch.distributed.checkpoint.metadata import StorageMeta

    reading = [""]

    def reader_metadata(self: Any, *args: Any, **kwargs: Any) -> Any:
        path = metadata_path(self, kwargs)
        reading[0] = str(self.path)
        with self.fs.create_stream(path, "rb") as metadata_file:
            metadata = read_metadata(path, metadata_file)
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata

    def load_entry(self: Any, read_item: Any, value: Any) -> None:
        fqn = read_item.dest_index.fqn
        obj = load_bytes(value, f"{reading[0] or 'a sharded checkpoint'} (its entry {fqn})")
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[fqn], obj)
        else:
            self.state_dict[fqn] = obj

    filesystem.FileSystemReader.read_metadata = reader_metadata  # type: ignore[method-assign]
    default_planner.DefaultLoadPlanner.load_bytes = load_entry  # type: ignore[method-assign]
