"""The torch.distributed environment derived from what srun sets."""

import pytest

from hpc_llm.job.env import default_port, expand_tasks_per_node, from_environ


def test_expand_tasks_per_node_handles_slurm_compression():
    assert expand_tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    assert expand_tasks_per_node("8") == [8]
    with pytest.raises(ValueError):
        expand_tasks_per_node("2(y3)")


def test_second_node_rank_from_slurm_variables():
    env = {
        "SLURM_PROCID": "5",
        "SLURM_LOCALID": "1",
        "SLURM_NODEID": "1",
        "SLURM_NTASKS": "8",
        "SLURM_STEP_TASKS_PER_NODE": "4(x2)",
        "SLURM_JOB_ID": "4242",
        "MASTER_ADDR": "n1",
    }
    d = from_environ(env)
    assert (d.rank, d.local_rank, d.world_size, d.local_world_size, d.node_rank, d.num_nodes) == (5, 1, 8, 4, 1, 2)
    assert d.master_addr == "n1"
    assert d.master_port == default_port("4242") == 20000 + 4242
    assert d.as_environ()["NODE_RANK"] == "1"


def test_multi_rank_without_master_addr_is_an_error():
    with pytest.raises(RuntimeError, match="MASTER_ADDR"):
        from_environ({"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_STEP_TASKS_PER_NODE": "2"})


def test_single_process_defaults():
    d = from_environ({})
    assert (d.rank, d.world_size, d.master_addr) == (0, 1, "127.0.0.1")
