"""The fabric fails too (issue #42): links cut, cut and healed, slowed, on a dev cluster whose
nodes are hosts of their own (``hpc-llm dev-cluster up --hosts``), real Slurm, real training.

Each test runs mpt_tiny on 2 nodes of a 3-node multi-host cluster of its own (a cut link must
hit no other test's job), does to a node's link what a switch does, and checks that the run ends
``completed`` with the uninterrupted run's final loss (tests/test_faults.py's shared reference),
no healthy node in any attempt's ``suspects``, and (the batch host's cases) a record that never
said ``failed`` while Slurm still held the job, and a job never held. A node cut off is found by
the job as a dead one (its probe unanswered); the batch host cut off finds itself cut off (every
other agent lost, slurmctld silent), blames itself, writes nothing, and stands down: Slurm calls
it DOWN and requeues the job, whose next start books the attempt from Slurm's record.
"""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path

import pytest

from hpc_llm.rundir.layout import RunDir
from tests.conftest import hosts_cluster_of_its_own, run_cli, with_site
from tests.jobs import attempts, finished, in_queue, job_nodes, results, story, submit, wait_for
from tests.test_faults import PACE, SHORT, node_state, rank_at, reference, same_loss, scontrol_job

pytestmark = [pytest.mark.slurm]

#: hangs named after 20 s (SHORT), a checkpoint every 5 batches. Not --exclusive: the cluster is
#: the test's own, and on Slurm 22.05 an exclusive job requeued while one of its nodes is dead
#: stays PENDING (BadConstraints) for good (docs/design/verified/slurm.md)
RUN = [*SHORT, *PACE]


def placed(job_id: str, env: dict[str, str]) -> tuple[str, str]:
    """(batch host, the other node) of a running 2-node job."""
    host = scontrol_job(job_id, env)["BatchHost"]
    [other] = [n for n in job_nodes(job_id, env) if n != host]
    return host, other


class Watch:
    """What the run's record and Slurm said, sampled every 3 s while the run goes on: the
    record's status while Slurm held the job, and the job's states (a HELD job would show)."""

    def __init__(self, job_id: str, run_dir: Path, env: dict[str, str]) -> None:
        self.said: list[tuple[str, str | None]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._sample, args=(job_id, run_dir, env), daemon=True)
        self.thread.start()

    def _sample(self, job_id: str, run_dir: Path, env: dict[str, str]) -> None:
        while not self.stop.wait(3.0):
            shown = run_cli(["status", job_id], env, timeout=60)
            status = (results(run_dir) or {}).get("status")
            self.said.append((shown.stdout, status))

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=90)

    def never_failed_nor_held(self) -> None:
        for stdout, status in self.said:
            assert "HELD" not in stdout, stdout
            assert status != "failed", self.said
            assert "FAILED" not in stdout, stdout


def slurm_story(cluster, job_id: str, env: dict[str, str]) -> str:
    """What Slurm says of the job and its nodes, and slurmctld's log's last lines: for a failed
    assertion."""
    out = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T|%r|%N"], env=env, capture_output=True, text=True)
    nodes = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T %E"], env=env, capture_output=True, text=True)
    log = (cluster.root / "log" / "slurmctld.log").read_text(errors="replace").splitlines()[-40:]
    return "\n".join([f"squeue: {out.stdout.strip()}", f"sinfo:\n{nodes.stdout.strip()}", *log])


def finished_or_told(cluster, job_id: str, run_dir: Path, env: dict[str, str], timeout_s: float) -> dict:
    """The run's results once it ended; failing that, the run's story and Slurm's."""
    try:
        return finished(run_dir, timeout_s)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{story(run_dir)}\n{slurm_story(cluster, job_id, env)}") from None


def no_healthy_node_blamed(r: dict, culprit: str) -> None:
    blamed = {n for a in r["attempts"] for n in a["suspects"]}
    assert blamed <= {culprit}, r["attempts"]


def test_a_worker_cut_off_for_good_is_swapped_for_the_spare(slurm_env, app_env, test_site, tmp_path, pytestconfig):
    """A worker's link down for good, with a spare (24.11): its agent goes silent and its probe gets
    no answer (the host is gone for the batch host), slurmctld answers the supervisor: the node
    is dead, the spare takes its place in the same job."""
    from hpc_llm.devcluster import fabric

    ref = reference(SHORT, slurm_env, pytestconfig)
    with hosts_cluster_of_its_own(pytestconfig, "24.11") as cluster:
        env = with_site(dict(app_env, **cluster.env(), HPC_LLM_RUNS=str(tmp_path / "runs")), test_site)
        job_id, run_dir = submit(
            [*RUN, "resources.spare_nodes=1", "hydra.launcher.exclusive=true", "fault.hang_floor_s=5"], env, tmp_path
        )
        victim = rank_at(run_dir, 1, 8)["node"]  # node rank 1: a training node, not the spare
        host = scontrol_job(job_id, env)["BatchHost"]
        assert victim != host
        fabric.cut(cluster, victim)
        cut_at = time.time()
        try:
            r = finished(run_dir, 420)
        finally:
            fabric.heal(cluster, victim)
        same_loss(r, ref)
        first = r["attempts"][0]
        assert (first["cause"], first["action"], first["suspects"]) == ("node_failure", "swap", [victim]), story(
            run_dir
        )
        assert "no answer from the host" in first["error"] or "unanswered" in first["error"], first["error"]
        detected = attempts(run_dir)[0]["detected_at"]  # attempts.json: results.json's summary has no times
        assert detected - cut_at < 10, (cut_at, detected)
        assert r["slurm_job_ids"] == [job_id] and {a["restart"] for a in r["attempts"]} == {0}
        assert victim not in r["attempts"][-1]["nodes"] and host in r["attempts"][-1]["nodes"]
        assert r["given_back_nodes"] == [victim], r  # cut off, still in the job: given back to Slurm
        no_healthy_node_blamed(r, victim)


def test_the_batch_host_cut_off_with_a_spare_an_agent_takes_over_in_the_same_job(
    slurm_env, app_env, test_site, tmp_path, pytestconfig
):
    """The batch host's link down for good, a spare (24.11): Slurm takes the host out of the
    --no-kill job and keeps it RUNNING without its batch script. The other nodes' agents lose
    their supervisor; once slurmctld finds the host not responding, the first one takes the
    supervisor's place in the same job (no requeue, no wait for cred_expire), starts new agents
    without the cut host, and the spare trains in its place. The lost generation is booked on
    the cut host alone, as a swap; the new supervisor cancels its job once the run completed
    (no batch script is left to end it)."""
    from hpc_llm.devcluster import fabric

    ref = reference(SHORT, slurm_env, pytestconfig)
    with hosts_cluster_of_its_own(pytestconfig, "24.11") as cluster:
        env = with_site(dict(app_env, **cluster.env(), HPC_LLM_RUNS=str(tmp_path / "runs")), test_site)
        job_id, run_dir = submit([*RUN, "resources.spare_nodes=1", "hydra.launcher.exclusive=true"], env, tmp_path)
        rank_at(run_dir, 1, 8)
        host = scontrol_job(job_id, env)["BatchHost"]
        watch = Watch(job_id, run_dir, env)
        fabric.cut(cluster, host)
        try:
            r = finished_or_told(cluster, job_id, run_dir, env, 420)
        finally:
            watch.close()
        try:
            same_loss(r, ref)
            first = attempts(run_dir)[0]
            what = (first["state"], first["cause"], first["action"], first["suspects"], first["left_out"])
            assert what == ("lost", "node_failure", "swap", [host], [host]), first
            assert "took its place in the same job" in first["error"], first["error"]
            assert r["slurm_job_ids"] == [job_id] and {a["restart"] for a in r["attempts"]} == {0}, r["attempts"]
            assert host not in r["attempts"][-1]["nodes"], r["attempts"][-1]
            no_healthy_node_blamed(r, host)
            watch.never_failed_nor_held()
            [log] = [p for p in RunDir(run_dir).attempt_logs(job_id) if p.name != f"slurm-{job_id}.0.out"]
            assert "taken over" in log.read_text() or "previous generation" in log.read_text(), log.read_text()[-3000:]
            # no batch script is left to end the job: the new supervisor cancelled it
            try:
                wait_for(lambda: not in_queue(job_id, env), 120, "the job to leave the queue")
            except AssertionError as exc:
                logs = "\n".join(p.read_text()[-2000:] for p in RunDir(run_dir).attempt_logs(job_id))
                raise AssertionError(f"{exc}\n{logs}\n{slurm_story(cluster, job_id, env)}") from None
        finally:
            fabric.heal(cluster, host)


# one e2e per fault class (issue #50): the cut that heals, where the supervisor resumes command;
# the cut for good (Slurm calls the host DOWN and requeues the job) runs in the simulator
@pytest.mark.parametrize("heal_after_s", [40], ids=["40s-then-healed"])
def test_the_batch_host_cut_off_stands_down_and_the_run_completes_elsewhere(
    slurm_env, app_env, test_site, tmp_path, pytestconfig, heal_after_s
):
    """The batch host's link down (for good, or for 40 s), no spare. Its supervisor loses the
    other node's agent and cannot reach slurmctld: it blames itself, writes no verdict, ends its
    node's agent and ranks and stands down (before: it blamed the healthy node and wrote the run
    failed while Slurm requeued it; healed, its stale processes got the job held). Slurm calls the
    host DOWN and requeues the job; the next start books the attempt from Slurm (node_failure on
    the batch host alone). The record never says failed while Slurm holds the job, the job is
    never held, and the healed host is not drained."""
    from hpc_llm.devcluster import fabric

    ref = reference(SHORT, slurm_env, pytestconfig)
    with hosts_cluster_of_its_own(pytestconfig, "22.05", accounting=True) as cluster:
        env = with_site(dict(app_env, **cluster.env(), HPC_LLM_RUNS=str(tmp_path / "runs")), test_site)
        job_id, run_dir = submit(RUN, env, tmp_path)
        rank_at(run_dir, 1, 8)
        host, _other = placed(job_id, env)
        watch = Watch(job_id, run_dir, env)
        fabric.cut(cluster, host, for_s=heal_after_s)
        try:
            r = finished(run_dir, 600)
        finally:
            watch.close()
            fabric.heal(cluster, host)
        same_loss(r, ref)
        first = r["attempts"][0]
        assert (first["state"], first["cause"], first["suspects"]) == ("lost", "node_failure", [host]), story(run_dir)
        assert r["attempts"][-1]["restart"] >= 1
        no_healthy_node_blamed(r, host)
        watch.never_failed_nor_held()
        log = (Path(run_dir) / "logs" / f"slurm-{job_id}.0.out").read_text()
        assert "stands down" in log and "cut off" in log, log[-3000:]
        wait_for(lambda: not in_queue(job_id, env), 60, "the job to leave the queue")
        if heal_after_s is not None:
            wait_for(lambda: "down" not in node_state(host, env), 120, f"{host} back in service")
            assert "drain" not in node_state(host, env), node_state(host, env)


def test_the_batch_host_partitioned_from_the_other_nodes_blames_itself_not_them(
    slurm_env, app_env, test_site, tmp_path, pytestconfig
):
    """A 3-node run on a 4-node cluster (22.05): the batch host and the job's two other nodes stop
    reaching each other (a partition: every one of them still reaches slurmctld). The supervisor
    loses both agents at once while slurmctld answers it and finds both nodes responding: it
    blames its own host, not the two it cannot see, and requeues without it (before: both
    healthy nodes were blamed and left out). The run completes elsewhere with the uninterrupted
    run's loss; the record never says failed, and the job is never held."""
    from hpc_llm.devcluster import fabric

    three = ["resources.nodes=3", "train.global_train_batch_size=6", "train.device_train_microbatch_size=2"]
    ref = reference([*SHORT, *three], slurm_env, pytestconfig)
    with hosts_cluster_of_its_own(pytestconfig, "22.05", nodes=4) as cluster:
        env = with_site(dict(app_env, **cluster.env(), HPC_LLM_RUNS=str(tmp_path / "runs")), test_site)
        job_id, run_dir = submit([*RUN, *three], env, tmp_path)
        rank_at(run_dir, 1, 8)
        host = scontrol_job(job_id, env)["BatchHost"]
        others = [n for n in job_nodes(job_id, env) if n != host]
        assert len(others) == 2, others
        watch = Watch(job_id, run_dir, env)
        fabric.partition(cluster, host, others)
        try:
            r = finished_or_told(cluster, job_id, run_dir, env, 600)
        finally:
            watch.close()
            fabric.mend(cluster, host, others)
        same_loss(r, ref)
        first = r["attempts"][0]
        assert (first["cause"], first["action"], first["suspects"]) == ("node_failure", "requeue", [host]), story(
            run_dir
        )
        assert "a partition" in first["error"], first["error"]
        assert host not in r["attempts"][-1]["nodes"], r["attempts"][-1]
        no_healthy_node_blamed(r, host)
        watch.never_failed_nor_held()


def test_a_slowed_link_is_no_fault(slurm_env, app_env, test_site, tmp_path, pytestconfig):
    """A worker's link slowed (tbf) for 30 s while the run trains: the collectives take longer, the
    heartbeats still come: no verdict, no restart."""
    from hpc_llm.devcluster import fabric

    ref = reference(SHORT, slurm_env, pytestconfig)
    with hosts_cluster_of_its_own(pytestconfig, "22.05") as cluster:
        env = with_site(dict(app_env, **cluster.env(), HPC_LLM_RUNS=str(tmp_path / "runs")), test_site)
        job_id, run_dir = submit(RUN, env, tmp_path)
        rank_at(run_dir, 1, 5)
        _host, victim = placed(job_id, env)
        fabric.slow(cluster, victim)
        try:
            time.sleep(30)  # the fault's duration, not a wait for a result
        finally:
            fabric.unslow(cluster, victim)
        r = finished(run_dir, 420)
        same_loss(r, ref)
        assert r["restarts"] == 0 and len(r["attempts"]) == 1, story(run_dir)
