"""``hpc-llm doctor``: its checks row by row over a captured ``scontrol show config`` (and
variants of it with one setting changed), its probe job and profile on the real dev cluster.

The fixtures in tests/fixtures/doctor/ were captured from ``hpc-llm dev-cluster up --nodes 2``
(Debian slurm-wlm 22.05, and Slurm 24.11 from scripts/install-slurm.sh): ``scontrol show
config``, ``scontrol show partition`` and ``sinfo -N -h -o '%N|%P|%G|%c|%m|%T'``. The variants
change one setting of the 22.05 capture.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

import hpc_llm
from hpc_llm.config.compose import compose
from hpc_llm.doctor import checks, gather, profile, table
from hpc_llm.doctor import probe as doctor_probe
from hpc_llm.doctor.facts import Facts, Needs
from hpc_llm.doctor.probe import Probe
from hpc_llm.doctor.row import FAIL, OK, WARN, Row
from hpc_llm.slurm import parse, query
from tests.conftest import explain, run_cli

FIXTURES = Path(__file__).parent / "fixtures" / "doctor"
VERSIONS = ("22.05", "24.11")


def captured(version: str) -> tuple[str, str, str]:
    """``scontrol show config``, ``scontrol show partition`` and sinfo's nodes, as captured."""
    config, partitions, nodes = (
        (FIXTURES / f"{name}_{version}.txt").read_text()
        for name in ("scontrol_show_config", "scontrol_show_partition", "sinfo_nodes")
    )
    return config, partitions, nodes


CONFIG, PARTITIONS, NODES = captured("22.05")
#: what query.partitions() reads from this cluster's sinfo
SINFO_PARTITIONS = {
    "low": parse.Partition("low", 2, 16, True, "up"),
    "high": parse.Partition("high", 2, 16, False, "up"),
}
#: a node's report when every node-side check passes
PROBED = Probe(
    node="n1",
    host="vm",
    job_id="7",
    cpus=2,
    mem_kb=24684096,
    marker="seen",
    marker_write="ok",
    write_seen=True,
    python="ok /work/venv 3.11.7 0.1.0",
    apptainer="apptainer version 1.4.5",
    seconds=0.4,
)


def with_setting(text: str, key: str, value: str | None) -> str:
    """The ``scontrol show config`` text with ``key`` set to ``value`` (None: its line removed)."""
    pattern = re.compile(rf"^{re.escape(key)}\s*=.*$", flags=re.M)
    assert pattern.search(text), f"{key} is not in the fixture"
    return pattern.sub("" if value is None else f"{key} = {value}", text)


def with_partition(text: str, partition: str, key: str, value: str) -> str:
    """The ``scontrol show partition`` text with ``key=value`` in ``partition``'s record."""
    records = text.split("\n\n")
    for i, record in enumerate(records):
        if record.strip().startswith(f"PartitionName={partition}"):
            assert re.search(rf"\b{key}=\S*", record), f"{key} is not in {partition}'s record"
            records[i] = re.sub(rf"\b{key}=\S*", f"{key}={value}", record)
    return "\n\n".join(records)


def facts(config: str = CONFIG, partitions: str = PARTITIONS, nodes: str = NODES, **kw) -> Facts:
    return Facts(
        config=parse.show_config(config),
        partitions=SINFO_PARTITIONS,
        partition_info=parse.show_partitions(partitions),
        nodes=parse.nodes(nodes),
        **{"probe": PROBED, **kw},
    )


def needs(**kw) -> Needs:
    base = dict(
        partition=None,
        nodes=1,
        tasks_per_node=2,
        cpus_per_task=1,
        time_s=1800,
        run_dir="/work/runs/mpt_tiny/2026-01-01_00-00-00/0",
        python=("/work/venv/bin/python",),
        save_s=5.0,
        save_from="measured in /work/runs/x/0",
    )
    return Needs(**{**base, **kw})


def row(rows: list[Row], check: str) -> Row:
    found = [r for r in rows if r.check == check]
    assert len(found) == 1, [r.check for r in rows]
    return found[0]


# -- the parsers ---------------------------------------------------------------------------------


@pytest.mark.parametrize("version", VERSIONS)
def test_show_config_is_read_as_its_key_value_lines(version):
    c = parse.show_config(captured(version)[0])
    assert c["SLURM_VERSION"].startswith(version + ".")
    assert c["SlurmctldParameters"] == "preempt_send_user_signal"
    assert (c["PreemptMode"], c["PreemptType"], c["JobRequeue"]) == ("REQUEUE", "preempt/partition_prio", "1")
    assert c["KillWait"] == "10 sec" and c["AuthInfo"] == "cred_expire=10"
    assert c["SlurmctldHost[0]"].startswith("vm")
    assert parse.show_config("PowerPlugin             = \nMailDomain = (null)\n") == {
        "PowerPlugin": "",
        "MailDomain": "(null)",
    }
    assert not any(k.startswith(("Configuration data", "Slurmctld(primary)")) for k in c)


@pytest.mark.parametrize("version", VERSIONS)
def test_show_partition_records_and_nodes(version):
    _config, partitions, nodes_text = captured(version)
    parts = parse.show_partitions(partitions)
    assert sorted(parts) == ["high", "low"]
    assert (parts["low"]["GraceTime"], parts["low"]["PreemptMode"], parts["low"]["MaxTime"]) == (
        "20",
        "REQUEUE",
        "UNLIMITED",
    )
    assert (parts["high"]["PriorityTier"], parts["high"]["PreemptMode"]) == ("2", "OFF")
    nodes = parse.nodes(nodes_text)
    assert sorted((n.name, n.partition, n.cpus, n.mem_mb, n.gpus) for n in nodes)[:2] == [
        ("n1", "high", 16, 24105, [(None, 8)]),
        ("n1", "low", 16, 24105, [(None, 8)]),
    ]


@pytest.mark.parametrize(
    ("gres", "gpus"),
    [
        ("gpu:8", [(None, 8)]),
        ("gpu:h100:8(S:0-1)", [("h100", 8)]),
        ("gpu:a100:4(S:0,1),gpu:v100:2", [("a100", 4), ("v100", 2)]),
        ("gpu:h100:8,shard:h100:32", [("h100", 8)]),
        ("(null)", []),
    ],
)
def test_gres_gpus(gres, gpus):
    assert parse.Node("n", "p", gres, 1, 1, "idle").gpus == gpus


def test_associations():
    a = parse.associations("root|normal,high|normal\nproj|normal|\n", "proj\n")
    assert (a.default_account, a.accounts, a.qos, a.default_qos) == (
        "proj",
        ("root", "proj"),
        ("normal", "high"),
        "normal",
    )


def test_max_time():
    assert query.time_limit_s("UNLIMITED") is None
    assert query.time_limit_s("1-00:00:00") == 86400 and query.time_limit_s("30:00") == 1800


# -- the checks, row by row ----------------------------------------------------------------------


@pytest.mark.parametrize("version", VERSIONS)
def test_the_dev_cluster_has_everything(version):
    config, partitions, nodes_text = captured(version)
    rows = checks.evaluate(facts(config, partitions, nodes_text), needs())
    assert checks.exit_code(rows) == 0, [r for r in rows if r.status == FAIL]
    for check in ("partition", "preemption", "preemption signal", "grace time", "requeue", "accounting", "run dir"):
        assert row(rows, check).status == OK, row(rows, check)
    assert "by jobs of partition high" in row(rows, "preemption").detail
    assert row(rows, "grace time").value.startswith("GraceTime=20 s on low; checkpoint save 5.0 s (measured")
    # the dev cluster's nodes declare GPUs that a CPU config does not ask for
    assert row(rows, "GPUs (GRES)").status == WARN


@pytest.mark.parametrize(
    ("what", "make_facts", "make_needs", "check", "status", "says"),
    [
        (
            "no preempt_send_user_signal",
            lambda: facts(with_setting(CONFIG, "SlurmctldParameters", "(null)")),
            needs,
            "preemption signal",
            FAIL,
            "preemption will kill without the --signal warning, so no checkpoint is saved",
        ),
        (
            "preempt_send_user_signal among others",
            lambda: facts(with_setting(CONFIG, "SlurmctldParameters", "enable_configless,preempt_send_user_signal")),
            needs,
            "preemption signal",
            OK,
            "comes at preemption too",
        ),
        (
            "a preemptable partition that cancels",
            lambda: facts(partitions=with_partition(PARTITIONS, "low", "PreemptMode", "CANCEL")),
            needs,
            "preemption",
            FAIL,
            "ask your admin for PreemptMode=REQUEUE on partition low",
        ),
        (
            "a preemptable partition that suspends",
            lambda: facts(partitions=with_partition(PARTITIONS, "low", "PreemptMode", "GANG,SUSPEND")),
            needs,
            "preemption",
            WARN,
            "suspended in place",
        ),
        (
            # Slurm: PreemptMode=OFF cluster-wide disables preemption (PREEMPT_DATA_ENABLED):
            # nothing is ever preempted, so there is nothing to save for
            "PreemptMode=OFF cluster-wide",
            lambda: facts(with_setting(CONFIG, "PreemptMode", "OFF")),
            needs,
            "preemption",
            OK,
            "PreemptMode=OFF cluster-wide: preemption is disabled",
        ),
        (
            "PreemptMode=OFF: the signal setting is not needed",
            lambda: facts(
                with_setting(with_setting(CONFIG, "PreemptMode", "OFF"), "SlurmctldParameters", "(null)"),
            ),
            needs,
            "preemption signal",
            OK,
            "not needed",
        ),
        (
            "no preemption plugin",
            lambda: facts(with_setting(CONFIG, "PreemptType", "preempt/none")),
            lambda: needs(save_s=100.0),
            "grace time",
            OK,
            "not needed",
        ),
        (
            "the highest partition is not preempted",
            facts,
            lambda: needs(partition="high"),
            "preemption",
            OK,
            "PreemptMode=OFF on partition high",
        ),
        (
            "no partition of a higher tier shares the nodes",
            lambda: facts(nodes="\n".join(ln for ln in NODES.splitlines() if "|high|" not in ln)),
            needs,
            "preemption",
            OK,
            "no partition of a higher PriorityTier shares the nodes of low",
        ),
        (
            # hpc_llm's batch script asks --requeue itself, which JobRequeue=0 allows
            "JobRequeue=0, the job asks --requeue",
            lambda: facts(with_setting(CONFIG, "JobRequeue", "0")),
            needs,
            "requeue",
            OK,
            "hpc_llm's jobs ask --requeue",
        ),
        (
            "JobRequeue=0 and a job without --requeue",
            lambda: facts(with_setting(CONFIG, "JobRequeue", "0")),
            lambda: needs(requeue=False),
            "requeue",
            FAIL,
            "ask your admin for JobRequeue=1",
        ),
        (
            # hpc_llm works without accounting (status and report fall back): a warning
            "no accounting",
            lambda: facts(with_setting(CONFIG, "AccountingStorageType", "accounting_storage/none")),
            needs,
            "accounting",
            WARN,
            "ask your admin for AccountingStorageType=accounting_storage/slurmdbd",
        ),
        (
            "sacct does not answer",
            lambda: facts(accounting="sacct: error: Problem talking to the database: Connection refused"),
            needs,
            "accounting",
            WARN,
            "Connection refused",
        ),
        (
            "GraceTime shorter than the save",
            facts,
            lambda: needs(save_s=45.0),
            "grace time",
            FAIL,
            "ask your admin for GraceTime=55 or more on partition low",
        ),
        (
            "GraceTime shorter than the save, set on the partition",
            lambda: facts(partitions=with_partition(PARTITIONS, "low", "GraceTime", "0")),
            needs,
            "grace time",
            FAIL,
            "a preempted job has 0 s from the signal to SIGTERM",
        ),
        (
            "GraceTime just holds the save",
            facts,
            lambda: needs(save_s=15.0),
            "grace time",
            WARN,
            "GraceTime=25 would be safe",
        ),
        (
            "no save time known",
            facts,
            lambda: needs(save_s=None, save_from="no estimate: unknown model"),
            "grace time",
            WARN,
            "pass --run RUN_DIR",
        ),
        (
            "a time limit over MaxTime",
            lambda: facts(partitions=with_partition(PARTITIONS, "low", "MaxTime", "00:20:00")),
            needs,
            "time limit",
            FAIL,
            "set resources.time=00:20:00 or less",
        ),
        (
            "a short KillWait",
            lambda: facts(with_setting(CONFIG, "KillWait", "3 sec")),
            needs,
            "kill wait",
            WARN,
            "ask your admin for KillWait=10 or more",
        ),
        (
            "no node timeout",
            lambda: facts(with_setting(CONFIG, "SlurmdTimeout", "0 sec")),
            needs,
            "node failure",
            WARN,
            "never marked DOWN",
        ),
        (
            "the default cred_expire",
            lambda: facts(with_setting(CONFIG, "AuthInfo", "(null)")),
            needs,
            "requeue delay",
            OK,
            "120 s after it stopped",
        ),
        (
            "more GPUs than a node has",
            facts,
            lambda: needs(gpus_per_node=16),
            "GPUs (GRES)",
            FAIL,
            "the job asks for 16 GPUs per node on 1 node(s), but only 0 node(s) of low have them",
        ),
        (
            "a GPU type the nodes do not have",
            facts,
            lambda: needs(gpus_per_node=8, gpu_type="h100"),
            "GPUs (GRES)",
            FAIL,
            "the job asks for 8 h100 GPUs per node on 1 node(s), but only 0 node(s) of low have them",
        ),
        (
            "the GPU type the nodes have",
            lambda: facts(nodes=NODES.replace("gpu:8", "gpu:h100:8(S:0-1)")),
            lambda: needs(gpus_per_node=8, gpu_type="h100", nodes=2),
            "GPUs (GRES)",
            OK,
            "2 node(s) x 8 h100 GPUs asked",
        ),
        (
            "as many GPUs as a node has",
            facts,
            lambda: needs(gpus_per_node=8),
            "GPUs (GRES)",
            OK,
            "1 node(s) x 8 GPUs",
        ),
        (
            # the submit path's own check (hpc_llm.launch.sbatch.checks.placement), word for word
            "an unknown partition",
            facts,
            lambda: needs(partition="gpu"),
            "partition",
            FAIL,
            "partition 'gpu' does not exist on this cluster; allowed: high, low",
        ),
        (
            "more nodes than the partition has",
            facts,
            lambda: needs(nodes=3),
            "partition",
            FAIL,
            "resources.nodes=3 is more than partition 'low' has (2 nodes)",
        ),
        (
            "spare nodes on a Slurm older than 23.02.6",
            lambda: facts(config=with_setting(CONFIG, "SLURM_VERSION", "22.05.8")),
            lambda: needs(spare_nodes=1),
            "spare nodes",
            FAIL,
            "resources.spare_nodes=1 needs Slurm >= 23.02.6 (fixes to --no-kill), but this cluster runs Slurm 22.05.8",
        ),
        (
            "spare nodes on Slurm 24.11",
            lambda: facts(config=with_setting(CONFIG, "SLURM_VERSION", "24.11.5")),
            lambda: needs(spare_nodes=1),
            "spare nodes",
            OK,
            "a dead or left-out node's rank goes to a warm spare in the same job",
        ),
        (
            "training nodes and spares more than the partition has",
            facts,
            lambda: needs(nodes=2, spare_nodes=1),
            "partition",
            FAIL,
            "resources.nodes=2 + resources.spare_nodes=1 is more than partition 'low' has (2 nodes)",
        ),
        (
            "sbatch --test-only refuses",
            lambda: facts(test_only="Slurm would refuse job 0 (--mem=1T): Memory specification can not be satisfied"),
            needs,
            "sbatch --test-only",
            FAIL,
            "Memory specification can not be satisfied",
        ),
        (
            "nodes down",
            lambda: facts(nodes=NODES.replace("|idle", "|down*")),
            needs,
            "nodes",
            WARN,
            "only 0 of the 2 nodes of low are up",
        ),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_a_changed_setting_flags_its_row(what, make_facts, make_needs, check, status, says):
    rows = checks.evaluate(make_facts(), make_needs())
    r = row(rows, check)
    assert r.status == status, r
    assert says in r.detail, r
    assert checks.exit_code(rows) == (1 if status == FAIL else 0), [x for x in rows if x.status == FAIL]


@pytest.mark.parametrize(
    ("what", "probe", "make_needs", "check", "status", "says"),
    [
        (
            "the run dir is not on a shared filesystem",
            dataclasses.replace(PROBED, marker="missing", write_seen=False),
            needs,
            "run dir",
            FAIL,
            "n1 does not see it",
        ),
        (
            "the node cannot write the run dir",
            dataclasses.replace(PROBED, write_seen=False),
            needs,
            "run dir",
            FAIL,
            "what it writes there does not reach this machine",
        ),
        (
            # job_container/tmpfs: the fixture's cluster gives every job a private /tmp
            "a run dir under /tmp, no probe",
            None,
            lambda: needs(run_dir="/tmp/runs/x/0"),
            "run dir",
            FAIL,
            "each job gets a private /tmp and /dev/shm here (JobContainerType=job_container/tmpfs)",
        ),
        (
            "the venv is not on the node",
            dataclasses.replace(PROBED, python="failed bash: /work/venv/bin/python: No such file or directory"),
            needs,
            "Python env",
            FAIL,
            "the batch script's supervisor cannot start",
        ),
        (
            "the image is not on the node",
            dataclasses.replace(PROBED, paths={"/work/img.sif": "missing"}),
            lambda: needs(container="apptainer", image="/work/img.sif"),
            "container image",
            FAIL,
            "put it on a filesystem every node mounts",
        ),
        (
            "the image is on the node",
            dataclasses.replace(PROBED, paths={"/work/img.sif": "readable"}),
            lambda: needs(container="apptainer", image="/work/img.sif"),
            "container image",
            OK,
            "every rank runs in it",
        ),
        (
            "no Apptainer where container=apptainer",
            dataclasses.replace(PROBED, apptainer="", paths={"/work/img.sif": "readable"}),
            lambda: needs(container="apptainer", image="/work/img.sif"),
            "Apptainer",
            FAIL,
            "install Apptainer on the compute nodes",
        ),
        (
            "no Apptainer and no container",
            dataclasses.replace(PROBED, apptainer=""),
            needs,
            "Apptainer",
            OK,
            "needed only with container=apptainer",
        ),
        (
            # container=pyxis runs its image with enroot: Apptainer is not asked for
            "a pyxis image needs no Apptainer",
            dataclasses.replace(PROBED, apptainer="", paths={"/work/img.sqsh": "readable"}),
            lambda: needs(container="pyxis", image="/work/img.sqsh"),
            "Apptainer",
            OK,
            "needed only with container=apptainer",
        ),
        (
            # pyxis's rule: an image not starting with / or . is a reference each node imports
            "a pyxis registry reference is no file on the node",
            dataclasses.replace(PROBED, paths={}),
            lambda: needs(container="pyxis", image="nvcr.io#nvidia/pytorch:24.05-py3"),
            "container image",
            OK,
            "a registry reference: enroot on each node imports it",
        ),
        (
            "the --run dir is not on the node",
            dataclasses.replace(PROBED, paths={"/work/runs/old/0": "missing"}),
            lambda: needs(run="/work/runs/old/0"),
            "--run dir",
            FAIL,
            "could not read it there",
        ),
        (
            "a busy partition",
            Probe(
                error="the probe job did not report (Unable to allocate resources: Requested nodes are busy)", busy=True
            ),
            needs,
            "run dir",
            WARN,
            "not checked from a node",
        ),
        (
            "a probe srun refuses",
            Probe(error="the probe job did not report (Invalid account or account/partition combination)"),
            needs,
            "probe job",
            FAIL,
            "a job like this one cannot run on partition low",
        ),
        (
            "GPUs the node does not show",
            dataclasses.replace(PROBED, gpus=["No devices were found"]),
            lambda: needs(gpus_per_node=8),
            "GPUs on the node",
            FAIL,
            "nvidia-smi sees none there",
        ),
        (
            "the node's GPU",
            dataclasses.replace(PROBED, gpus=["GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0d3f)"]),
            lambda: needs(gpus_per_node=8),
            "GPUs on the node",
            OK,
            "nvidia-smi -L",
        ),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_what_the_probe_saw(what, probe, make_needs, check, status, says):
    rows = checks.evaluate(facts(probe=probe, probe_skipped="--no-probe" if probe is None else ""), make_needs())
    r = row(rows, check)
    assert r.status == status, r
    assert says in r.detail, r
    assert checks.exit_code(rows) == (1 if any(x.status == FAIL for x in rows) else 0)
    if status == FAIL:
        assert checks.exit_code(rows) == 1


ENROOT_ON_N1 = dataclasses.replace(PROBED, enroot="3.5.0")
ADMIN_PYXIS = "ask your admin for NVIDIA's pyxis (plugstack.conf) and enroot on the compute nodes"


@pytest.mark.parametrize(
    ("what", "pyxis", "probe", "make_needs", "status", "value", "says"),
    [
        (
            "container=pyxis with pyxis and enroot",
            True,
            ENROOT_ON_N1,
            lambda: needs(container="pyxis"),
            OK,
            "pyxis loaded by srun; enroot 3.5.0 on n1",
            "every rank runs in an enroot container that pyxis starts",
        ),
        (
            "pyxis and enroot, not used",
            True,
            ENROOT_ON_N1,
            needs,
            OK,
            "pyxis loaded by srun; enroot 3.5.0 on n1",
            "container=pyxis would use them (this job: container=none)",
        ),
        (
            "neither, not used",
            False,
            PROBED,
            lambda: needs(container="apptainer"),
            OK,
            "no pyxis in srun; no enroot on n1's PATH",
            "not needed: used only with container=pyxis",
        ),
        (
            # PYXIS_CONTAINER_* mean nothing to an srun without the plugin: the ranks run on the host
            "container=pyxis, srun without pyxis",
            False,
            ENROOT_ON_N1,
            lambda: needs(container="pyxis"),
            FAIL,
            "no pyxis in srun; enroot 3.5.0 on n1",
            f"which this srun does not have (the ranks would run outside the image): {ADMIN_PYXIS}",
        ),
        (
            # pyxis execs enroot from slurmd's PATH, which the probe's task may not share
            "container=pyxis, no enroot on the task's PATH",
            True,
            PROBED,
            lambda: needs(container="pyxis"),
            WARN,
            "pyxis loaded by srun; no enroot on n1's PATH",
            "if n1 has no enroot, every step of the job fails; ask your admin whether enroot is installed",
        ),
        (
            "container=pyxis, enroot that fails",
            True,
            dataclasses.replace(
                PROBED, enroot="failed mkdir: cannot create directory '/run/enroot': Permission denied"
            ),
            lambda: needs(container="pyxis", enroot="/opt/enroot/bin/enroot"),
            FAIL,
            "pyxis loaded by srun; enroot fails on n1",
            "`/opt/enroot/bin/enroot version` fails on n1 (mkdir: cannot create directory '/run/enroot'",
        ),
        (
            "container=pyxis, srun not asked",
            None,
            ENROOT_ON_N1,
            lambda: needs(container="pyxis"),
            WARN,
            "pyxis unknown (srun --help: Could not establish a configuration source); enroot 3.5.0 on n1",
            f"if `srun --help` has no --container-image, {ADMIN_PYXIS}",
        ),
        (
            "container=pyxis, no probe",
            True,
            None,
            lambda: needs(container="pyxis"),
            WARN,
            "pyxis loaded by srun; enroot not checked",
            "enroot not checked from a node (--no-probe)",
        ),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_pyxis_and_enroot(what, pyxis, probe, make_needs, status, value, says):
    f = facts(
        probe=probe,
        probe_skipped="--no-probe" if probe is None else "",
        pyxis=pyxis,
        pyxis_unknown="srun --help: Could not establish a configuration source" if pyxis is None else "",
    )
    rows = checks.evaluate(f, make_needs())
    r = row(rows, "pyxis / enroot")
    assert (r.status, r.value) == (status, value), r
    assert says in r.detail, r
    # next to Apptainer's row, and a FAIL here is a must-have missing
    names = [x.check for x in rows]
    assert names.index("pyxis / enroot") == names.index("Apptainer") + 1
    if status == FAIL:
        assert checks.exit_code(rows) == 1


@pytest.mark.parametrize(
    ("help_text", "loaded"),
    [
        # Slurm's own OCI option (21.08 and later) is no pyxis
        ("      --container             Path to OCI container bundle\n", False),
        (
            "Options provided by plugins:\n\n      --container-image=[USER@][REGISTRY#]IMAGE[:TAG]|PATH\n"
            "                              [pyxis] the image to use for the container\n",
            True,
        ),
        ("  --container-image-x=Y   another plugin's\n", False),
    ],
)
def test_pyxis_is_the_option_it_adds_to_srun_help(help_text, loaded):
    assert bool(gather.PYXIS_OPTION.search(help_text)) is loaded


def test_srun_help_says_whether_pyxis_is_loaded(tmp_path, monkeypatch):
    """The real srun, with a plugstack.conf beside its slurm.conf that loads the pyxis
    scripts/install-pyxis.sh built, one that loads nothing, and one whose plugin is missing
    (srun then refuses everything). srun --help asks no controller: none runs here."""
    from hpc_llm.devcluster import pyxis as devpyxis

    if shutil.which("srun") is None:
        pytest.skip("needs srun (Debian slurm-wlm; scripts/setup-dev.sh installs it)")
    conf = tmp_path / "slurm.conf"
    conf.write_text(
        "ClusterName=x\nSlurmctldHost=localhost\nNodeName=n1 CPUs=1\nPartitionName=p Nodes=n1 Default=YES\n"
    )
    plugstack = tmp_path / "plugstack.conf"
    plugstack.write_text("")
    monkeypatch.setenv("SLURM_CONF", str(conf))
    said = subprocess.run(["srun", "--version"], capture_output=True, text=True, timeout=30).stdout
    version = re.search(r"(\d+\.\d+)\.", said)
    assert version, said
    why = devpyxis.unavailable(version.group(1))
    if why is not None:
        pytest.skip(why)
    assert gather.pyxis_loaded() == (False, "")
    plugstack.write_text(f"required {devpyxis.plugin(version.group(1))} runtime_path={tmp_path / 'run'}\n")
    assert gather.pyxis_loaded() == (True, "")
    plugstack.write_text(f"required {tmp_path / 'gone' / 'spank_pyxis.so'}\n")
    loaded, why = gather.pyxis_loaded()
    assert loaded is None and why.startswith("srun --help: "), why


def test_the_jobs_container_is_what_doctor_checks():
    """needs.container is the composed container runtime; a pyxis registry reference stays as
    written (no file to look for), a file image is made absolute, enroot is container.executable."""
    ref = "nvcr.io#nvidia/pytorch:24.05-py3"
    job = gather.compose_job(
        ["+experiment=mpt_tiny", "container=pyxis", f"container.image='{ref}'", "container.executable=/opt/e/enroot"]
    )
    n = gather.needs_of(job)
    assert (n.container, n.image, n.enroot, n.apptainer) == ("pyxis", ref, "/opt/e/enroot", "apptainer")
    plain = gather.needs_of(gather.compose_job(["+experiment=mpt_tiny"]), image="img.sif")
    assert (plain.container, plain.enroot) == ("none", "enroot")
    assert plain.image == str(Path("img.sif").absolute())


def test_the_table_and_the_json_say_the_same():
    rows = checks.evaluate(facts(with_setting(CONFIG, "SlurmctldParameters", "(null)")), needs())
    text = table.render(rows, "hpc-llm doctor: test")
    assert "preemption signal" in text and "FAIL" in text
    assert text.rstrip().splitlines()[-1].startswith("1 must-have(s) missing: preemption signal")
    data = json.loads(table.as_json(rows))
    assert [d["check"] for d in data] == [r.check for r in rows]
    assert next(d for d in data if d["check"] == "preemption signal")["status"] == FAIL


def test_a_measured_save_wins_over_the_estimate(tmp_path):
    from hpc_llm.rundir.layout import RunDir

    run = tmp_path / "run"
    RunDir(run).attempts.parent.mkdir(parents=True)
    RunDir(run).attempts.write_text(
        json.dumps(
            [
                {"job_id": "1", "restart": 0, "started_at": 1.0, "save_s": 12.5, "checkpoint_save_s": 3.0},
                {"job_id": "1", "restart": 1, "started_at": 2.0, "checkpoint_save_s": 41.0},
            ]
        )
    )
    assert gather.measured_save_s(str(run)) == 41.0
    (tmp_path / "bare").mkdir()
    RunDir(tmp_path / "bare").results.write_text(json.dumps({"attempts": [{"save_s": 7.0}, {"save_s": None}]}))
    assert gather.measured_save_s(str(tmp_path / "bare")) == 7.0


def test_partition_is_the_launchers_partition():
    assert gather.job_overrides(["partition=high", "+experiment=mpt_tiny"]) == [
        "hydra.launcher.partition=high",
        "+experiment=mpt_tiny",
    ]
    # and the job is composed for the Slurm launcher (what hpc-llm render shows)
    job = gather.compose_job(["partition=high", "+experiment=mpt_tiny"])
    assert job.opts.partition == "high" and job.spec.flags["partition"] == "high"


def test_the_probe_script_run_here(tmp_path):
    """The probe's srun line, and its script run by bash on this machine (as a node runs it)."""
    marker = tmp_path / ".hpc_llm-doctor-tok"
    marker.write_text("tok\n")
    image = tmp_path / "img.sif"
    image.write_text("x")
    enroot = tmp_path / "bin" / "enroot"  # what `enroot version` prints
    enroot.parent.mkdir()
    enroot.write_text(
        '#!/bin/sh\n[ "$1" = version ] && echo 3.5.0 && exit 0\necho "usage: enroot COMMAND" >&2; exit 1\n'
    )
    enroot.chmod(0o755)
    flags = {"partition": "gpu", "account": "proj", "qos": None, "gpus_per_node": "h100:1"}
    cmd = doctor_probe.srun_command(
        flags,
        "tok",
        str(marker),
        "no-such-apptainer",
        [str(image), "/nonexistent"],
        [sys.executable],
        60,
        enroot=str(enroot),
    )
    i = cmd.index("bash")
    assert cmd[0] == "srun" and "--immediate=60" in cmd[:i]
    assert {"--partition=gpu", "--account=proj", "--gpus-per-node=h100:1"} <= set(cmd[:i])
    assert not [a for a in cmd[:i] if a.startswith("--qos")]
    out = subprocess.run(cmd[i:], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    p = doctor_probe.from_report(doctor_probe.parse(out.stdout))
    assert (p.marker, p.marker_write, p.apptainer, p.enroot) == ("seen", "ok", "", "3.5.0")
    assert (tmp_path / ".hpc_llm-doctor-tok.node").read_text().strip() == "tok"
    assert p.paths == {str(image): "readable", "/nonexistent": "missing"}
    assert p.python.startswith(f"ok {sys.prefix} ") and p.python.endswith(f" {hpc_llm.__version__}")
    assert p.cpus >= 1 and p.mem_kb > 0 and p.node
    enroot.write_text("#!/bin/sh\necho 'enroot: /run/enroot: Permission denied' >&2; exit 1\n")
    broken = subprocess.run(
        [*cmd[i : i + 4], "tok", str(tmp_path / "gone"), "x", str(enroot), "0", "/nonexistent/python"],
        capture_output=True,
        text=True,
    )
    q = doctor_probe.from_report(doctor_probe.parse(broken.stdout))
    assert q.marker == "missing" and q.python.startswith("failed ")
    assert q.enroot == "failed enroot: /run/enroot: Permission denied"
    none = subprocess.run(
        [*cmd[i : i + 4], "tok", "", "x", "no-such-enroot", "0", "/nonexistent/python"], capture_output=True, text=True
    )
    assert doctor_probe.from_report(doctor_probe.parse(none.stdout)).enroot == ""


# -- the profile --------------------------------------------------------------------------------


H100_NODES = "".join(f"g{i}|gpu*|gpu:h100:8(S:0-1)|96|1031000|idle\n" for i in range(4))


def test_a_profile_from_what_was_found_composes(tmp_path, monkeypatch):
    partitions = PARTITIONS.replace("PartitionName=low", "PartitionName=gpu").replace(
        "MaxTime=UNLIMITED", "MaxTime=2-00:00:00", 1
    )
    f = facts(partitions=partitions, nodes=H100_NODES)
    text = profile.build(
        "mysite",
        config=f.config,
        partition="gpu",
        partition_info=f.partition_info["gpu"],
        nodes=f.nodes,
        assoc=parse.Associations("proj", ("proj",), ("normal",), None),
        gpu_model="NVIDIA H100 80GB HBM3",
    )
    assert "# scratch:" in text  # unknown: a commented placeholder
    monkeypatch.setenv("HPC_LLM_CONFIG_PATH", str(tmp_path))
    (tmp_path / "cluster").mkdir()
    (tmp_path / "cluster" / "mysite.yaml").write_text(text)
    cfg = compose(["cluster=mysite", "hydra/launcher=slurm"])
    c, r = cfg.cluster, cfg.resources
    assert (c.name, c.device, c.partition, c.account, c.qos, c.exclusive) == (
        "mysite",
        "gpu",
        "gpu",
        "proj",
        "normal",
        True,
    )
    assert c.peak_flops_per_gpu == 989e12
    assert (r.tasks_per_node, r.gpus_per_node, r.cpus_per_task, r.time) == (8, 8, 12, "1-00:00:00")
    if "gpu_type" in r:  # resources.gpu_type: the nodes' GRES type
        assert r.gpu_type == "h100"


def test_a_profile_where_srun_loads_pyxis(tmp_path, monkeypatch):
    """pyxis and enroot found with an image doctor checked: the profile makes pyxis the site's
    container with that image (conf/config.yaml composes the container before the cluster, so
    the profile's override wins), and the command line still wins over the profile. Without an
    image, comment lines say how, and the container stays none."""
    f = facts(nodes=H100_NODES.replace("|gpu*|", "|low|"))
    args = dict(config=f.config, partition="low", partition_info=f.partition_info["low"], nodes=f.nodes, assoc=None)
    assert "pyxis" not in profile.build("plain", **args, pyxis=False, enroot="enroot 3.5.0 on g0")
    text = profile.build("mysite", **args, pyxis=True, enroot="enroot 3.5.0 on g0", image="/shared/img.sqsh")
    assert "srun loads NVIDIA's pyxis (enroot 3.5.0 on g0)" in text
    assert "  - override /container: pyxis" in text.splitlines()
    written = profile.write("mysite", text, tmp_path, force=False)  # composes cluster=mysite first
    assert written == tmp_path.resolve() / "cluster" / "mysite.yaml" and written.read_text() == text
    bare = profile.build("bare", **args, pyxis=True, enroot="enroot 3.5.0 on g0")
    said = [ln for ln in bare.splitlines() if "pyxis" in ln or "enroot" in ln]
    assert said and all(ln.startswith("# ") for ln in said), said
    assert "cluster=bare container=pyxis container.image=" in bare
    profile.write("bare", bare, tmp_path, force=False)
    monkeypatch.setenv("HPC_LLM_CONFIG_PATH", str(tmp_path))
    cfg = compose(["cluster=mysite"])
    assert (cfg.cluster.name, cfg.container.name, cfg.container.image) == ("mysite", "pyxis", "/shared/img.sqsh")
    assert compose(["cluster=mysite", "container=none"]).container.name == "none"
    other = compose(["cluster=mysite", "container.image=/shared/other.sqsh"]).container
    assert (other.name, other.image) == ("pyxis", "/shared/other.sqsh")
    assert compose(["cluster=bare"]).container.name == "none"
    assert compose(["cluster=h100"]).container.name == "none"


def test_profile_names(tmp_path):
    with pytest.raises(Exception, match="hpc_llm has a profile of that name"):
        profile.target("h100", tmp_path)
    with pytest.raises(Exception, match="a profile name is letters"):
        profile.target("../evil", tmp_path)
    assert profile.target("mine", tmp_path) == tmp_path.resolve() / "cluster" / "mine.yaml"


# -- through the command line -------------------------------------------------------------------


def as_rows(proc: subprocess.CompletedProcess[str]) -> dict[str, dict]:
    return {r["check"]: r for r in json.loads(proc.stdout)}


def test_no_slurm_is_one_line(app_env):
    env = dict(app_env, SLURM_CONF="/nonexistent/slurm.conf")
    proc = run_cli(["doctor", "+experiment=mpt_tiny"], env, timeout=120)
    assert proc.returncode != 0 and proc.stdout == "", explain(proc)
    assert proc.stderr.count("\n") == 1 and "no Slurm reachable" in proc.stderr, explain(proc)


@pytest.mark.slurm
def test_the_dev_cluster_passes_and_its_node_sees_the_run_dir(slurm_env):
    proc = run_cli(["doctor", "+experiment=mpt_tiny", "resources.nodes=2"], slurm_env)
    assert proc.returncode == 0, explain(proc)
    assert "hpc-llm doctor: cluster" in proc.stdout
    assert "everything hpc_llm needs is here" in proc.stdout
    proc = run_cli(["doctor", "+experiment=mpt_tiny", "--json"], slurm_env)
    assert proc.returncode == 0, explain(proc)
    rows = as_rows(proc)
    assert not [r for r in rows.values() if r["status"] == FAIL]
    assert rows["probe job"]["status"] == OK and re.match(r"job \d+ on n\d", rows["probe job"]["value"])
    assert rows["run dir"]["status"] == OK and "seen and written from n" in rows["run dir"]["value"]
    assert rows["Python env"]["status"] == OK and sys.prefix in rows["Python env"]["value"]
    assert rows["preemption signal"]["status"] == OK and rows["accounting"]["status"] == OK


@pytest.mark.slurm
def test_an_image_and_a_partition_by_name(slurm_env, tmp_path):
    image = tmp_path / "train.sif"
    image.write_bytes(b"not really an image")
    proc = run_cli(["doctor", "+experiment=mpt_tiny", "partition=high", "--image", str(image), "--json"], slurm_env)
    # the nodes are this machine: Apptainer, a must-have with an image, is there if it is here
    have_apptainer = shutil.which("apptainer") is not None
    assert proc.returncode == (0 if have_apptainer else 1), explain(proc)
    rows = as_rows(proc)
    assert rows["Apptainer"]["status"] == (OK if have_apptainer else FAIL)
    assert rows["partition"]["value"].startswith("high:")
    assert rows["preemption"]["status"] == OK and "PreemptMode=OFF on partition high" in rows["preemption"]["detail"]
    assert rows["container image"]["status"] == OK and str(image) in rows["container image"]["value"]
    missing = run_cli(["doctor", "+experiment=mpt_tiny", "--image", str(tmp_path / "nope.sif"), "--json"], slurm_env)
    assert missing.returncode == 1, explain(missing)
    assert as_rows(missing)["container image"]["status"] == FAIL


@pytest.mark.slurm
def test_a_run_dir_under_tmp_is_not_visible_from_a_job(slurm_env):
    sweep = f"/tmp/hpc_llm-doctor-{uuid.uuid4().hex[:8]}"
    proc = run_cli(["doctor", "+experiment=mpt_tiny", f"hydra.sweep.dir={sweep}", "--json"], slurm_env)
    assert proc.returncode == 1, explain(proc)
    r = as_rows(proc)["run dir"]
    assert r["status"] == FAIL and re.search(r"not visible from n\d", r["value"]), r  # the probe's node said so
    assert "private /tmp" in r["detail"]
    assert not Path(sweep).exists()
    assert not [p for p in Path("/tmp").glob(".hpc_llm-doctor-*")]  # the marker is removed


@pytest.mark.slurm
def test_the_probe_itself_tells_shared_from_private(slurm_env, tmp_path, monkeypatch):
    """Without doctor's /tmp rule: the marker is seen through a shared directory, not through /tmp."""
    for key, value in slurm_env.items():
        monkeypatch.setenv(key, value)
    flags = {"partition": "low"}
    shared = doctor_probe.run(flags, str(tmp_path / "runs" / "0"), [str(tmp_path)], [sys.executable], wait_s=60)
    assert shared.ran, shared
    assert (shared.marker, shared.write_seen, shared.paths) == ("seen", True, {str(tmp_path): "readable"})
    assert shared.python.startswith(f"ok {sys.prefix} ")
    private = doctor_probe.run(flags, f"/tmp/hpc_llm-probe-{uuid.uuid4().hex[:8]}/0", [], [sys.executable], wait_s=60)
    assert private.ran and (private.marker, private.write_seen) == ("missing", False), private
    assert list(tmp_path.glob(".hpc_llm-doctor-*")) == []


@pytest.mark.slurm
def test_a_measured_save_longer_than_grace_time_fails(slurm_env, tmp_path):
    from hpc_llm.rundir.layout import RunDir

    run = tmp_path / "run"
    RunDir(run).attempts.parent.mkdir(parents=True)
    RunDir(run).attempts.write_text(json.dumps([{"job_id": "1", "restart": 0, "started_at": 1.0, "save_s": 45.0}]))
    proc = run_cli(["doctor", "+experiment=mpt_tiny", "--run", str(run), "--json"], slurm_env)
    assert proc.returncode == 1, explain(proc)
    rows = as_rows(proc)
    assert rows["grace time"]["status"] == FAIL and f"measured in {run}" in rows["grace time"]["value"]
    assert rows["--run dir"]["status"] == OK


@pytest.mark.slurm
def test_write_profile_composes_and_is_not_overwritten(slurm_env, tmp_path):
    name = f"devx{uuid.uuid4().hex[:6]}"
    env = dict(slurm_env, XDG_CONFIG_HOME=str(tmp_path / "xdg"))
    proc = run_cli(["doctor", "+experiment=mpt_tiny", "--no-probe", "--write-profile", name], env)
    assert proc.returncode == 0, explain(proc)
    path = tmp_path / "xdg" / "hpc_llm" / "cluster" / f"{name}.yaml"  # hpc_llm.config.site.user_dir()
    assert path.is_file() and f"wrote {path}" in proc.stderr
    text = path.read_text()
    assert 'partition: "low"' in text and "gpus_per_node: 8" in text and "# scratch:" in text
    assert not [p for p in path.parent.iterdir() if p.name != path.name]  # nothing left from staging

    # cluster=NAME finds it in $HPC_LLM_CONFIG_PATH (hydra_plugins/hpc_llm_site), and it renders
    site_env = dict(slurm_env, HPC_LLM_CONFIG_PATH=str(path.parent.parent))
    render = run_cli(["render", "+experiment=mpt_tiny", f"cluster={name}"], site_env, timeout=120)
    assert render.returncode == 0, explain(render)
    for line in ("#SBATCH --partition=low", "#SBATCH --gpus-per-node=8", "#SBATCH --ntasks-per-node=8"):
        assert line in render.stdout
    # and doctor itself passes with it: 8 GPUs per node, as the GRES says
    checked = run_cli(["doctor", "+experiment=mpt_tiny", f"cluster={name}", "--json"], site_env)
    assert checked.returncode == 0, explain(checked)
    assert as_rows(checked)["GPUs (GRES)"]["status"] == OK

    before = (path.read_bytes(), path.stat().st_mtime_ns)
    again = run_cli(["doctor", "+experiment=mpt_tiny", "--no-probe", "--write-profile", name], env)
    assert again.returncode != 0 and again.stdout == "", explain(again)
    assert again.stderr.count("\n") == 1 and "exists already; pass --force" in again.stderr
    assert (path.read_bytes(), path.stat().st_mtime_ns) == before
    forced = run_cli(["doctor", "+experiment=mpt_tiny", "--no-probe", "--write-profile", name, "--force"], env)
    assert forced.returncode == 0, explain(forced)
    assert path.stat().st_mtime_ns != before[1]
