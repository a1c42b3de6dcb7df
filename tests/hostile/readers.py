"""Every hostile file to every checkpoint reader of this environment, with hpc_llm's patches applied
as a rank applies them: ``python -m tests.hostile.readers WORKDIR`` (run by
``tests/test_hostile_files.py`` with LLM Foundry's Python and with torchtitan's). The last line of
stdout is a JSON list, one object per (reader, payload): the refusal line (or what else
happened), what it had to name, and what of the case's canary changed.

The files are real: a ``torch.save`` zip whose ``data.pkl`` is the payload (a Composer
checkpoint), DCP folders written by ``dcp.save`` whose ``.metadata``, one non-tensor entry or one
tensor's bytes are replaced by it, a DCP folder holding torchtitan's dataloader state, Composer's
resumption file, and a Composer checkpoint whose ``state.algorithms`` carries an expression. The
readers are the real ones: Composer's loaders, ``dcp.load``, torchtitan's dataloader.
"""

from __future__ import annotations

import dataclasses
import functools
import io
import json
import pickle
import sys
import traceback
import warnings
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.hostile import payloads as hostile

warnings.simplefilter("ignore")


def torch_zip(data: bytes) -> bytes:
    """A ``torch.save`` file whose ``data.pkl`` is ``data`` (the rest is a real save's)."""
    import torch

    buf = io.BytesIO()
    torch.save({"x": 1}, buf)
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(buf.getvalue())) as src, zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as dst:
        for info in src.infolist():
            dst.writestr(info, data if info.filename.endswith("/data.pkl") else src.read(info))
    return out.getvalue()


def dcp_folder(where: Path, state: dict[str, Any]) -> Path:
    import torch.distributed.checkpoint as dcp

    dcp.save(state, checkpoint_id=str(where), no_dist=True)
    return where


def plant(folder: Path, fqn: str, blob: bytes) -> None:
    """``fqn``'s bytes in a DCP folder replaced by ``blob`` (appended to its file; the folder's own
    ``.metadata``, written by this process, points there)."""
    meta = pickle.loads((folder / ".metadata").read_bytes())  # our own file, just written
    index = next(i for i in meta.storage_data if i.fqn == fqn)
    info = meta.storage_data[index]
    target = folder / info.relative_path
    offset = target.stat().st_size
    with open(target, "ab") as f:
        f.write(blob)
    meta.storage_data[index] = dataclasses.replace(info, offset=offset, length=len(blob))
    (folder / ".metadata").write_bytes(pickle.dumps(meta))


def legit_state() -> dict[str, Any]:
    import torch

    return {"state": {"model": {"w": torch.ones(3)}, "run_name": "hostile"}}


def dcp_load(folder: Path, state: dict[str, Any]) -> None:
    import torch.distributed.checkpoint as dcp

    dcp.load(state, checkpoint_id=str(folder), no_dist=True)


# -- the readers: each takes (case folder, payload bytes) and returns what its refusal must name --


def read_dcp_metadata(case: Path, data: bytes) -> str:
    folder = dcp_folder(case / "step-1", legit_state())
    (folder / ".metadata").write_bytes(data)
    dcp_load(folder, legit_state())
    return f"{folder / '.metadata'}"


def read_dcp_entry(case: Path, data: bytes) -> str:
    folder = dcp_folder(case / "step-1", legit_state())
    plant(folder, "state.run_name", torch_zip(data))
    dcp_load(folder, legit_state())
    return f"{folder} (its entry state.run_name)"


def read_dcp_tensor(case: Path, data: bytes) -> str:
    folder = dcp_folder(case / "step-1", legit_state())
    plant(folder, "state.model.w", torch_zip(data))
    dcp_load(folder, legit_state())
    return f"{folder} (its tensor state.model.w)"


def read_composer_monolithic(case: Path, data: bytes) -> str:
    from composer.utils import checkpoint

    path = case / "ep1-ba1-rank0.pt"
    path.write_bytes(torch_zip(data))
    checkpoint.safe_torch_load(str(path))
    return str(path)


def read_composer_resumption(case: Path, data: bytes) -> str:
    from composer.checkpoint import load

    path = case / "resumption.pkl"
    path.write_bytes(data)
    load.load_resumption_checkpoint(None, str(path))
    return str(path)


def read_titan_dataloader(case: Path, data: bytes) -> str:
    from torch.utils.data import IterableDataset
    from torchtitan.components.dataloader import ParallelAwareDataloader

    class Numbers(IterableDataset):
        def __iter__(self):  # type: ignore[no-untyped-def]
            yield from range(4)

    # what torchtitan saves: {dp_rank_N: the pickled StatefulDataLoader state, world_size}
    folder = dcp_folder(case / "step-1", {"dataloader": {"dp_rank_0": data, "world_size": 1}})
    loader = ParallelAwareDataloader(Numbers(), dp_rank=0, dp_world_size=1, batch_size=1)
    dcp_load(folder, {"dataloader": loader})
    return f"{folder} (its entry dataloader.dp_rank_0)"


def read_unrestricted(case: Path, data: bytes) -> str:
    """The control: plain ``pickle.loads``, which must do what each payload says."""
    pickle.loads(data)
    return ""


def composer_algorithms_case(case: Path) -> dict[str, Any]:
    """A Composer checkpoint, weights-only through and through, whose ``state.algorithms`` names a
    required-on-load algorithm by an expression Composer evals; loaded by Composer's
    ``load_checkpoint`` into a real ``State``."""
    import torch
    from composer.core import State
    from composer.devices import DeviceCPU
    from composer.loggers import Logger
    from composer.models import ComposerClassifier
    from composer.utils import checkpoint, reproducibility

    canary = case / "canary"
    hostile.lay_canary(canary)

    def state() -> Any:
        model = ComposerClassifier(torch.nn.Linear(2, 2), num_classes=2)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        return State(model=model, optimizers=optimizer, rank_zero_seed=0, run_name="hostile", device=DeviceCPU())

    saved = state().state_dict()
    saved["algorithms"] = [("Alibi", {"repr": hostile.algorithm_repr(canary)})]
    path = case / "ep1-ba1-rank0.pt"
    torch.save({"state": saved, "rng": reproducibility.get_rng_state()}, path)
    target = state()
    return run_case(
        "composer-algorithms",
        "eval-algorithm-repr",
        canary,
        lambda: checkpoint.load_checkpoint(str(path), target, Logger(target)) and str(path),
        str(path),
        ("the algorithm Alibi",),
    )


def run_case(
    reader: str, payload: str, canary: Path, call: Callable[[], Any], where: str, refused: tuple[str, ...]
) -> dict[str, Any]:
    from hpc_llm.job.rank import safe_load

    out: dict[str, Any] = {"reader": reader, "payload": payload, "where": where, "refused": list(refused)}
    try:
        call()
        out["outcome"] = "loaded"
    except BaseException as exc:  # DCP's CheckpointException is a BaseException
        inner = safe_load.unwrap(exc)
        out["outcome"] = "refused" if isinstance(inner, safe_load.UnsafeCheckpoint) else "error"
        out["line"] = str(inner)
        if out["outcome"] == "error":
            out["trace"] = "".join(traceback.format_exception(type(inner), inner, inner.__traceback__))[-2000:]
    out["changed"] = hostile.changed(canary)
    out["class_changed"] = hostile.class_changed()
    if out["class_changed"]:
        import importlib

        delattr(getattr(importlib.import_module(hostile.METADATA[0]), hostile.METADATA[1]), hostile.CLASS_MARK)
    return out


def main(argv: list[str]) -> int:
    work = Path(argv[0]).resolve()
    try:
        import torchtitan  # noqa: F401

        titan = True
    except ImportError:
        titan = False
    hostile.register_extensions()
    if titan:
        from hpc_llm.job.rank.titan import compat as titan_compat

        titan_compat.apply()
        readers = {
            "dcp-metadata": read_dcp_metadata,
            "dcp-entry": read_dcp_entry,
            "dcp-tensor": read_dcp_tensor,
            "titan-dataloader": read_titan_dataloader,
        }
    else:
        from hpc_llm.job.rank import compat

        compat.apply()
        readers = {
            "dcp-metadata": read_dcp_metadata,
            "dcp-entry": read_dcp_entry,
            "dcp-tensor": read_dcp_tensor,
            "composer-monolithic": read_composer_monolithic,
            "composer-resumption": read_composer_resumption,
            # last: the control, whose payloads act on this process (build-on-class)
            "unrestricted": read_unrestricted,
        }
    results = []
    for reader, read in readers.items():
        for n, payload in enumerate(hostile.payloads(Path("CANARY"))):
            case = work / reader / payload.name
            canary = case / "canary"
            hostile.lay_canary(canary)
            data = hostile.payloads(canary)[n].data
            call = functools.partial(read, case, data)
            result = run_case(reader, payload.name, canary, call, _where(read, case), payload.refused)
            result["effect"] = payload.effect
            results.append(result)
    if not titan:
        results.append(composer_algorithms_case(work / "composer-algorithms"))
    print(json.dumps({"torch": __import__("torch").__version__, "titan": titan, "results": results}))
    return 0


def _where(read: Any, case: Path) -> str:
    """What a reader's refusal must name, for a case that raised before the reader returned it."""
    step = case / "step-1"
    return {
        read_dcp_metadata: str(step / ".metadata"),
        read_dcp_entry: f"{step} (its entry state.run_name)",
        read_dcp_tensor: f"{step} (its tensor state.model.w)",
        read_composer_monolithic: str(case / "ep1-ba1-rank0.pt"),
        read_composer_resumption: str(case / "resumption.pkl"),
        read_titan_dataloader: f"{step} (its entry dataloader.dp_rank_0)",
        read_unrestricted: "",
    }[read]


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
