"""Checkpoints that cannot run code: every pickle a resume or ``load_path`` reads resolves only an
exact list of ``(module, name)`` pairs (docs/upstream-fixes.md, upstream fixes 21, 22, 25 to 27;
the inventory of every site: docs/reference/unpickling.md; in-job only).

A checkpoint is a pickle, and unpickling calls whatever the pickle names: Composer 0.32 loads a
monolithic checkpoint with ``torch.load(weights_only=False)``; torch DCP reads ``.metadata`` with
``pickle.load`` and every non-tensor entry with ``torch.load(weights_only=False)``; torchtitan
unpickles its dataloader's state from bytes in the checkpoint with ``pickle.loads``. Tried here:
each of them ran ``touch`` from a planted file. Here every one of those reads resolves only the
pairs written out below, exactly: no rule by spelling or by ``__module__`` (a guard of "what looks
harmless" let ``FileSystem.rm_file``, a dotted name whose ``__module__`` is DCP's, delete a file):

* a ``torch.save`` file or entry (a Composer checkpoint, a DCP entry, a DCP tensor): torch's own
  weights-only unpickler, with exactly :data:`ENTRY_GLOBALS` beyond torch's own list
  (:func:`torch_load`; whatever else the process registered with ``add_safe_globals`` is set
  aside for the load);
* a plain pickle (DCP's ``.metadata``, torchtitan's dataloader state): :class:`Restricted`, with
  :data:`METADATA_GLOBALS` or :data:`DATALOADER_GLOBALS`. Hand-written because torch's
  weights-only unpickler reads protocol 2 only (``.metadata`` and the dataloader state are
  protocol 4: ``FRAME``, ``STACK_GLOBAL``, ``MEMOIZE``), and the standard ``Unpickler`` leaves
  ``BUILD`` free to set attributes on any object, a class included;
* Composer's ``state.algorithms``, a repr that Composer ``eval``s (:func:`check_algorithms`).

Anything else is refused before it is called, with :class:`UnsafeCheckpoint`: one line naming
the file (or object-store key) and the global, opcode or expression it tried.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import importlib
import io
import pickle
import pickletools
import re
import warnings
import zipfile
from collections import OrderedDict
from collections.abc import Callable, Iterator
from pathlib import PurePath
from typing import IO, Any

#: DCP's ``.metadata``, read off real ones (torch 2.7 and 2.14: Composer's sharded saves and
#: torchtitan's): DCP's metadata classes, torch's ``Size``, dtypes and layouts, a path (the
#: checkpoint id), ``OrderedDict``
METADATA_GLOBALS: frozenset[tuple[str, str]] = frozenset(
    {
        ("torch.distributed.checkpoint.metadata", "Metadata"),
        ("torch.distributed.checkpoint.metadata", "MetadataIndex"),
        ("torch.distributed.checkpoint.metadata", "StorageMeta"),
        ("torch.distributed.checkpoint.metadata", "TensorStorageMetadata"),
        ("torch.distributed.checkpoint.metadata", "BytesStorageMetadata"),
        ("torch.distributed.checkpoint.metadata", "ChunkStorageMetadata"),
        ("torch.distributed.checkpoint.metadata", "TensorProperties"),
        ("torch.distributed.checkpoint.metadata", "_MEM_FORMAT_ENCODING"),
        ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
        ("torch.serialization", "_get_layout"),
        ("torch", "Size"),
        ("collections", "OrderedDict"),
        ("pathlib", "PosixPath"),
        ("pathlib", "PurePosixPath"),
    }
    | {
        ("torch", dtype)
        for dtype in (
            "bool",
            "uint8",
            "uint16",
            "uint32",
            "uint64",
            "int8",
            "int16",
            "int32",
            "int64",
            "float16",
            "bfloat16",
            "float32",
            "float64",
            "complex32",
            "complex64",
            "complex128",
            "float8_e4m3fn",
            "float8_e4m3fnuz",
            "float8_e5m2",
            "float8_e5m2fnuz",
            "float8_e8m0fnu",
            "float4_e2m1fn_x2",
            "qint8",
            "quint8",
            "qint32",
            "quint4x2",
            "quint2x4",
        )
    }
)

#: torchtitan's dataloader state (torchdata's ``StatefulDataLoader.state_dict()``, pickled by
#: torchtitan): dicts, lists, numbers, strings and ``None`` alone, no global at all
DATALOADER_GLOBALS: frozenset[tuple[str, str]] = frozenset()

#: beyond torch's own weights-only list, what a Composer state holds (read off real ones: its
#: timestamp's ``timedelta``, NumPy's RNG state, the torch version), the list Composer's own fix
#: uses (its PR #3937, April 2026, never released). NumPy 1 and 2 name ``_reconstruct`` apart.
ENTRY_GLOBALS: frozenset[tuple[str, str]] = frozenset(
    {
        ("datetime", "timedelta"),
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy.core.multiarray", "_reconstruct"),
        ("torch.torch_version", "TorchVersion"),
    }
    # a NumPy dtype's state is set on an instance of its class (BUILD): the numeric ones
    | {
        ("numpy.dtypes", f"{kind}DType")
        for kind in (
            "Bool",
            "Int8",
            "UInt8",
            "Int16",
            "UInt16",
            "Int32",
            "UInt32",
            "Int64",
            "UInt64",
            "LongLong",
            "ULongLong",
            "Float16",
            "Float32",
            "Float64",
            "Complex64",
            "Complex128",
        )
    }
)

#: Composer's resumption file (``composer.checkpoint.load``, a plain pickle): its timestamp
RESUMPTION_GLOBALS: frozenset[tuple[str, str]] = frozenset({("datetime", "timedelta")})

#: where to read the exact lists from, named in every refusal
LISTS = "docs/reference/unpickling.md"


#: the last refusal made in this process: torch 2.14's DCP load catches a refused ``.metadata``,
#: tries the rank's own, and raises an ``AssertionError`` carrying the refusal's text only
_refusals: list[UnsafeCheckpoint] = []


class UnsafeCheckpoint(pickle.UnpicklingError):
    """A checkpoint that names something outside the exact list: refused, nothing called."""

    def __init__(self, where: str, what: str, vehicle: str = "a pickle") -> None:
        self.where, self.what, self.vehicle = where, what, vehicle
        _refusals[:] = [self]
        super().__init__(
            f"refused to load {where}: it names {what}, which no checkpoint holds ({vehicle} that would run "
            f"code); allowed: tensors, containers, numbers, strings and the exact list of {LISTS}"
        )


def _resolve(module: str, name: str) -> Any:
    """The object a listed pair names (the only place a name from a pickle is looked up)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # numpy.core is deprecated in NumPy 2
        return getattr(importlib.import_module(module), name)


def _resolved(pairs: frozenset[tuple[str, str]]) -> dict[tuple[str, str], Any]:
    """The listed pairs this environment has (a dtype or a NumPy name another version lacks is left out)."""
    out: dict[tuple[str, str], Any] = {}
    for module, name in sorted(pairs):
        with contextlib.suppress(ImportError, AttributeError):
            out[(module, name)] = _resolve(module, name)
    return out


# -- torch.save files and entries: torch's own weights-only unpickler, with an exact list ---------


@functools.cache
def allowed_globals() -> list[tuple[Any, str]]:
    """:data:`ENTRY_GLOBALS` as ``torch.serialization.safe_globals`` takes them: ``(object, its
    full name)``, so a name is matched as written (NumPy 1's ``numpy.core`` too)."""
    return [(obj, f"{module}.{name}") for (module, name), obj in _resolved(ENTRY_GLOBALS).items()]


@contextlib.contextmanager
def exact_globals(extra: list[Any]) -> Iterator[None]:
    """torch's weights-only list plus exactly ``extra`` for the load: what this process registered
    with ``add_safe_globals`` (a library, a plugin) is set aside, then put back."""
    from torch import serialization

    before = serialization.get_safe_globals()
    serialization.clear_safe_globals()
    serialization.add_safe_globals(extra)
    try:
        yield
    finally:
        serialization.clear_safe_globals()
        serialization.add_safe_globals(before)


def torch_load(source: Any, where: str, map_location: Any = None) -> Any:
    """``torch.load`` of a checkpoint, weights only, with exactly :data:`ENTRY_GLOBALS` beyond torch's own."""
    import torch

    with exact_globals(allowed_globals()):
        try:
            return torch.load(source, map_location=map_location, weights_only=True)
        except UnsafeCheckpoint:
            raise
        except pickle.UnpicklingError as exc:
            what = _what(exc, source)  # against the list in force
    raise UnsafeCheckpoint(where, what) from None


def load_bytes(value: io.BytesIO, where: str) -> Any:
    """A DCP non-tensor entry (a Composer timestamp, RNG state, run name; torchtitan's train state)."""
    return torch_load(value, where)


def _what(exc: BaseException, source: Any = None) -> str:
    """What a weights-only load refused: the global torch names; else, for an opcode torch 2.x
    does not read (``STACK_GLOBAL``, ``INST``, ``EXT1``...), the global or opcode the pickle holds."""
    # torch: "Unsupported global: GLOBAL posix.system was not an allowed global by default",
    # or "Trying to load unsupported GLOBAL posix.system whose module posix is blocked"
    found = re.search(r"GLOBAL ([\w.]+)", str(exc))
    if found:
        return found.group(1)
    data = _pickle_of(source)
    named = first_refused(data, _torch_allows) if data is not None else None
    if named is not None:
        return named
    lines = [ln for ln in str(exc).splitlines() if ln.strip()]
    return lines[-1][:200] if lines else type(exc).__name__


def _pickle_of(source: Any) -> bytes | None:
    """The pickle inside a ``torch.save`` file or buffer (its ``data.pkl``), for the refusal's words."""
    with contextlib.suppress(Exception):
        if hasattr(source, "getvalue"):
            raw: Any = io.BytesIO(source.getvalue())
        elif isinstance(source, str | PurePath):
            raw = str(source)
        else:
            return None
        with zipfile.ZipFile(raw) as z:
            name = next(n for n in z.namelist() if n.endswith("data.pkl"))
            return z.read(name)
    return None


def _torch_allows(module: str, name: str) -> bool:
    """Whether the weights-only load allowed ``module.name`` (torch's list and the one in force):
    for the refusal's words only, so torch's private list is asked."""
    from torch import _weights_only_unpickler as wo

    full = f"{module}.{name}"
    return full in wo._get_allowed_globals() or full in wo._get_user_allowed_globals()


def first_refused(data: bytes, allowed: Callable[[str, str], bool]) -> str | None:
    """The first global ``data`` names that ``allowed`` refuses (``module.name``), or the first
    opcode that calls code without naming a global (``INST``'s class is a global too); None if
    none. Read with :mod:`pickletools`, calling nothing: for messages only."""
    strings: list[Any] = []
    memo: dict[int, Any] = {}
    with contextlib.suppress(Exception):
        for op, arg, _pos in pickletools.genops(data):
            if op.name in ("SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE"):
                strings.append(arg)
            elif op.name == "MEMOIZE":
                memo[len(memo)] = strings[-1] if strings else None
            elif op.name in ("BINPUT", "LONG_BINPUT", "PUT"):
                memo[int(str(arg))] = strings[-1] if strings else None
            elif op.name in ("BINGET", "LONG_BINGET", "GET"):
                strings.append(memo.get(int(str(arg))))
            elif op.name in ("GLOBAL", "INST"):
                module, name = str(arg).split(" ", 1)
                if not allowed(module, name):
                    return f"{module}.{name}"
            elif op.name == "STACK_GLOBAL" and len(strings) >= 2:
                module, name = str(strings[-2]), str(strings[-1])
                if not allowed(module, name):
                    return f"{module}.{name}"
            elif op.name in ("EXT1", "EXT2", "EXT4", "PERSID", "BINPERSID", "OBJ"):
                return f"the opcode {op.name}"
    return None


# -- plain pickles: an exact list, every opcode that calls code checked ----------------------------


#: what SETITEM(S) may set items in
_DICTS = (dict, OrderedDict)


def _refuse_opcode(name: str) -> Callable[[Restricted], None]:
    def refuse(self: Restricted) -> None:
        raise UnsafeCheckpoint(self.where, f"the opcode {name}")

    return refuse


class _Dispatch(dict[int, Any]):
    """An opcode the pure-Python unpickler does not know is refused, as one line."""

    def __missing__(self, key: int) -> Callable[[Restricted], None]:
        return _refuse_opcode(f"0x{key:02x}")


class Restricted(pickle._Unpickler):
    """A plain pickle that may name only ``allowed``: exact ``(module, name)`` pairs.

    The pure-Python unpickler, so that every opcode that can call code is one of its methods:
    ``GLOBAL``/``STACK_GLOBAL`` resolve a listed pair only (a dotted or unlisted name is refused
    before anything is imported); ``REDUCE`` calls, and ``NEWOBJ``/``NEWOBJ_EX`` make, only what
    they resolved; ``BUILD`` sets state only on an instance of a listed class (never on a class,
    which would change it for the whole process); lists, dicts and sets alone take items;
    ``INST`` (naming what it would call), ``OBJ``, ``EXT1/2/4`` (``copyreg``'s registry) and ``PERSID``/``BINPERSID``
    (``persistent_load``) are refused. The C unpickler leaves ``BUILD`` and item setting
    unchecked; this one is about three times slower: the 9 MB ``.metadata`` of 870 tensors sharded
    64 ways reads in about 3 s instead of 1 s, before the minutes its tensors take."""

    dispatch = _Dispatch()
    # the pure-Python unpickler's own state and helpers, which typeshed does not describe
    stack: list[Any]
    append: Callable[[Any], None]
    readline: Callable[[], bytes]
    pop_mark: Callable[[], list[Any]]

    def __init__(self, file: IO[bytes], where: str, allowed: frozenset[tuple[str, str]]) -> None:
        super().__init__(file)
        self.where = where
        self.allowed = allowed
        #: what this load resolved, by id: the only callables it may call
        self.resolved: dict[int, Any] = {}

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in self.allowed:
            raise UnsafeCheckpoint(self.where, f"{module}.{name}")
        try:
            found = _resolve(module, name)
        except (ImportError, AttributeError):
            raise UnsafeCheckpoint(self.where, f"{module}.{name}") from None
        self.resolved[id(found)] = found
        return found

    def _refuse(self, opcode: str, obj: Any) -> None:
        raise UnsafeCheckpoint(self.where, f"the opcode {opcode} on {type(obj).__name__}")

    def load_reduce(self) -> None:
        stack = self.stack
        args = stack.pop()
        func = stack[-1]
        if self.resolved.get(id(func)) is not func:
            self._refuse("REDUCE", func)
        stack[-1] = func(*args)

    def load_newobj(self) -> None:
        args = self.stack.pop()
        cls = self.stack.pop()
        if self.resolved.get(id(cls)) is not cls or not isinstance(cls, type):
            self._refuse("NEWOBJ", cls)
        self.append(cls.__new__(cls, *args))

    def load_newobj_ex(self) -> None:
        kwargs = self.stack.pop()
        args = self.stack.pop()
        cls = self.stack.pop()
        if self.resolved.get(id(cls)) is not cls or not isinstance(cls, type):
            self._refuse("NEWOBJ_EX", cls)
        self.append(cls.__new__(cls, *args, **kwargs))

    def load_build(self) -> None:
        inst = self.stack[-2]
        kind = type(inst)
        if self.resolved.get(id(kind)) is not kind or kind is type:
            self._refuse("BUILD", inst)
        super().load_build()  # type: ignore[misc]

    def load_append(self) -> None:
        value = self.stack.pop()
        target = self.stack[-1]
        if type(target) is not list:
            self._refuse("APPEND", target)
        target.append(value)

    def load_appends(self) -> None:
        items = self.pop_mark()
        target = self.stack[-1]
        if type(target) is not list:
            self._refuse("APPENDS", target)
        target.extend(items)

    def load_setitem(self) -> None:
        value = self.stack.pop()
        key = self.stack.pop()
        target = self.stack[-1]
        if type(target) not in _DICTS:
            self._refuse("SETITEM", target)
        target[key] = value

    def load_setitems(self) -> None:
        items = self.pop_mark()
        target = self.stack[-1]
        if type(target) not in _DICTS:
            self._refuse("SETITEMS", target)
        for i in range(0, len(items), 2):
            target[items[i]] = items[i + 1]

    def load_inst(self) -> None:
        # protocol 0's call of a class: refused whatever it names, naming it
        module = self.readline()[:-1].decode("ascii", "replace")
        name = self.readline()[:-1].decode("ascii", "replace")
        raise UnsafeCheckpoint(self.where, f"{module}.{name} (the opcode INST)")

    def load_additems(self) -> None:
        items = self.pop_mark()
        target = self.stack[-1]
        if type(target) is not set:
            self._refuse("ADDITEMS", target)
        target.update(items)


def _restricted_dispatch() -> None:
    """:class:`Restricted`'s opcodes: the pure-Python unpickler's, the ones that call code through
    its checked methods above, the ones no checkpoint needs refused."""
    refused = ("OBJ", "EXT1", "EXT2", "EXT4", "PERSID", "BINPERSID", "NEXT_BUFFER", "READONLY_BUFFER")
    checked = {
        "REDUCE": Restricted.load_reduce,
        "NEWOBJ": Restricted.load_newobj,
        "NEWOBJ_EX": Restricted.load_newobj_ex,
        "BUILD": Restricted.load_build,
        "APPEND": Restricted.load_append,
        "APPENDS": Restricted.load_appends,
        "SETITEM": Restricted.load_setitem,
        "SETITEMS": Restricted.load_setitems,
        "ADDITEMS": Restricted.load_additems,
        "INST": Restricted.load_inst,
    }
    for code, method in pickle._Unpickler.dispatch.items():
        name = pickletools.code2op[chr(code)].name  # type: ignore[attr-defined]
        if name in refused:
            Restricted.dispatch[code] = _refuse_opcode(name)
        else:
            Restricted.dispatch[code] = checked.get(name, method)


_restricted_dispatch()


def unpickle(file: IO[bytes] | bytes, where: str, allowed: frozenset[tuple[str, str]]) -> Any:
    """A plain pickle (a file or its bytes) that may name only ``allowed``."""
    stream = io.BytesIO(file) if isinstance(file, bytes | bytearray) else file
    try:
        return Restricted(stream, where, allowed).load()
    except UnsafeCheckpoint:
        raise
    except RecursionError:
        raise UnsafeCheckpoint(where, "a structure nested too deep to read") from None


def read_metadata(path: PurePath | str, stream: Any) -> Any:
    """DCP's ``.metadata`` at ``path``, from the open ``stream``: :data:`METADATA_GLOBALS` only."""
    return unpickle(stream, str(path), METADATA_GLOBALS)


def dataloader_state(data: bytes, where: str) -> Any:
    """torchtitan's dataloader state (bytes from the checkpoint): :data:`DATALOADER_GLOBALS` only."""
    if not isinstance(data, bytes | bytearray):
        raise UnsafeCheckpoint(where, f"a {type(data).__name__} where the dataloader's pickled state belongs")
    return unpickle(bytes(data), where, DATALOADER_GLOBALS)


# -- Composer's algorithms: a repr it evaluates --------------------------------------------------


def check_algorithms(entries: Any, evaluated: Callable[[str], bool]) -> None:
    """Composer 0.32 ``eval``s ``f"algorithms.{repr}"`` for each required-on-load algorithm a
    checkpoint's ``state.algorithms`` names (``State._apply_required_algorithms``): only a call
    of that algorithm class with literal arguments passes, so the eval makes that algorithm and
    does nothing else. ``evaluated(name)``: whether Composer would evaluate this entry's repr."""
    if not isinstance(entries, list):
        return
    for entry in entries:
        name, serialized = entry if isinstance(entry, tuple | list) and len(entry) == 2 else (None, None)
        if not isinstance(name, str) or not evaluated(name):
            continue
        text = serialized.get("repr") if isinstance(serialized, dict) else None
        if not (isinstance(text, str) and _literal_call(f"algorithms.{text}", name)):
            raise UnsafeCheckpoint(
                "", f"the algorithm {name} as {text!r} (state.algorithms)", "an expression Composer evaluates"
            )


def _literal_call(text: str, name: str) -> bool:
    """``text`` is ``algorithms.<name>(<literals>, <key>=<literal>...)`` and nothing else."""
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError):
        return False
    call = tree.body
    if not (
        isinstance(call, ast.Call)
        and isinstance(call.func, ast.Attribute)
        and isinstance(call.func.value, ast.Name)
        and call.func.value.id == "algorithms"
        and call.func.attr == name
    ):
        return False
    values = [*call.args, *(k.value for k in call.keywords)]
    if any(k.arg is None for k in call.keywords) or any(isinstance(a, ast.Starred) for a in call.args):
        return False
    try:
        for value in values:
            ast.literal_eval(value)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False
    return True


# -- the refusal, as the rank reports it ---------------------------------------------------------


def unwrap(exc: BaseException) -> BaseException:
    """The :class:`UnsafeCheckpoint` inside torch DCP's ``CheckpointException`` (which carries every
    rank's exception and traceback in its message), else ``exc``: the refusal stays one line."""
    # CheckpointException.failures: rank -> (its exception, its traceback)
    by_rank = getattr(exc, "failures", None) or {}
    for wrapped in [*by_rank.values(), exc]:
        inner = wrapped[0] if isinstance(wrapped, tuple) else wrapped
        if isinstance(inner, UnsafeCheckpoint):
            return inner
        # a refusal torch caught and wrapped as text (torch 2.14's metadata fallback)
        if _refusals and str(_refusals[0]) in str(inner):
            return _refusals[0]
    return exc


def named(path: str, refused: UnsafeCheckpoint) -> UnsafeCheckpoint:
    """``refused`` naming the checkpoint the run was given (``path``: a ``load_path``, a store's
    URI, the folder autoresume found) beside the local copy Composer read."""
    if not refused.where:
        return UnsafeCheckpoint(path, refused.what, refused.vehicle)
    if refused.where == path or refused.where.startswith(f"{path}/") or refused.where.startswith(f"{path} "):
        return refused
    return UnsafeCheckpoint(f"{path} (read from {refused.where})", refused.what, refused.vehicle)


def _refused_tensor(reader: Any, plan: Any) -> tuple[str, str] | None:
    """The tensor of ``plan`` whose bytes torch refused, and what they name (read again, after the
    refusal, for its words: DCP's ``read_data`` does not say which item it was reading)."""
    with contextlib.suppress(Exception):
        for item in plan.items:
            info = reader.storage_data[item.storage_index]
            with reader.fs.create_stream(reader.fs.concat_path(reader.path, info.relative_path), "rb") as f:
                f.seek(info.offset)
                data = _pickle_of(io.BytesIO(f.read(info.length)))
            what = first_refused(data, _torch_allows) if data is not None else None
            if what is not None:
                return str(item.storage_index.fqn), what
    return None


# -- torch DCP's reads ---------------------------------------------------------------------------

#: the checkpoint DCP is reading in this process (its reader's path): what a refusal of one of its
#: entries names, torchtitan's dataloader state included
_reading = [""]


def reading(entry: str) -> str:
    """``<the checkpoint being read> (its entry <entry>)``."""
    return f"{_reading[0] or 'a sharded checkpoint'} (its entry {entry})"


def patch_dcp_reads(metadata_path: Callable[[Any, dict[str, Any]], Any]) -> None:
    """torch DCP's three unpickling reads through this module: ``FileSystemReader.read_metadata``
    (``.metadata``), ``DefaultLoadPlanner.load_bytes`` (every non-tensor entry) and
    ``FileSystemReader.read_data`` (the tensors: torch's weights-only load already, now with the
    exact list and a refusal in one line). The bodies around them are torch's own, which torch 2.7
    (LLM Foundry's) and 2.14 (torchtitan's) share but for how the reader names ``.metadata``:
    ``metadata_path(reader, kwargs)`` says.

    All are methods of the classes every reader and planner derives from (Composer's
    ``FileSystemReaderWithValidation`` calls the base ``read_metadata``)."""
    from torch.distributed.checkpoint import default_planner, filesystem
    from torch.distributed.checkpoint._traverse import set_element
    from torch.distributed.checkpoint.metadata import StorageMeta

    reader_class = filesystem.FileSystemReader
    if getattr(reader_class.read_metadata, "_hpc_llm", False):
        return
    read_data = reader_class.read_data

    def reader_metadata(self: Any, *args: Any, **kwargs: Any) -> Any:
        path = metadata_path(self, kwargs)
        _reading[0] = str(self.path)
        with self.fs.create_stream(path, "rb") as metadata_file:
            metadata = read_metadata(path, metadata_file)
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata

    def load_entry(self: Any, read_item: Any, value: Any) -> None:
        fqn = read_item.dest_index.fqn
        obj = load_bytes(value, reading(fqn))
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[fqn], obj)
        else:
            self.state_dict[fqn] = obj

    def reader_data(self: Any, plan: Any, planner: Any) -> Any:
        with exact_globals([]):
            try:
                return read_data(self, plan, planner)
            except UnsafeCheckpoint:
                raise
            except pickle.UnpicklingError as exc:
                fqn, what = _refused_tensor(self, plan) or ("", _what(exc))
        raise UnsafeCheckpoint(f"{self.path} (its tensor {fqn or 'data'})", what) from None

    reader_metadata._hpc_llm = True  # type: ignore[attr-defined]
    reader_class.read_metadata = reader_metadata  # type: ignore[method-assign]
    reader_class.read_data = reader_data  # type: ignore[method-assign]
    default_planner.DefaultLoadPlanner.load_bytes = load_entry  # type: ignore[method-assign]
