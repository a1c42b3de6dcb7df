"""hpc_llm.job.rank.compat's fixes for upstream bugs, each against the real upstream code."""

from __future__ import annotations

import gc
import importlib.util
from pathlib import Path

import pytest

# a mark, not pytest.importorskip: importing Streaming (torch, torchvision, transformers) at
# collection cost every pytest worker ~3 s, in runs that deselect these tests too
pytestmark = [
    pytest.mark.stack,  # Streaming and Composer, in this process
    pytest.mark.skipif(importlib.util.find_spec("streaming") is None, reason="needs mosaicml-streaming"),
]


def _orders(root: Path, epochs: int, state: dict | None = None, workers: int = 0):
    """Sample ids of ``epochs`` epochs of a shuffled StreamingDataset (resumed from ``state``),
    and the state Composer saves at the end of each epoch (sample 0 of the next, counted
    from the epoch's beginning: composer.core.state._dataset_state_dict)."""
    from streaming import StreamingDataset
    from torch.utils.data import DataLoader

    ds = StreamingDataset(local=str(root), shuffle=True, shuffle_seed=17, batch_size=4)
    if state is not None:
        ds.load_state_dict(state)
    loader = DataLoader(ds, batch_size=4, num_workers=workers)
    orders, states = [], []
    for _ in range(epochs):
        orders.append([int(x) for batch in loader for x in batch["x"]])
        states.append(ds.state_dict(0, True))
    del loader, ds
    gc.collect()  # Streaming allows one dataset per local dir at a time
    return orders, states


@pytest.mark.parametrize("workers", [0, 2])
def test_a_run_resumed_at_an_epoch_boundary_sees_the_next_epoch_not_the_last_again(tmp_path, workers):
    """Streaming 0.12 saves the finished epoch at sample 0: resumed, the run replayed it."""
    from streaming import MDSWriter

    from hpc_llm.job.rank import compat

    compat.apply()
    root = tmp_path / "mds"
    with MDSWriter(out=str(root), columns={"x": "int"}) as out:
        for i in range(64):
            out.write({"x": i})
    uninterrupted, _ = _orders(root, 3, workers=workers)
    assert len({tuple(o) for o in uninterrupted}) == 3  # each epoch its own order
    first, [after_first] = _orders(root, 1, workers=workers)
    assert first == uninterrupted[:1] and after_first["epoch"] == 1
    second, [after_second] = _orders(root, 1, after_first, workers=workers)
    assert second == uninterrupted[1:2] and after_second["epoch"] == 2
    third, _ = _orders(root, 1, after_second, workers=workers)
    assert third == uninterrupted[2:]
