"""A node's own checks, run by its agent once warm (issue #40: spares checked before they serve).

The compute benchmark runs for real (torch, in a forked child, as the agent runs it); the
supervisor's judgement of the figures is pure and table-tested. End to end, a spare held back
to a fifth of a CPU (a cgroup quota) is given back and never trains: tests/test_spares.py.
"""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from hpc_llm.job.agent import node_check
from hpc_llm.job.supervisor.spares import failed_checks


def cfg(**kw: object) -> object:
    base = {"cluster": {"device": "cpu"}, "resources": {"gpus_per_node": 0}, "container": {"name": "none"}}
    return OmegaConf.merge(base, kw)


def test_the_compute_benchmark_measures_the_node_in_a_forked_child():
    got = node_check.check(cfg())
    assert got.failed is None and got.gflops is not None and got.gflops > 0.1, got


def test_outside_the_container_the_node_fails_before_any_benchmark(monkeypatch):
    monkeypatch.delenv("APPTAINER_CONTAINER", raising=False)
    monkeypatch.delenv("SINGULARITY_CONTAINER", raising=False)
    got = node_check.check(cfg(container={"name": "apptainer", "image": "/img/train.sif"}))
    assert got == node_check.NodeCheck(failed="the agent is not running inside container.image=/img/train.sif")


@pytest.mark.parametrize(
    "name,checks,out",
    [
        ("all alike: nobody", {"a": (10.0, None), "b": (9.0, None), "c": (11.0, None)}, {}),
        ("a spare at a tenth of the others", {"a": (10.0, None), "b": (9.0, None), "c": (1.0, None)}, {"c"}),
        ("half speed is not under 1/2 of the median", {"a": (10.0, None), "b": (10.0, None), "c": (5.0, None)}, set()),
        # seen on a loaded dev cluster: against all three nodes' median (67.0) it passed
        ("under 1/2 of the others'", {"a": (67.0, None), "b": (76.2, None), "c": (33.7, None)}, {"c"}),
        ("two nodes, one far slower", {"a": (10.0, None), "b": (4.0, None)}, {"b"}),
        ("a check of its own failed", {"a": (10.0, None), "b": (None, "nvidia-smi lists 7 GPU(s)")}, {"b"}),
        ("one figure: nothing to compare", {"a": (1.0, None)}, set()),
        ("not measured (another Hydra app): nobody", {"a": (None, None), "b": (None, None)}, set()),
    ],
)
def test_a_node_is_refused_for_a_failed_check_or_a_figure_far_under_the_median(name, checks, out):
    got = failed_checks(checks, factor=2.0)
    assert set(got) == set(out), (name, got)
    for node in got:
        assert ("GFLOP/s" in got[node]) == (checks[node][1] is None), got
