"""Hostile pickles, written opcode by opcode (stdlib only: the opcodes are :mod:`pickle`'s).

Each payload acts on a canary folder (:func:`lay_canary`): it creates ``ran-<name>`` (a command
run), deletes or moves ``victim`` (DCP's own ``FileSystem.rm_file``/``rename``, the escape issue
#54 found), deletes ``tree/`` (a private function), or sets an attribute on DCP's ``Metadata``
class (``BUILD`` on a class). :func:`changed` says what of the canary is no longer as laid.
``refused`` is what a refusal must name: the global, or the opcode where no global is named.
Every payload is checked to do what it says when unpickled unrestricted (the ``unrestricted``
reader of :mod:`tests.hostile.readers`), so an intact canary means the reader stopped it.
"""

from __future__ import annotations

import contextlib
import copyreg
import struct
from dataclasses import dataclass
from pathlib import Path

#: the attribute ``build-on-class`` sets on DCP's ``Metadata`` class
CLASS_MARK = "hpc_llm_hostile"
#: the module and class ``build-on-class`` names
METADATA = ("torch.distributed.checkpoint.metadata", "Metadata")
#: copyreg codes for ``EXT1/2/4`` and what each names, registered as a library in the reading
#: process could (copyreg takes one code per name)
EXT_CODES = {
    "EXT1": (0xF0, ("os", "system")),
    "EXT2": (0x1F0, ("posix", "system")),
    "EXT4": (0x1F0F0, ("subprocess", "getoutput")),
}

PROTO2, PROTO4 = b"\x80\x02", b"\x80\x04"
MARK, STOP, NONE = b"(", b".", b"N"
EMPTY_TUPLE, TUPLE1, TUPLE2, EMPTY_DICT = b")", b"\x85", b"\x86", b"}"
REDUCE, BUILD, NEWOBJ, NEWOBJ_EX, OBJ = b"R", b"b", b"\x81", b"\x92", b"o"
SETITEM, STACK_GLOBAL, MEMOIZE, POP, BINGET = b"s", b"\x93", b"\x94", b"0", b"h"
BINPERSID = b"Q"


def u(text: str) -> bytes:
    """``BINUNICODE``: a string (protocol 1 up, which torch's weights-only unpickler reads too)."""
    raw = text.encode()
    return b"X" + struct.pack("<I", len(raw)) + raw


def glob(module: str, name: str) -> bytes:
    """``GLOBAL``: protocol 0's name of an object."""
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n"


def stack_glob(module: str, name: str) -> bytes:
    """``STACK_GLOBAL``: protocol 4's, which resolves a dotted name (``FileSystem.rm_file``)."""
    return u(module) + u(name) + STACK_GLOBAL


@dataclass(frozen=True)
class Payload:
    name: str
    data: bytes
    #: what a refusal names (a global ``module.name``, or ``the opcode X``): one of these (torch's
    #: weights-only unpickler and hpc_llm's plain one refuse ``build-on-class`` at different steps)
    refused: tuple[str, ...]
    #: what it does, unpickled unrestricted
    effect: str
    #: it acts through copyreg codes the reading process must have registered
    needs_ext: bool = False


def lay_canary(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "victim").write_text("a file a checkpoint ships")
    (folder / "tree").mkdir(exist_ok=True)
    (folder / "tree" / "leaf").write_text("a folder of the user's")


def changed(folder: Path) -> list[str]:
    """What is no longer as :func:`lay_canary` laid it (empty: intact)."""
    out = []
    if not (folder / "victim").is_file():
        out.append("victim deleted or moved")
    if not (folder / "tree" / "leaf").is_file():
        out.append("tree deleted")
    out += [f"{p.name} created" for p in folder.iterdir() if p.name not in ("victim", "tree")]
    return out


def class_changed() -> bool:
    """``build-on-class`` set an attribute on DCP's Metadata class in this process."""
    import importlib

    return hasattr(getattr(importlib.import_module(METADATA[0]), METADATA[1]), CLASS_MARK)


def unregister_extensions() -> None:
    """Undo :func:`register_extensions` (registered, the codes change how ``pickle.dumps`` writes
    ``os.system`` in this process)."""
    for code, (module, name) in EXT_CODES.values():
        with contextlib.suppress(ValueError):
            copyreg.remove_extension(module, name, code)


def register_extensions() -> None:
    """The EXT codes, as a library in the reading process could register them."""
    for code, (module, name) in EXT_CODES.values():
        with contextlib.suppress(ValueError):  # registered already
            copyreg.add_extension(module, name, code)


def payloads(c: Path) -> list[Payload]:
    """Every hostile pickle, acting on the canary folder ``c``."""
    run = lambda tag: u(f"touch {c}/ran-{tag}")  # noqa: E731
    fs = "torch.distributed.checkpoint.filesystem"
    out = [
        Payload(
            "global-reduce",
            PROTO2 + glob("os", "system") + run("global") + TUPLE1 + REDUCE + STOP,
            ("os.system",),
            "runs",
        ),
        # issue #54's first escape: a dotted name, whose __module__ is DCP's own
        Payload(
            "stack-global-dotted-rm_file",
            PROTO4
            + stack_glob(fs, "FileSystem.rm_file")
            + stack_glob(fs, "FileSystem")
            + EMPTY_TUPLE
            + REDUCE
            + u(f"{c}/victim")
            + TUPLE2
            + REDUCE
            + STOP,
            (f"{fs}.FileSystem.rm_file",),
            "deletes victim",
        ),
        Payload(
            "stack-global-dotted-rename",
            PROTO4
            + stack_glob(fs, "FileSystem.rename")
            + stack_glob(fs, "FileSystem")
            + EMPTY_TUPLE
            + REDUCE
            + u(f"{c}/victim")
            + u(f"{c}/moved")
            + b"\x87"  # TUPLE3
            + REDUCE
            + STOP,
            (f"{fs}.FileSystem.rename",),
            "moves victim",
        ),
        # a dunder name first: __import__('os'), then getattr(os, 'system')('touch ...')
        Payload(
            "stack-global-dunder",
            PROTO4
            + stack_glob("builtins", "__import__")
            + MEMOIZE
            + POP
            + stack_glob("builtins", "getattr")
            + BINGET
            + b"\x00"
            + u("os")
            + TUPLE1
            + REDUCE
            + u("system")
            + TUPLE2
            + REDUCE
            + run("dunder")
            + TUPLE1
            + REDUCE
            + STOP,
            ("builtins.__import__",),
            "runs",
        ),
        # a private name no list holds
        Payload(
            "private-name",
            PROTO4 + stack_glob("shutil", "_rmtree_unsafe") + u(f"{c}/tree") + NONE + TUPLE2 + REDUCE + STOP,
            ("shutil._rmtree_unsafe",),
            "deletes tree",
        ),
        Payload(
            "build-setstate",
            PROTO2 + glob("tests.hostile.gadgets", "Touch") + EMPTY_TUPLE + NEWOBJ + u(f"{c}/ran-build") + BUILD + STOP,
            ("tests.hostile.gadgets.Touch",),
            "creates ran-build",
        ),
        # BUILD's slot state on a class a list holds: setattr on the class, for the whole process
        Payload(
            "build-on-class",
            PROTO2 + glob(*METADATA) + NONE + EMPTY_DICT + u(CLASS_MARK) + u("set") + SETITEM + TUPLE2 + BUILD + STOP,
            ("the opcode BUILD on type", ".".join(METADATA)),
            "sets an attribute on Metadata",
        ),
        Payload(
            "inst",
            MARK + run("inst") + b"i" + b"os\nsystem\n" + STOP,
            ("os.system",),
            "runs",
        ),
        Payload(
            "obj",
            PROTO2 + MARK + glob("os", "system") + run("obj") + OBJ + STOP,
            ("os.system",),
            "runs",
        ),
        Payload(
            "newobj",
            PROTO2 + glob("tests.hostile.gadgets", "NewTouch") + u(f"{c}/ran-newobj") + TUPLE1 + NEWOBJ + STOP,
            ("tests.hostile.gadgets.NewTouch",),
            "creates ran-newobj",
        ),
        Payload(
            "newobj-ex",
            PROTO4
            + glob("tests.hostile.gadgets", "NewTouch")
            + EMPTY_TUPLE
            + EMPTY_DICT
            + u("path")
            + u(f"{c}/ran-newobj-ex")
            + SETITEM
            + NEWOBJ_EX
            + STOP,
            ("tests.hostile.gadgets.NewTouch",),
            "creates ran-newobj-ex",
        ),
        Payload(
            "ext1",
            PROTO2 + b"\x82" + struct.pack("<B", EXT_CODES["EXT1"][0]) + run("ext1") + TUPLE1 + REDUCE + STOP,
            ("the opcode EXT1",),
            "runs",
            needs_ext=True,
        ),
        Payload(
            "ext2",
            PROTO2 + b"\x83" + struct.pack("<H", EXT_CODES["EXT2"][0]) + run("ext2") + TUPLE1 + REDUCE + STOP,
            ("the opcode EXT2",),
            "runs",
            needs_ext=True,
        ),
        Payload(
            "ext4",
            PROTO2 + b"\x84" + struct.pack("<i", EXT_CODES["EXT4"][0]) + run("ext4") + TUPLE1 + REDUCE + STOP,
            ("the opcode EXT4",),
            "runs",
            needs_ext=True,
        ),
        # a persistent id that is no storage: what a reader's persistent_load would be handed
        Payload(
            "persistent-load",
            PROTO2 + u("module") + u("os") + TUPLE2 + BINPERSID + STOP,
            ("the opcode BINPERSID",),
            "hands a reader's persistent_load a non-storage id",
        ),
    ]
    return out


#: the ``state.algorithms`` entry Composer ``eval``s (not a pickle: a repr in a weights-only state)
def algorithm_repr(c: Path) -> str:
    return f"Alibi(max_sequence_length=__import__('os').system('touch {c}/ran-eval'))"
