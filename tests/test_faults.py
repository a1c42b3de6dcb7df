"""Long runs survive what a cluster does to them: real Slurm, real training, real faults.

Every test submits a run through ``python -m hpc_llm ... hydra/launcher=slurm``,
does to it what a cluster does (SIGKILL a rank, freeze one, kill a node's
daemons, let the time limit hit, preempt it, raise in user code) and checks
that it ends as docs/design/decision-table.md says: with the same
final training loss as an uninterrupted run of the same config (1e-5
relative), the batches lost being replayed from the last checkpoint. The
uninterrupted reference runs are shared, one per config for the session.

Preemption only ever targets the victim's own nodes, and victims that are
preempted run ``--exclusive``, so tests running beside them are not touched.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import signal
import subprocess
import time
import warnings
from pathlib import Path

import pytest

from tests.conftest import explain, results_of, run_app, run_cli, shared_dir, with_site
from tests.jobs import ALONE, attempts, beat, finished, in_queue, job_nodes, paced, preempt, story, submit, wait_for

pytestmark = [pytest.mark.slurm]

#: 2 nodes x 1 rank, a checkpoint every 5 batches, hangs named after 20 s (a minute before a pace)
BASE = [
    "+experiment=mpt_tiny",
    "hydra/launcher=slurm",
    "resources.nodes=2",
    "resources.tasks_per_node=1",
    "eval=none",
    "checkpoint.interval=5ba",
    "fault.hang_floor_s=20",
    "fault.hang_timeout_s=60",
]
SHORT = [*BASE, "train.max_duration=60ba"]
#: a fault injected "once rank 1 passes batch 8" must find SHORT still training on any machine:
#: at most 10 batches a second (heartbeats every 2 s: the test sees batch 8 by batch ~30)
PACE = paced(0.1)


def reference(args: list[str], env: dict[str, str], pytestconfig: pytest.Config) -> dict:
    """The results of an uninterrupted run of ``args``: run once for the whole session, every
    xdist worker included (the first to ask runs it under a lock; the others wait and read it)."""
    where = shared_dir(pytestconfig) / "references" / hashlib.sha1("\0".join(args).encode()).hexdigest()[:12]
    where.mkdir(parents=True, exist_ok=True)
    with open(where / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        saved = where / "reference.json"
        if saved.exists():
            return json.loads(saved.read_text())
        proc = run_app(
            [*args, "hydra.launcher.wait=true", "hydra.launcher.poll_s=1"],
            dict(env, HPC_LLM_RUNS=str(where / "runs")),
            cwd=where,
        )
        assert proc.returncode == 0, explain(proc)
        [r] = results_of(where / "runs")
        assert r["status"] == "completed" and r["restarts"] == 0, story(Path(r["run_dir"]))
        saved.write_text(json.dumps(r))
        return r


def same_loss(r: dict, ref: dict) -> None:
    assert r["status"] == "completed", r.get("error")
    assert r["batches_done"] == ref["batches_done"]
    assert r["train_loss"] == pytest.approx(ref["train_loss"], rel=1e-5)


def slurm_attempts(job_id: str, env: dict[str, str]) -> list[tuple[str, list[str]]]:
    """(state, node names) of every attempt of a job, straight from sacct -D (its NodeList
    is a hostlist, "n[1-2]": scontrol expands it)."""

    def run(*args: str) -> str:
        if args[-1] in ("", "None assigned"):  # an attempt cancelled while pending
            return ""
        return subprocess.run(args, env=env, capture_output=True, text=True, check=True).stdout

    rows = [
        ln.split("|")
        for ln in run("sacct", "-n", "-X", "-D", "-P", "-j", job_id, "-o", "State,NodeList").split("\n")
        if "|" in ln
    ]
    return [
        (state.split()[0], run("scontrol", "show", "hostnames", nodes).split()) for state, nodes, *_ in rows if state
    ]


def rank_at(run_dir: Path, rank: int, batch: int) -> dict:
    return wait_for(
        lambda: beat(run_dir, rank).get("batch", -1) >= batch and beat(run_dir, rank),
        240,
        f"rank {rank} to pass batch {batch}",
    )


def test_a_killed_rank_restarts_in_place_with_the_same_loss(slurm_env, test_site, tmp_path, pytestconfig):
    """SIGKILL of a rank: its agent sees it go at once; the supervisor ends the generation and
    starts the next one on the same warm agents, in the same allocation: no srun step, no
    import, no queue."""
    ref = reference(SHORT, slurm_env, pytestconfig)
    env = with_site(dict(slurm_env, HPC_LLM_RUNS=str(tmp_path / "runs")), test_site)
    scratch = tmp_path / "scratch"  # node-local in spirit (the dev cluster's /tmp is per job)
    job_id, run_dir = submit([*SHORT, *PACE, f"cluster.scratch={scratch}"], env, tmp_path)
    victim = rank_at(run_dir, 1, 8)
    assert sorted(p.name for p in scratch.glob("hpc_llm-*/node*")) == ["node0", "node1"]
    os.kill(victim["pid"], signal.SIGKILL)  # the OOM killer, a GPU off the bus
    killed_at = time.time()
    r = finished(run_dir, 300)
    same_loss(r, ref)
    first, second = r["attempts"]
    assert (first["cause"], first["action"], first["suspects"]) == ("failure", "restart", [victim["node"]])
    assert "killed by SIGKILL" in first["error"]
    # the same allocation: no requeue, no queue wait
    assert (second["job_id"], second["restart"], second["generation"]) == (job_id, 0, 1)
    assert second["queue_wait_s"] == 0 and second["resumed_at_batch"] > 0 and second["resumed_at_batch"] % 5 == 0
    assert r["restarts_by_cause"] == {"failure": 1} and r["slurm_job_ids"] == [job_id]
    assert 0 < r["goodput"] < 1
    # restarted by the same agents: each node's agent warmed up once, and forked generation 1
    # seconds after the kill (loose bounds: a loaded CI machine; benchmarks/faults.py measures)
    logs = Path(run_dir) / "logs"
    assert [p.read_text().count("warm in") for p in sorted(logs.glob("agent*.0.log"))] == [1, 1]
    full = attempts(run_dir)
    assert full[0]["detected_at"] - killed_at < 5 and full[1]["forked_at"] - full[0]["detected_at"] < 5
    # the agents removed the node-local scratch when the allocation ended
    wait_for(lambda: not in_queue(job_id, env), 60, "the job to end")
    assert list(scratch.iterdir()) == []


def test_a_frozen_rank_is_named_and_the_step_restarted(slurm_env, test_site, tmp_path, pytestconfig):
    ref = reference(SHORT, slurm_env, pytestconfig)
    env = with_site(dict(slurm_env, HPC_LLM_RUNS=str(tmp_path / "runs")), test_site)
    _job_id, run_dir = submit([*SHORT, *PACE], env, tmp_path)
    victim = rank_at(run_dir, 1, 8)
    frozen_at = time.monotonic()
    os.kill(victim["pid"], signal.SIGSTOP)  # a process stuck in the kernel, a wedged driver
    wait_for(lambda: any(a.get("action") == "restart" for a in attempts(run_dir)), 120, "the hang to be named")
    assert 20 <= time.monotonic() - frozen_at < 60  # fault.hang_floor_s=20: silent for 20 s is frozen
    r = finished(run_dir, 300)
    same_loss(r, ref)
    first = r["attempts"][0]
    assert first["cause"] == "hang" and first["suspects"] == [victim["node"]]
    assert "rank(s) 1 on" in first["error"] and "silent for more than 20s" in first["error"]


def node_state(node: str, env: dict[str, str]) -> str:
    out = subprocess.run(["sinfo", "-h", "-N", "-n", node, "-o", "%T"], env=env, capture_output=True, text=True)
    return out.stdout.strip()


@contextlib.contextmanager
def cluster_of_its_own(pytestconfig, slurm: str = "22.05", nodes: int = 3):
    """A dev cluster (3 nodes unless told) with accounting, of one test's own: a test that kills a node kills
    none of a shared cluster. On the shared one a killed node made another test's 2-node submit
    refused while it was DOWN, and its revival left the GPUs of the two other nodes booked for
    good (slurmctld: "gres/gpu: job 31 dealloc of node n1 bad node_offset 0 count is 0"; 22.05):
    every later job asking for GPUs waited forever."""
    from hpc_llm.devcluster import cluster as devcluster
    from tests.conftest import _free_port_block

    root = shared_dir(pytestconfig) / f"devcluster-own-{slurm}-{os.getpid()}"
    try:
        yield devcluster.up(root=root, nodes=nodes, ctld_port=_free_port_block(16), slurm=slurm, hosts=nodes_as_hosts())
    finally:
        devcluster.down(root)


def nodes_as_hosts() -> bool:
    """Whether a node-fault test's own cluster makes each node a host of its own: where this
    machine can (root, network namespaces), so a killed or frozen node is a host gone, its
    address unanswered, as on a real cluster; else the single-host cluster, saying so."""
    from tests.conftest import hosts_unavailable

    why = hosts_unavailable()
    if why is not None:
        warnings.warn(f"node faults on the single-host dev cluster: {why}", stacklevel=2)
    return why is None


@pytest.fixture
def own_cluster(pytestconfig):
    from tests.conftest import _slurm_tests_wanted

    if not _slurm_tests_wanted(pytestconfig):
        pytest.skip("needs Debian slurm-wlm and root")
    with cluster_of_its_own(pytestconfig) as cluster:
        yield cluster


@pytest.fixture
def own_cluster_24(dev_cluster_24, pytestconfig):
    """A 24.11 cluster of the test's own; ``dev_cluster_24`` first, for its skip or failure
    where 24.11 is not installed."""
    with cluster_of_its_own(pytestconfig, "24.11") as cluster:
        yield cluster


def test_a_dead_node_is_found_by_the_job_left_out_and_the_run_finishes_on_the_others(
    slurm_env, app_env, own_cluster, test_site, tmp_path, pytestconfig
):
    """A node dies (its slurmd, slurmstepds and tasks killed). Its peers lose their gloo
    connections, and the hang floor (5 s here) is shorter than Slurm's node detection
    (SlurmdTimeout=10: ~15 s): before the agents, the hang watch fired first, booked a hang and
    blamed the bystander too. Now the job finds the node dead itself (its agent's connection
    drops, its probe port refuses) within seconds, blames it alone and requeues without it,
    before Slurm's NODE_FAIL."""
    from hpc_llm.devcluster import cluster as devcluster

    ref = reference(SHORT, slurm_env, pytestconfig)  # on the shared cluster (the loss is the same)
    env = with_site(dict(app_env, **own_cluster.env(), HPC_LLM_RUNS=str(tmp_path / "runs")), test_site)
    job_id, run_dir = submit([*SHORT, *PACE, "fault.hang_floor_s=5"], env, tmp_path)
    victim = rank_at(run_dir, 1, 8)
    bystander = beat(run_dir, 0)["node"]
    devcluster.kill_node(own_cluster, victim["node"])  # its slurmd, slurmstepds and tasks
    killed_at = time.time()
    try:
        first = wait_for(lambda: (attempts(run_dir) or [{}])[0].get("decided_at") and attempts(run_dir)[0], 60, "it")
        r = finished(run_dir, 420)
    finally:
        # never restart a dead node's daemons before Slurm has called it DOWN
        wait_for(lambda: "down" in node_state(victim["node"], env), 120, f"Slurm to call {victim['node']} down")
        devcluster.revive_node(own_cluster, victim["node"])
    same_loss(r, ref)
    assert (first["cause"], first["action"], first["suspects"]) == ("node_failure", "requeue", [victim["node"]])
    assert bystander not in first["suspects"] and "stopped answering" in first["error"]
    assert first["detected_at"] - killed_at < 8, (killed_at, first)
    done = r["attempts"][-1]
    assert done["job_id"] == job_id and done["restart"] >= 1
    assert victim["node"] not in done["nodes"] and len(done["nodes"]) == 2
    # accounting: the attempt that finished, without the dead node. The requeued one's row is there
    # only when Slurm's NODE_FAIL came first: a job requeued while a dead node holds it COMPLETING
    # (until Slurm calls the node DOWN) gets its accounting row reused by the next start on 22.05
    # (sacct -D: one row, REQUEUED on n[1-2], then RUNNING and COMPLETED on n[1,3]; docs/design/control-plane.md)
    wait_for(lambda: not in_queue(job_id, env), 60, "the job to leave the queue")
    rows = slurm_attempts(job_id, env)
    assert rows[-1][0] == "COMPLETED" and victim["node"] not in rows[-1][1], rows
    assert all(state in ("REQUEUED", "NODE_FAIL", "COMPLETED") for state, _ in rows), rows
    shown = run_cli(["status", job_id], env)
    assert shown.returncode == 0 and "node_failure" in shown.stdout and "COMPLETED" in shown.stdout, explain(shown)


@pytest.fixture(scope="session")
def slow_cluster(pytestconfig):
    """A 3-node dev cluster of its own with Slurm's default SlurmdTimeout=300 (no accounting):
    a frozen node stays "up" for Slurm for five minutes. Slurm 24.11 where it is installed (CI
    installs it): 22.05 needs the supervisor to hold a job it requeued around a dead node for
    SlurmdTimeout x 4/3 + cred_expire (docs/design/control-plane.md, "Agents, detection and restarts"), seven minutes
    here even once the node is back. Started for the tests that use it."""
    from hpc_llm.devcluster import cluster as devcluster
    from tests.conftest import _free_port_block, _slurm24_installed, _slurm_tests_wanted

    if not _slurm_tests_wanted(pytestconfig):
        pytest.skip("needs Debian slurm-wlm and root")
    root = shared_dir(pytestconfig) / f"devcluster-300-{os.getpid()}"
    version = "24.11" if _slurm24_installed() else "22.05"
    cluster = devcluster.up(
        root=root,
        nodes=3,
        ctld_port=_free_port_block(16),
        accounting=False,
        slurmd_timeout_s=300,
        slurm=version,
        hosts=nodes_as_hosts(),
    )
    yield cluster
    devcluster.down(root)


def test_a_frozen_node_is_found_by_the_job_not_as_a_hang_and_writes_nothing_after(
    slow_cluster, app_env, test_site, tmp_path, pytestconfig
):
    """SIGSTOP of a node's slurmd and every process on it, on a cluster where Slurm calls a node
    DOWN only after SlurmdTimeout=300: the job finds it dead (its agent silent, then a probe
    unanswered) in seconds, blames it alone, never as a hang, and requeues without it. The
    requeued job waits for Slurm to release the frozen node (a user cannot mark a node DOWN);
    when the node comes back (SIGCONT), its ranks of the old generation write nothing more."""
    from hpc_llm.devcluster import cluster as devcluster

    env = with_site(dict(app_env, **slow_cluster.env(), HPC_LLM_RUNS=str(tmp_path / "runs")), test_site)
    # FSDP: every rank writes its own shard of each checkpoint, the frozen node's too
    args = [*SHORT, *PACE, "parallelism=fsdp", "fault.hang_floor_s=5"]
    ref = reference([*SHORT, "parallelism=fsdp"], dict(app_env, **slow_cluster.env()), pytestconfig)
    job_id, run_dir = submit(args, env, tmp_path)
    victim = rank_at(run_dir, 1, 8)
    frozen = devcluster.freeze_node(slow_cluster, victim["node"])
    frozen_at = time.time()
    try:
        first = wait_for(lambda: (attempts(run_dir) or [{}])[0].get("decided_at") and attempts(run_dir)[0], 60, "it")
        assert (first["cause"], first["action"], first["suspects"]) == ("node_failure", "requeue", [victim["node"]])
        assert "hang" not in first["cause"] and first["detected_at"] - frozen_at < 8, (frozen_at, first)
        # what Slurm does meanwhile: the node still "up" for it, the job held until the node answers
        assert "down" not in node_state(victim["node"], env)
        time.sleep(5)
        files = {p: p.stat().st_mtime for p in Path(run_dir).rglob("*") if p.is_file() and "logs" not in p.parts}
    finally:
        devcluster.thaw_node(frozen)
    old_rank = victim["pid"]
    wait_for(lambda: not Path(f"/proc/{old_rank}").exists(), 60, "the old rank on the thawed node to end")
    changed = [p for p, t in files.items() if p.exists() and p.stat().st_mtime != t and "heartbeat" not in p.parts]
    new = [p for p in Path(run_dir).rglob("*") if p.is_file() and p not in files and "logs" not in p.parts]
    # nothing the old generation would write (a shard, a link, the record) changed; the requeued
    # job cannot have started yet (it waits cred_expire=10 s after the node let it go)
    assert not [p for p in changed + new if "checkpoints" in p.parts or p.name.endswith(".json")], (changed, new)
    r = finished(run_dir, 420)
    same_loss(r, ref)
    assert victim["node"] not in r["attempts"][-1]["nodes"]


def test_a_stuck_collective_is_a_hang_after_k_times_the_median_step(slurm_env, test_site, tmp_path, pytestconfig):
    """Rank 1 stops at batch 40 for five minutes with its heartbeat going on; rank 0 waits in the
    next all-reduce (a stuck collective). At ~0.1 s a batch, 10 x the median step is ~1 s, so
    the floor (5 s here) decides: a hang, found in seconds instead of fault.hang_timeout_s, and
    the run restarted in place ends with the uninterrupted loss."""
    ref = reference(SHORT, slurm_env, pytestconfig)
    env = with_site(dict(slurm_env, HPC_LLM_RUNS=str(tmp_path / "runs")), test_site)
    stall = tmp_path / "stall"
    stall.write_text("1")
    args = [*SHORT, *paced(0.1, stall_file=stall, stall_at=40, stall_s=300, stall_rank=1), "fault.hang_floor_s=5"]
    _job_id, run_dir = submit(args, env, tmp_path)
    wait_for(lambda: not stall.exists(), 240, "rank 1 to stall")
    stalled_at = time.time()
    r = finished(run_dir, 300)
    same_loss(r, ref)
    first, second = r["attempts"]
    assert (first["cause"], first["action"], first["suspects"]) == ("hang", "restart", []), first
    assert "no batch trained for more than 5s" in first["error"], first["error"]
    assert attempts(run_dir)[0]["detected_at"] - stalled_at < 15
    assert second["generation"] == 1


def test_a_stop_signal_before_the_supervisor_exists_never_ends_the_job(slurm_env, tmp_path, pytestconfig):
    """Slurm may send the stop signal as soon as the batch script starts (a `--signal` up to 60 s
    early, a preemption at start-up). Sent here during the cluster's setup lines (a 10 s sleep),
    before the supervisor runs: the batch shell ignores it until the supervisor takes it over.
    Before, bash's default action for USR2 ended the job: no record, no requeue, the run lost."""
    ref = reference(SHORT, slurm_env, pytestconfig)
    env = dict(slurm_env, HPC_LLM_RUNS=str(tmp_path / "runs"))
    marker = tmp_path / "setup-started"
    job_id, run_dir = submit([*SHORT, f"cluster.setup=['touch {marker}','sleep 10']"], env, tmp_path)
    wait_for(marker.exists, 120, "the batch script's setup to start")
    subprocess.run(["scancel", "--batch", "--signal=USR2", job_id], env=env, check=True)
    r = finished(run_dir, 300)
    same_loss(r, ref)
    assert r["restarts"] == 0


def test_a_user_exception_fails_after_two_attempts(slurm_env, test_site, tmp_path):
    env = with_site(dict(slurm_env, HPC_LLM_RUNS=str(tmp_path / "runs")), test_site)
    job_id, run_dir = submit([*SHORT, "eval.evaluators=[crash]", "+eval.options.crash.at_batch=7"], env, tmp_path)
    r = finished(run_dir, 300)
    assert r["status"] == "failed"
    assert "RuntimeError: user code failed at batch 7" in r["error"] and "during batch 7 again" in r["error"]
    first, second = r["attempts"]
    assert (first["cause"], first["action"]) == ("failure", "restart")
    assert (second["cause"], second["action"]) == ("user_error", "fail")
    wait_for(lambda: not in_queue(job_id, env), 60, "the job to leave the queue")
    time.sleep(12)  # longer than cred_expire: a requeued job would be back
    assert not in_queue(job_id, env)


def test_an_exception_before_the_first_batch_is_not_retried(slurm_env, tmp_path):
    env = dict(slurm_env, HPC_LLM_RUNS=str(tmp_path / "runs"))
    job_id, run_dir = submit([*SHORT, "train.optimizer.name=no_such_optimizer"], env, tmp_path)
    r = finished(run_dir, 180)
    assert r["status"] == "failed" and "no_such_optimizer" in r["error"] and "before the first batch" in r["error"]
    assert r["restarts"] == 0 and [a["cause"] for a in r["attempts"]] == ["user_error"]
    wait_for(lambda: not in_queue(job_id, env), 60, "the job to leave the queue")


def preempted_run(args: list[str], slurm_env: dict[str, str], tmp_path: Path, site: Path) -> tuple[str, dict]:
    """Submit ``args`` (an exclusive one-node run of at least 100 batches), paced to at most 10
    batches a second, preempt it once it passes batch 20, and wait for it to end: its job id and
    results. ``site``: the test plugins (the ``test_site`` fixture)."""
    env = with_site(dict(slurm_env, HPC_LLM_RUNS=str(tmp_path / "runs")), site)
    job_id, run_dir = submit([*args, *PACE], env, tmp_path)
    rank_at(run_dir, 0, 20)
    preempt(job_nodes(job_id, env), env)
    return job_id, finished(run_dir, 300)


def test_a_stop_over_budget_fails_with_the_reason(slurm_env, tmp_path):
    env = dict(slurm_env, HPC_LLM_RUNS=str(tmp_path / "runs"))
    job_id, run_dir = submit([*ALONE, "train.max_duration=5000ba", "fault.max_preemptions=0"], env, tmp_path)
    rank_at(run_dir, 0, 2)
    # a stop signal sent by hand counts against the preemption budget
    subprocess.run(["scancel", "--batch", "--signal=USR2", job_id], env=env, check=True)
    r = finished(run_dir, 120)
    assert r["status"] == "failed" and "fault.max_preemptions=0 reached" in r["error"]
    [a] = r["attempts"]
    assert (a["state"], a["cause"], a["action"]) == ("stopped", "signal", "fail")
    assert r["checkpoint"] and Path(r["checkpoint"]).exists()  # saved before stopping: resumable by hand
    wait_for(lambda: not in_queue(job_id, env), 60, "the job to end")


@pytest.mark.long
@pytest.mark.timeout(1800)  # ~6 attempts of a minute each here, and the reference run
def test_time_limits_and_a_preemption_requeue_until_done(slurm_env, test_site, tmp_path, pytestconfig):
    """A 1-minute time limit stands in for 24 h: the run needs several, and is preempted once.

    The ranks stop 20 s before each limit (fault.stop_lead_s; Slurm's own signal
    is asked for at 45 s and held back until then; slurmctld may send it that early
    that it is lost, and then the supervisor stops them at 20 s itself), save, and
    the job is requeued.

    Sized by the pace, not by this machine's speed: at 2 batches a second an attempt trains
    at most ~64 batches (a minute, less the 20 s lead and a start-up of 8 s or more), so 220
    batches need at least three full attempts besides the preempted one, however fast the
    machine (a slower one needs more attempts, each still a time limit).
    """
    args = [
        *ALONE,
        "train.max_duration=220ba",
        "resources.time=1",
        "hydra.launcher.signal_lead_s=45",
        "fault.stop_lead_s=20",
        "checkpoint.keep=2",  # a checkpoint every epoch (78 batches) and at every stop
    ]
    ref = reference([*ALONE, "train.max_duration=220ba"], slurm_env, pytestconfig)
    env = with_site(dict(slurm_env, HPC_LLM_RUNS=str(tmp_path / "runs")), test_site)
    job_id, run_dir = submit([*args, *paced(0.5)], env, tmp_path)
    # preempt the second attempt once it trains
    wait_for(
        lambda: (
            len(attempts(run_dir)) >= 2
            and attempts(run_dir)[-1]["state"] == "running"
            and beat(run_dir, 0).get("batch", -1) > attempts(run_dir)[-1]["resumed_at_batch"]
        ),
        600,
        "the second attempt to train",
    )
    preempt(job_nodes(job_id, env), env)
    r = finished(run_dir, 1200)
    same_loss(r, ref)
    causes = r["restarts_by_cause"]
    assert causes.get("time_limit", 0) >= 3 and causes.get("preemption") == 1, causes
    assert set(causes) == {"time_limit", "preemption"}
    # every stop was a save at a batch boundary, except a preemption that lands after the
    # time-limit warning went out (Slurm signals a job once; it SIGTERMs the steps instead):
    # that attempt is killed unsaved and resumes from the last checkpoint (the loss still matches)
    [preempted] = [a for a in r["attempts"] if a["cause"] == "preemption"]
    unsaved = preempted["signal_to_requeue_s"] is None
    assert not unsaved or "warning signal was spent" in preempted["error"], preempted
    # the others saved at the signal, or (a busy machine: a start-up that eats the minute) met
    # the limit before training a batch, which loses nothing (seen under a load of 8 on 2 cores)
    for a in r["attempts"][:-1]:
        if a is not preempted and a["signal_to_requeue_s"] is None:
            assert a["cause"] == "time_limit" and a["last_batch"] <= a["resumed_at_batch"], a
    assert r["batches_lost"] == 0 or unsaved, r["batches_lost"]
    assert r["total_wallclock_s"] > sum(a["train_s"] for a in r["attempts"])
    assert 0 < r["goodput"] < 1 and r["slurm_job_ids"] == [job_id]
    # keep-last-2 over the run's life, not per attempt: at most one unfinished save beside them
    folder = Path(run_dir) / "checkpoints"
    saves = sorted(p.name for p in folder.glob("ep*"))
    aside = sorted(p.name for p in (folder / "unfinished").glob("*")) if (folder / "unfinished").is_dir() else []
    assert len(saves) <= 2 and len(aside) <= 1, (saves, aside)
    # what a user sees after it: hpc-llm status, and Slurm's accounting of every attempt under one
    # job id (the preempted one REQUEUED when the supervisor's own requeue beat the end of the
    # grace time, PREEMPTED when slurmctld's grace-time check came first: both seen here)
    wait_for(lambda: not in_queue(job_id, env), 60, "the job to leave the queue")
    status = run_cli(["status"], env)
    row = next(ln for ln in status.stdout.splitlines() if f" {job_id} " in ln)
    assert "COMPLETED" in row
    states = [state for state, _ in slurm_attempts(job_id, env)]
    assert states[-1] == "COMPLETED" and {"PREEMPTED", "REQUEUED"} & set(states), states
    shown = run_cli(["status", job_id], env)
    assert "preemption" in shown.stdout and "time_limit" in shown.stdout, explain(shown)


# HSDP on 2 nodes x 2 ranks shards within a node and replicates across: it covers FSDP's sharded
# save and load (the FSDP-only case ran beside it until CI's budget asked for one)
@pytest.mark.parametrize(
    "layout",
    [["parallelism=hsdp", "resources.nodes=2", "resources.tasks_per_node=2"]],
    ids=["hsdp-4-ranks"],
)
def test_sharded_checkpoints_resume_after_a_preemption(layout, slurm_env, test_site, tmp_path, pytestconfig):
    args = [
        "+experiment=mpt_tiny",
        "hydra/launcher=slurm",
        "eval=none",
        "hydra.launcher.exclusive=true",
        "train.max_duration=120ba",
        # once in a full suite under load (2026-11-24), one rank of the resumed HSDP attempt never
        # joined the rendezvous (TCPStore "3/4 clients joined"); the run recovered by restarting
        # the step, but only after the 600 s dist timeout. The start-up watchdog ends such a
        # start sooner, as it would on a cluster.
        "fault.startup_timeout_s=180",
        *layout,
    ]
    ref = reference(args, slurm_env, pytestconfig)
    env = with_site(dict(slurm_env, HPC_LLM_RUNS=str(tmp_path / "runs")), test_site)
    job_id, run_dir = submit([*args, *PACE], env, tmp_path)
    rank_at(run_dir, 0, 15)
    preempt(job_nodes(job_id, env), env)
    r = finished(run_dir, 600)
    same_loss(r, ref)
    first, *_, last = r["attempts"]  # a start-up restart in between, if one hung (see above)
    assert first["cause"] == "preemption" and last["resumed_at_batch"] == first["stopped_at_batch"] > 0
    # each shard written by its own rank: a directory of .distcp files, not one rank-0 file
    # (FSDP: one per rank; HSDP: one per shard, the replicas hold the same ones)
    ckpt = Path(r["checkpoint"])
    shards = 2 if "parallelism=hsdp" in layout else r["world_size"]
    assert ckpt.is_dir() and len(list(ckpt.glob("*.distcp"))) == shards
    if "parallelism=hsdp" in layout:
        assert r["device_mesh"] == {"data_parallel_replicate": 2, "data_parallel_shard": 2}


def scontrol_job(job_id: str, env: dict[str, str]) -> dict[str, str]:
    out = subprocess.run(["scontrol", "-o", "show", "job", job_id], env=env, capture_output=True, text=True, check=True)
    return dict(kv.split("=", 1) for kv in out.stdout.split() if "=" in kv)


#: a stop the ranks were asked for and saved at
STOPS = {"time_limit", "signal"}
