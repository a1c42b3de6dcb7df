"""Every checkpoint reader refuses every hostile file it could be handed (issue #54), in both
trainers' environments: one line naming the file (or entry) and the global, opcode or expression,
every canary intact. The corpus and the readers: :mod:`tests.hostile`. The inventory of the
sites: docs/reference/unpickling.md.

And a property: ``.metadata`` pickles DCP really wrote, mutated (globals renamed to dotted,
dunder and foreign names, hostile opcodes spliced in, bytes flipped, opcodes dropped or doubled),
never make hpc_llm's unpickler resolve a pair outside its exact list, nor touch a canary.
"""

from __future__ import annotations

import json
import os
import pickle
import pickletools
import random
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT
from tests.hostile import payloads as hostile

pytestmark = pytest.mark.stack  # torch, Composer and torchtitan, in subprocesses and in this process

TITAN_PYTHON = ROOT / ".venv-torchtitan" / "bin" / "python"


def run_readers(python: Path | str, work: Path) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HPC_LLM_", "SLURM_"))}
    proc = subprocess.run(
        [str(python), "-m", "tests.hostile.readers", str(work)],
        cwd=ROOT,
        env=dict(env, PYTHONPATH=str(ROOT)),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def refusal_problems(result: dict[str, Any]) -> list[str]:
    """What is wrong with one (reader, payload) case: it was not refused in one line naming the
    file and what it tried, or its canary changed."""
    line = result.get("line") or ""
    wrong = []
    if result["outcome"] != "refused":
        wrong.append(f"{result['outcome']}: {line[:300]} {result.get('trace', '')[-600:]}")
    elif "\n" in line or not line.startswith(f"refused to load {result['where']}: it names "):
        wrong.append(f"not one line naming {result['where']}: {line[:300]!r}")
    elif not any(name in line for name in result["refused"]):
        wrong.append(f"names none of {result['refused']}: {line[:300]!r}")
    if result["changed"] or result["class_changed"]:
        wrong.append(f"canary changed: {result['changed']}, class attribute set: {result['class_changed']}")
    return wrong


def check(found: dict[str, Any], readers: set[str]) -> None:
    results = found["results"]
    assert {r["reader"] for r in results} >= readers, sorted({r["reader"] for r in results})
    names = {p.name for p in hostile.payloads(Path("c"))}
    for reader in readers - {"composer-algorithms"}:
        assert {r["payload"] for r in results if r["reader"] == reader} == names, reader
    # the control: unpickled unrestricted, every payload does what it says (so an intact canary
    # below means the reader stopped it); a persistent id needs a reader's persistent_load
    for r in results:
        if r["reader"] == "unrestricted" and r["payload"] != "persistent-load":
            assert r["changed"] or r["class_changed"], f"{r['payload']} did nothing unrestricted: {r}"
    bad = {
        f"{r['reader']} <- {r['payload']}": p
        for r in results
        if r["reader"] != "unrestricted" and (p := refusal_problems(r))
    }
    assert not bad, json.dumps(bad, indent=1)


def test_every_reader_of_llm_foundrys_environment_refuses_every_hostile_file(tmp_path):
    """torch 2.7, Composer 0.32: a Composer checkpoint (its loader), DCP's .metadata, a non-tensor
    entry and a tensor (``dcp.load``), Composer's resumption file, and a Composer checkpoint whose
    ``state.algorithms`` carries an expression Composer evals."""
    found = run_readers(sys.executable, tmp_path)
    assert found["torch"].startswith("2.7") and not found["titan"]
    check(
        found,
        {
            "dcp-metadata",
            "dcp-entry",
            "dcp-tensor",
            "composer-monolithic",
            "composer-resumption",
            "composer-algorithms",
            "unrestricted",
        },
    )


@pytest.mark.skipif(not TITAN_PYTHON.exists(), reason="no torchtitan venv (scripts/setup-torchtitan.sh)")
def test_every_reader_of_torchtitans_environment_refuses_every_hostile_file(tmp_path):
    """torch 2.14, torchtitan 0.3: DCP's .metadata, a non-tensor entry, a tensor, and torchtitan's
    dataloader state (its ``load_state_dict`` through ``dcp.load``, as a resume calls it)."""
    found = run_readers(TITAN_PYTHON, tmp_path)
    assert found["torch"].startswith("2.14") and found["titan"]
    check(found, {"dcp-metadata", "dcp-entry", "dcp-tensor", "titan-dataloader"})


# -- the property: mutated .metadata never resolves a pair outside the list ----------------------

#: names a mutation writes in place of a real global's: dotted, dunder, private, foreign
HOSTILE_NAMES = [
    ("torch.distributed.checkpoint.filesystem", "FileSystem.rm_file"),
    ("torch.distributed.checkpoint.filesystem", "FileSystem"),
    ("torch.distributed.checkpoint.filesystem", "FileSystemReader"),
    ("torch.distributed.checkpoint.metadata", "Metadata.__init__"),
    ("torch.distributed.checkpoint.metadata", "__builtins__"),
    ("torch.distributed.checkpoint.metadata", "_version"),
    ("torch.distributed.checkpoint.metadata", "field"),
    ("torch", "load"),
    ("torch", "float32.__class__"),
    ("torch", "_C"),
    ("torch.serialization", "load"),
    ("pathlib", "Path.unlink"),
    ("collections", "namedtuple"),
    ("builtins", "getattr"),
    ("builtins", "eval"),
    ("os", "system"),
    ("posix", "remove"),
    ("shutil", "_rmtree_unsafe"),
    ("tests.hostile.gadgets", "Touch"),
    ("tests.hostile.gadgets", "NewTouch"),
]


def _ops(data: bytes) -> list[tuple[str, Any, bytes]]:
    """``data``'s opcodes, each with its argument and its own bytes, FRAMEs left out (they are
    optional, and a spliced stream would break their lengths)."""
    ops = list(pickletools.genops(data))
    out = []
    for (op, arg, pos), nxt in zip(ops, [*ops[1:], None], strict=True):
        end = nxt[2] if nxt is not None else len(data)
        if op.name != "FRAME":
            out.append((op.name, arg, data[pos:end]))
    return out


def _unicode(text: str) -> bytes:
    return hostile.u(text)


def _snippets(canary: Path) -> list[bytes]:
    """Opcode sequences a mutation splices in."""
    victim = str(canary / "victim")
    fs = "torch.distributed.checkpoint.filesystem"
    return [
        hostile.stack_glob(fs, "FileSystem.rm_file")
        + hostile.stack_glob(fs, "FileSystem")
        + b")R"
        + _unicode(victim)
        + b"\x86R",
        hostile.glob("os", "system") + _unicode(f"touch {canary}/ran") + b"\x85R",
        b"(" + _unicode(f"touch {canary}/ran") + b"ios\nsystem\n",
        b"\x82\xf0" + _unicode(f"touch {canary}/ran") + b"\x85R",
        _unicode("x") + b"Q",
        b"R",
        b"b",
        b"\x81",
        b"\x92",
        b"o",
        b"s",
        b"u",
        b"a",
        b"e",
        b"\x90",
        b"N}" + _unicode("hpc_llm_hostile") + _unicode("x") + b"s\x86b",
        hostile.glob("torch.distributed.checkpoint.metadata", "Metadata")
        + b"N}"
        + _unicode("x")
        + _unicode("y")
        + b"s\x86b",
        hostile.glob("tests.hostile.gadgets", "Touch") + b")\x81" + _unicode(f"{canary}/ran") + b"b",
    ]


def mutate(data: bytes, rng: random.Random, canary: Path) -> bytes:
    ops = _ops(data)
    for _ in range(rng.randint(1, 3)):
        kind = rng.choice(["rename", "rename", "splice", "splice", "flip", "drop", "double"])
        i = rng.randrange(len(ops))
        if kind == "rename":
            # a global's module and name (GLOBAL), or the two strings before a STACK_GLOBAL
            where = [j for j, op in enumerate(ops) if op[0] in ("GLOBAL", "STACK_GLOBAL")]
            if not where:
                continue
            j = rng.choice(where)
            module, name = rng.choice(HOSTILE_NAMES)
            if ops[j][0] == "GLOBAL":
                ops[j] = ("GLOBAL", None, hostile.glob(module, name))
            else:
                # the real pair stays pushed (later opcodes read it from the memo), then POPped
                ops[j] = ("STACK_GLOBAL", None, b"00" + hostile.stack_glob(module, name))
        elif kind == "splice":
            ops.insert(i, ("SPLICE", None, rng.choice(_snippets(canary))))
        elif kind == "flip":
            raw = bytearray(ops[i][2])
            raw[rng.randrange(len(raw))] = rng.randrange(256)
            ops[i] = ("FLIP", None, bytes(raw))
        elif kind == "drop":
            del ops[i]
        else:
            ops.insert(i, ops[i])
    return b"".join(op[2] for op in ops)


def _allowed_object(obj: Any, allowed: set[int], seen: set[int]) -> str | None:
    """What in ``obj`` is neither plain data nor of a listed class (None: all of it is)."""
    if id(obj) in seen:
        return None
    seen.add(id(obj))
    import torch

    # plain data, and what the listed _get_layout and TensorProperties.__setstate__ make
    plain = (type(None), bool, int, float, complex, str, bytes, bytearray, torch.layout, torch.memory_format)
    if isinstance(obj, plain) or id(obj) in allowed or id(type(obj)) in allowed:
        if hasattr(obj, "__dict__") and not isinstance(obj, type):
            for value in vars(obj).values():
                if (bad := _allowed_object(value, allowed, seen)) is not None:
                    return bad
        return None
    if type(obj) in (list, tuple, set, frozenset, dict):
        items = [*obj.keys(), *obj.values()] if isinstance(obj, dict) else list(obj)
        for item in items:
            if (bad := _allowed_object(item, allowed, seen)) is not None:
                return bad
        return None
    return f"{type(obj).__module__}.{type(obj).__qualname__}"


@pytest.fixture(scope="module")
def real_metadata(tmp_path_factory) -> list[bytes]:
    """``.metadata`` files DCP (torch 2.7) wrote for a Composer-like state, in protocols 4 and 2."""
    torch = pytest.importorskip("torch")
    import torch.distributed.checkpoint as dcp

    where = tmp_path_factory.mktemp("dcp") / "ep1-ba2"
    state = {
        "state": {
            "model": {"w": torch.randn(4, 2), "b": torch.zeros(2, dtype=torch.bfloat16)},
            "optimizers": {"Adam": {"state": {"w": {"step": torch.tensor(3.0)}}, "param_groups": [{"lr": 0.1}]}},
            "run_name": "mpt_tiny",
            "timestamp": {"batch": 2},
        },
        "rng": [{"python": (3, (1, 2), None)}],
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(state, checkpoint_id=str(where), no_dist=True)
    data = (where / ".metadata").read_bytes()
    meta = pickle.loads(data)  # our own file, just written
    return [data, pickle.dumps(meta, protocol=2)]


def test_mutated_metadata_never_resolves_a_global_outside_the_list(real_metadata, tmp_path, monkeypatch, request):
    from hpc_llm.job.rank import safe_load

    resolved: list[tuple[str, str]] = []
    real_resolve = safe_load._resolve

    def spy(module: str, name: str) -> Any:
        resolved.append((module, name))
        return real_resolve(module, name)

    monkeypatch.setattr(safe_load, "_resolve", spy)
    for data in real_metadata:  # the originals load, and resolve only listed pairs
        assert type(safe_load.unpickle(data, "x/.metadata", safe_load.METADATA_GLOBALS)).__name__ == "Metadata"
    hostile.register_extensions()
    request.addfinalizer(hostile.unregister_extensions)
    canary = tmp_path / "canary"
    hostile.lay_canary(canary)
    seed = int(os.environ.get("HPC_LLM_MUTATION_SEED", "54"))
    rng = random.Random(seed)
    outcomes: dict[str, int] = {}
    loaded_wrong = []
    for n in range(1500):
        mutant = mutate(rng.choice(real_metadata), rng, canary)
        try:
            obj = safe_load.unpickle(mutant, f"mutant {n}/.metadata", safe_load.METADATA_GLOBALS)
        except safe_load.UnsafeCheckpoint as exc:
            assert "\n" not in str(exc) and str(exc).startswith(f"refused to load mutant {n}/.metadata: it names ")
            outcomes["refused"] = outcomes.get("refused", 0) + 1
        except Exception as exc:  # a mutant that is no pickle any more, or whose listed calls fail
            outcomes[type(exc).__name__] = outcomes.get(type(exc).__name__, 0) + 1
        else:
            outcomes["loaded"] = outcomes.get("loaded", 0) + 1
            listed = {id(safe_load._resolve(m, name)) for m, name in safe_load.METADATA_GLOBALS if _has(m, name)}
            if (bad := _allowed_object(obj, listed, set())) is not None:
                loaded_wrong.append((n, bad))
        outside = sorted(set(resolved) - safe_load.METADATA_GLOBALS)
        assert not outside, f"seed {seed}, mutant {n} resolved {outside}: {mutant!r}"
        assert not hostile.changed(canary) and not hostile.class_changed(), f"seed {seed}, mutant {n}: {mutant!r}"
    assert not loaded_wrong, loaded_wrong
    # the mutations reach the guard: most are refused by it, not by a parse error before it
    assert outcomes.get("refused", 0) > 500, outcomes


def _has(module: str, name: str) -> bool:
    from hpc_llm.job.rank import safe_load

    try:
        safe_load._resolve(module, name)
    except (ImportError, AttributeError):
        return False
    return True


def test_a_composer_algorithm_as_composer_saves_it_passes_and_an_expression_does_not():
    """Composer's own repr of a required-on-load algorithm is a call with literal arguments (what
    hpc_llm lets through to its eval); anything more is refused before the eval."""
    from composer.algorithms import Alibi

    from hpc_llm.job.rank import safe_load

    real = Alibi(max_sequence_length=128, train_sequence_length_scaling=0.25).state_dict()
    safe_load.check_algorithms([("Alibi", real)], lambda name: True)
    for text in (
        "Alibi(max_sequence_length=__import__('os').getpid())",
        "Alibi(**{'max_sequence_length': 1})",
        "Alibi(1).__class__",
        "GatedLinearUnits()",  # another class than the entry names
        "Alibi(1)(2)",
        "Alibi(max_sequence_length=[x for x in ()])",
    ):
        with pytest.raises(safe_load.UnsafeCheckpoint) as got:
            safe_load.check_algorithms([("Alibi", {"repr": text})], lambda name: True)
        assert "the algorithm Alibi as" in str(got.value) and "\n" not in str(got.value)
    safe_load.check_algorithms([("Alibi", {"repr": "anything"})], lambda name: False)  # never evaluated


def test_the_inventory_writes_out_every_pair_of_every_list():
    """docs/reference/unpickling.md names each list's every module and name, as the code has them."""
    from hpc_llm.job.rank import safe_load

    doc = (ROOT / "docs" / "reference" / "unpickling.md").read_text()
    lists = {
        "METADATA_GLOBALS": safe_load.METADATA_GLOBALS,
        "ENTRY_GLOBALS": safe_load.ENTRY_GLOBALS,
        "DATALOADER_GLOBALS": safe_load.DATALOADER_GLOBALS,
        "RESUMPTION_GLOBALS": safe_load.RESUMPTION_GLOBALS,
    }
    for name, pairs in lists.items():
        assert f"safe_load.{name}" in doc, name
        unwritten = sorted((m, n) for m, n in pairs if f"`{m}`" not in doc or f"`{n}`" not in doc)
        assert not unwritten, f"{name}: {unwritten}"
