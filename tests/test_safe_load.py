"""Checkpoints that cannot run code (issue #41 item 4; docs/upstream-fixes.md, upstream fixes 21, 22).

Each test writes a checkpoint whose pickle would run ``touch`` when unpickled, points the real
loader at it (Composer's monolithic load, torch DCP's ``.metadata`` and non-tensor entries, with
hpc_llm's patches applied), and sees it refused in one line naming the file, the marker never
created; and a legitimate checkpoint of the same shape loads. End to end, a run whose
``checkpoint.load_path`` is such a file fails before training with that line
(:func:`test_a_run_whose_load_path_would_run_code_fails_with_one_line_and_runs_nothing`).
"""

from __future__ import annotations

import datetime
import os
import warnings
from pathlib import Path

import pytest

from hpc_llm.job.rank import safe_load
from tests.conftest import explain, run_app

torch = pytest.importorskip("torch")


class Evil:
    """An object whose unpickling runs a command (``os.system``), as a planted checkpoint would."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (os.system, (f"touch {self.marker}",))


@pytest.fixture(scope="module", autouse=True)
def patched():
    from hpc_llm.job.rank import compat

    compat._patch_safe_checkpoint_loads()


def composer_state() -> dict:
    """What a Composer checkpoint holds beyond tensors (read off real ones)."""
    import numpy as np
    from torch.torch_version import TorchVersion

    return {
        "state": {
            "model": {"w": torch.randn(3, 3)},
            "timestamp": {"batch": 5, "total_wct": datetime.timedelta(seconds=3)},
            "run_name": "mpt_tiny",
            "versions": TorchVersion("2.7.0"),
        },
        "rng": [{"python": (3, (1, 2), None), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}],
    }


def test_a_monolithic_checkpoint_that_would_run_code_is_refused_naming_the_file(tmp_path):
    from composer.utils import checkpoint

    marker, path = tmp_path / "ran", tmp_path / "ep1-ba10-rank0.pt"
    torch.save({"state": {"model": {}}, "payload": Evil(marker)}, path)
    with pytest.raises(Exception) as got:
        checkpoint.safe_torch_load(str(path))
    line = str(got.value)
    assert "\n" not in line and f"refused to load {path}: it names posix.system" in line, line
    assert not marker.exists()
    good = tmp_path / "good.pt"
    torch.save(composer_state(), good)
    loaded = checkpoint.safe_torch_load(str(good))
    assert loaded["state"]["timestamp"]["total_wct"] == datetime.timedelta(seconds=3) and not marker.exists()


def _dcp_save(state: dict, where: Path) -> None:
    import torch.distributed.checkpoint as dcp

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(state, checkpoint_id=str(where), no_dist=True)


def _dcp_load(state: dict, where: Path) -> None:
    import torch.distributed.checkpoint as dcp

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(state, checkpoint_id=str(where), no_dist=True)


def test_a_sharded_checkpoint_whose_metadata_would_run_code_is_refused_naming_the_file(tmp_path):
    import pickle

    marker, where = tmp_path / "ran", tmp_path / "ep1-ba10"
    state = composer_state()
    _dcp_save(state, where)
    back = {"state": {"model": {"w": torch.zeros(3, 3)}, "run_name": None}}
    _dcp_load(back, where)  # a legitimate one loads, its tensors and its other entries
    assert torch.equal(back["state"]["model"]["w"], state["state"]["model"]["w"]) and back["state"]["run_name"]
    (where / ".metadata").write_bytes(pickle.dumps(Evil(marker)))
    with pytest.raises(BaseException) as got:  # DCP's CheckpointException is a BaseException
        _dcp_load(back, where)
    line = str(safe_load.unwrap(got.value))  # as the rank reports it
    assert line.startswith(f"refused to load {where / '.metadata'}: it names posix.system") and "\n" not in line
    assert not marker.exists()


def test_a_sharded_checkpoint_entry_that_would_run_code_is_refused(tmp_path):
    marker, where = tmp_path / "ran", tmp_path / "ep1-ba10"
    _dcp_save({"state": {"model": {"w": torch.ones(2)}, "callbacks": Evil(marker)}}, where)
    assert not marker.exists()  # saving it ran nothing
    with pytest.raises(BaseException) as got:
        _dcp_load({"state": {"model": {"w": torch.zeros(2)}, "callbacks": None}}, where)
    line = str(safe_load.unwrap(got.value))
    assert line.startswith(f"refused to load {where} (its entry state.callbacks): it names posix.system"), line
    assert not marker.exists()


@pytest.mark.train
def test_a_run_whose_load_path_would_run_code_fails_with_one_line_and_runs_nothing(app_env, runs_dir, tmp_path):
    marker, path = tmp_path / "ran", tmp_path / "planted.pt"
    torch.save({"state": {"model": {}}, "payload": Evil(marker)}, path)
    proc = run_app(["+experiment=mpt_tiny", f"checkpoint.load_path={path}"], app_env, cwd=tmp_path, timeout=600)
    assert proc.returncode != 0, explain(proc)
    assert f"refused to load {path} (read from " in proc.stderr and "it names posix.system" in proc.stderr, explain(
        proc
    )
    assert not marker.exists()


@pytest.mark.train
def test_a_resume_from_a_sharded_checkpoint_whose_metadata_would_run_code_fails_and_runs_nothing(
    app_env, runs_dir, tmp_path
):
    """FSDP over 2 ranks saves sharded checkpoints (DCP folders); a planted ``.metadata`` in the
    newest, and the next run that autoresumes from that folder is refused in one line naming it."""
    import pickle

    folder, marker = tmp_path / "ckpt", tmp_path / "ran"
    args = [
        "+experiment=mpt_tiny",
        "eval=none",
        "parallelism=fsdp",
        "resources.tasks_per_node=2",
        "checkpoint.interval=3ba",
        f"checkpoint.location={folder}",
    ]
    first = run_app([*args, "train.max_duration=6ba"], app_env, cwd=tmp_path, timeout=600)
    assert first.returncode == 0, explain(first)
    newest = folder / "ep0-ba6"
    assert (newest / ".metadata").is_file(), sorted(p.name for p in folder.iterdir())
    (newest / ".metadata").write_bytes(pickle.dumps(Evil(marker)))
    again = run_app([*args, "train.max_duration=9ba"], app_env, cwd=tmp_path, timeout=600)
    assert again.returncode != 0, explain(again)
    assert f"refused to load {newest}" in again.stderr and "it names posix.system" in again.stderr, explain(again)
    assert not marker.exists()
