"""Data streamed from s3:// and checkpoints saved, resumed and pruned on s3://, against a real S3
server (SeaweedFS, started beside the dev cluster: tests/conftest.py ``s3``).

The end-to-end runs go through ``python -m hpc_llm ... hydra/launcher=slurm`` on the dev cluster
with ``cluster.scratch`` outside /tmp (a job's /tmp is a private tmpfs, which would hide a stale
copy of a checkpoint on a node) and are paced (tests/jobs.py ``paced``), so no assertion depends
on how fast this machine trains. Reference runs are uninterrupted runs of the same config,
shared through tests/test_faults.py's ``reference``.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import stat
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.conftest import _free_port_block, explain, run_app, run_cli, shared_dir, with_site
from tests.jobs import ALONE, attempts, beat, finished, in_queue, job_nodes, paced, preempt, submit, wait_for
from tests.test_faults import rank_at, reference, same_loss
from tests.test_seed_experiments import write_c4_like

CHECKPOINT_FILE = re.compile(r"^ep\d+-ba\d+(-rank\d+\.pt)?$")


def s3_client(server, secret: str | None = None):
    import boto3

    return boto3.client(
        "s3",
        endpoint_url=server.endpoint,
        aws_access_key_id=server.access_key,
        aws_secret_access_key=secret or server.secret_key,
        region_name="us-east-1",
    )


def keys(server, prefix: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for page in s3_client(server).get_paginator("list_objects_v2").paginate(Bucket=server.bucket, Prefix=prefix):
        out.update({o["Key"]: o["Size"] for o in page.get("Contents") or []})
    return out


def saves_in(server, folder_key: str) -> set[str]:
    """The saves (ep*-ba*) at the top of a checkpoint folder, and under its unfinished/."""
    found = set()
    for key in keys(server, folder_key + "/"):
        rel = key[len(folder_key) + 1 :].split("/")
        if CHECKPOINT_FILE.match(rel[0]) or (rel[0] == "unfinished" and len(rel) > 1):
            found.add("/".join(rel[:2]) if rel[0] == "unfinished" else rel[0])
    return found


def latest_batch(server, folder_key: str) -> int | None:
    try:
        body = s3_client(server).get_object(Bucket=server.bucket, Key=f"{folder_key}/latest-rank0.pt.symlink")["Body"]
    except Exception:
        return None
    return int(re.search(r"-ba(\d+)", body.read().decode()).group(1))


def one_line(proc: subprocess.CompletedProcess) -> str:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("hpc_llm: error: "), explain(proc)
    assert "Traceback" not in proc.stdout + proc.stderr
    return lines[0]


# -- the data: C4-shaped MDS written to the store by `hpc-llm data prepare` ---------------------------


@pytest.fixture(scope="session")
def tiny_tokenizer(cache_dir: Path) -> Path:
    from hpc_llm.data import tiny_corpus

    tokenizer, _ = tiny_corpus.ensure(cache_dir)
    return tokenizer


@pytest.fixture(scope="session")
def s3_c4(s3, tiny_tokenizer: Path, pytestconfig: pytest.Config) -> str:
    """``hpc-llm data prepare c4 --out s3://...`` from C4-layout files, once per session (the
    first process to ask, under a lock): LLM Foundry's converter, Streaming's MDSWriter uploading."""
    where = shared_dir(pytestconfig) / "s3-c4"
    where.mkdir(parents=True, exist_ok=True)
    uri = s3.uri("data/c4")
    with open(where / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if "data/c4/val_small/index.json" not in keys(s3, "data/c4/"):  # this server's, not a marker's
            source = write_c4_like(where / f"allenai-c4-{uuid.uuid4().hex[:6]}")
            env = {**os.environ, **s3.env()}
            proc = run_cli(
                [
                    "data",
                    "prepare",
                    "c4",
                    "--out",
                    uri,
                    "--source",
                    str(source),
                    "--splits",
                    "train,val_small",
                    f"data.options.tokenizer={tiny_tokenizer}",
                    "data.options.concat_tokens=128",
                ],
                env,
                timeout=600,
            )
            assert proc.returncode == 0, explain(proc)
    return uri


def data_args(s3_c4: str, tokenizer: Path) -> list[str]:
    return ["data=c4", f"data.remote={s3_c4}", f"data.options.tokenizer={tokenizer}"]


@pytest.fixture(scope="session")
def s3_tiny(s3, cache_dir: Path, pytestconfig: pytest.Config) -> str:
    """``hpc-llm data prepare tiny_corpus --out s3://hpc-llm/data/tiny`` (the README's), once per
    session: the bundled corpus's MDS splits in the store, the runs below stream them."""
    where = shared_dir(pytestconfig) / "s3-tiny"
    where.mkdir(parents=True, exist_ok=True)
    uri = s3.uri("data/tiny")
    with open(where / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if "data/tiny/val/index.json" not in keys(s3, "data/tiny/"):
            env = {**os.environ, **s3.env(), "HPC_LLM_CACHE": str(cache_dir)}
            proc = run_cli(["data", "prepare", "tiny_corpus", "--out", "s3://hpc-llm/data/tiny"], env, timeout=300)
            assert proc.returncode == 0 and f"wrote {uri}/train" in proc.stdout, explain(proc)
    return uri


# -- without Slurm ------------------------------------------------------------------------------


def test_the_dev_s3_server_takes_only_its_key_listens_on_localhost_and_phones_nobody(s3):
    import botocore.exceptions

    from hpc_llm.devcluster import s3_server

    s3_client(s3).list_objects_v2(Bucket=s3.bucket, MaxKeys=1)  # its own key: fine
    with pytest.raises(botocore.exceptions.ClientError) as wrong:
        s3_client(s3, secret="not-the-secret").list_objects_v2(Bucket=s3.bucket)
    assert wrong.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
    pid = s3_server.pid_of(s3)
    assert pid is not None
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    for flag in (b"-master.telemetry=false", b"-webdav=false", b"-admin.ui=false", b"-ip.bind=127.0.0.1"):
        assert flag in argv
    # every socket it listens on is on 127.0.0.1 (/proc/net/tcp: local address 0100007F)
    inodes = {os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}
    listening = [
        line.split()
        for line in Path("/proc/net/tcp").read_text().splitlines()[1:]
        + Path("/proc/net/tcp6").read_text().splitlines()[1:]
        if line.split()[3] == "0A" and f"socket:[{line.split()[9]}]" in inodes
    ]
    assert listening and all(f[1].split(":")[0] in ("0100007F", "0000000000000000FFFF00000100007F") for f in listening)
    assert stat.S_IMODE((s3.root / "s3" / "identity.json").stat().st_mode) == 0o600


def check_line(targets: list[dict], env: dict[str, str]) -> tuple[int, list[str]]:
    """The store check as the login side runs it: ``python -m hpc_llm.job.rank.store_check``."""
    proc = subprocess.run(
        [sys.executable, "-m", "hpc_llm.job.rank.store_check", json.dumps({"targets": targets})],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return proc.returncode, proc.stdout.strip().splitlines()


@pytest.mark.stack  # s3_c4: LLM Foundry's converter
def test_the_store_check_names_what_is_wrong_in_one_line(s3, s3_env, s3_c4):
    ck = {"key": "checkpoint.location", "uri": s3.uri(f"ck-{uuid.uuid4().hex[:6]}"), "role": "checkpoint_folder"}
    data = {"key": "data.remote", "uri": s3_c4, "role": "data", "splits": ["train", "val_small"]}
    rc, lines = check_line([ck, data], s3_env)
    assert rc == 0 and [ln.split("\t")[0] for ln in lines] == ["ok", "ok"], lines
    cases = [
        ({"AWS_SECRET_ACCESS_KEY": "wrong"}, ck, "refused the credentials (SignatureDoesNotMatch)"),
        ({"AWS_ACCESS_KEY_ID": "nobody"}, ck, "refused the credentials"),
        ({}, dict(ck, uri="s3://no-such-bucket/x"), "no bucket 'no-such-bucket'"),
        ({}, dict(data, splits=["train", "val_nope"]), "no MDS split 'val_nope'"),
        ({"S3_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_ENDPOINT_URL": "http://127.0.0.1:9"}, ck, "cannot reach"),
    ]
    for change, target, expected in cases:
        rc, lines = check_line([target], {**s3_env, **change})
        assert rc == 1 and len(lines) == 1 and lines[0].startswith("fail\t"), (change, lines)
        assert expected in lines[0] and lines[0].split("\t")[1].startswith(f"{target['key']}="), (change, lines)
    no_keys = {k: v for k, v in s3_env.items() if k not in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
    rc, lines = check_line([ck], {**no_keys, "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent", "AWS_CONFIG_FILE": "/none"})
    assert rc == 1 and "no credentials for the store" in lines[0], lines


def test_a_job_using_a_store_gets_its_client_variables_by_name_whatever_the_profile(app_env, tiny_tokenizer):
    secret = "s3cr3t-value-never-written"
    env = dict(app_env, AWS_SECRET_ACCESS_KEY=secret)
    for profile in ([], ["cluster=h100"]):
        proc = run_cli(
            ["render", "+experiment=mpt_tiny", *profile, "checkpoint=uri", "checkpoint.location=s3://b/ck"], env
        )
        assert proc.returncode == 0, explain(proc)
        exported = re.search(r"#SBATCH --export=(\S+)", proc.stdout).group(1).split(",")
        for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
            assert name in exported, (profile, name)
        for name in ("AWS_DEFAULT_REGION", "AWS_REGION", "S3_ENDPOINT_URL", "AWS_ENDPOINT_URL"):
            assert name in exported, (profile, name)
        assert secret not in proc.stdout
    plain = run_cli(["render", "+experiment=mpt_tiny"], env)
    assert plain.returncode == 0 and "AWS_" not in plain.stdout, explain(plain)
    # data streamed from a store is enough
    data = run_cli(["render", "+experiment=mpt_tiny", *data_args("s3://b/c4", tiny_tokenizer)], env)
    assert data.returncode == 0 and "S3_ENDPOINT_URL" in data.stdout, explain(data)


def train_config(args: list[str], env: dict[str, str]) -> dict:
    import yaml

    proc = run_cli(["config", *args], env)
    assert proc.returncode == 0, explain(proc)
    return yaml.safe_load(proc.stdout)


def test_uri_checkpoints_go_to_a_folder_per_run_and_only_what_composer_can_save_to_is_taken(app_env, tmp_path):
    env = dict(app_env, HPC_LLM_RUNS=str(tmp_path / "runs"))
    cfg = train_config(["+experiment=mpt_tiny", "checkpoint=uri", "checkpoint.location=s3://b/ck/"], env)
    assert cfg["save_folder"].startswith("s3://b/ck/mpt_tiny-") and cfg["save_num_checkpoints_to_keep"] == 0
    as_is = train_config(
        ["+experiment=mpt_tiny", "checkpoint=uri", "checkpoint.location=s3://b/ck", "checkpoint.run_subdir=false"], env
    )
    assert as_is["save_folder"] == "s3://b/ck"
    for location, expected in (
        ("sftp://host/ck", "not an object-store URI Composer can save to; allowed: s3://bucket/path"),
        ("s3:///ck", "no bucket"),
        ("/local/ck", "not an object-store URI"),
    ):
        proc = run_app(["+experiment=mpt_tiny", "checkpoint=uri", f"checkpoint.location={location}"], env, cwd=tmp_path)
        assert expected in one_line(proc)
    dbfs = train_config(["+experiment=mpt_tiny", "checkpoint=uri", "checkpoint.location=dbfs:/Volumes/c/s/v/ck"], env)
    assert dbfs["save_folder"].startswith("dbfs:/Volumes/c/s/v/ck/")
    proc = run_app(["+experiment=mpt_tiny", "checkpoint.resume_other=true"], env, cwd=tmp_path)
    assert "checkpoint.resume_other=True is for object stores (checkpoint=uri)" in one_line(proc)
    # two points of one sweep at one folder (a dry run, with or without Slurm: a config error all the same)
    shared = ["checkpoint=uri", "checkpoint.location=s3://b/x", "checkpoint.run_subdir=false"]
    sweep = ["+experiment=mpt_tiny", "hydra/launcher=slurm", *shared, "train.max_duration=2ba,3ba"]
    proc = run_app([*sweep, "hydra.launcher.dry_run=true"], env, cwd=tmp_path)
    assert proc.returncode == 2, explain(proc)
    assert "jobs 0 and 1 of this sweep would write their checkpoints to one folder (s3://b/x)" in proc.stderr
    assert not (tmp_path / "runs").exists()


def test_shards_streamed_from_a_store_are_cached_on_each_node_not_in_the_shared_data_folder(app_env, tiny_tokenizer):
    cfg = train_config(
        ["+experiment=mpt_tiny", *data_args("s3://b/c4", tiny_tokenizer), "data.path=/shared/c4"], app_env
    )
    dataset = cfg["train_loader"]["dataset"]
    assert dataset["remote"] == "s3://b/c4" and dataset["local"] == "streaming_cache/c4"
    assert dataset["download_retry"] >= 10  # a store down for minutes does not fail the run
    remote = train_config(
        [
            "+experiment=mpt_tiny",
            "data=remote_mds",
            "data.remote=s3://b/x",
            "data.path=cache/x",
            f"+train.tokenizer.name={tiny_tokenizer}",
        ],
        app_env,
    )
    assert remote["train_loader"]["dataset"]["local"] == "cache/x"  # relative: under the node-local cwd
    tiny = train_config(["+experiment=mpt_tiny", "data.remote=s3://b/tiny"], app_env)["train_loader"]["dataset"]
    assert (tiny["remote"], tiny["local"]) == ("s3://b/tiny", "streaming_cache/tiny_corpus")


@pytest.mark.stack  # s3_c4: LLM Foundry's converter
def test_data_prepare_writes_mds_to_s3_once_and_says_what_is_wrong_in_one_line(s3, s3_env, s3_c4, tiny_tokenizer):
    found = keys(s3, "data/c4/")
    assert {"data/c4/train/index.json", "data/c4/val_small/index.json"} <= set(found)
    assert any(k.endswith(".mds.zstd") for k in found)
    again = run_cli(
        ["data", "prepare", "c4", "--out", s3_c4, "--source", "/nonexistent", "--splits", "train"], s3_env, timeout=300
    )
    assert f"{s3_c4}: split 'train' exists already in the store" in one_line(again)
    wrong = run_cli(
        ["data", "prepare", "c4", "--out", s3.uri("data/other"), "--source", "/nonexistent"],
        dict(s3_env, AWS_SECRET_ACCESS_KEY="wrong"),
        timeout=300,
    )
    assert "refused the credentials" in one_line(wrong)


def test_keep_last_k_unfinished_saves_and_the_owner_in_the_store(s3, s3_env):
    """The store side of checkpoint=uri against the real server: a save never linked is set aside,
    keep-last-K never removes the linked one, and another run's folder is refused."""
    code = """
import json, sys
from hpc_llm.job.rank import checkpoint_store as cs
from hpc_llm.job.rank.object_store import Store
store, loc = Store.of(sys.argv[1])
cs.claim(store, loc, "run-a", "/runs/a", resume_other=False)
for b in (5, 10, 15, 20, 25):
    store.put(loc.key(f"ep0-ba{b}-rank0.pt"), b"x" * b)
cs.commit_latest(store, loc.key("latest-rank0.pt.symlink"), loc.key("ep0-ba20-rank0.pt"))
moved = cs.set_aside_unfinished(store, loc)
removed = cs.prune(store, loc, keep=2)
try:
    cs.claim(store, loc, "run-b", "/runs/b", resume_other=False)
    refused = None
except Exception as e:
    refused = str(e)
cs.claim(store, loc, "run-b", "/runs/b", resume_other=True)
print(json.dumps({"moved": moved, "removed": removed, "refused": refused, "owner": cs.owner(store, loc),
                  "latest": cs.latest(store, loc)}))
"""
    folder = f"unit-{uuid.uuid4().hex[:6]}"
    proc = subprocess.run([sys.executable, "-c", code, s3.uri(folder)], env=s3_env, capture_output=True, text=True)
    assert proc.returncode == 0, explain(proc)
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["moved"] == [f"{folder}/unfinished/ep0-ba25-rank0.pt"]
    assert sorted(out["removed"]) == [f"{folder}/ep0-ba10-rank0.pt", f"{folder}/ep0-ba5-rank0.pt"]
    assert saves_in(s3, folder) == {"ep0-ba15-rank0.pt", "ep0-ba20-rank0.pt", "unfinished/ep0-ba25-rank0.pt"}
    assert out["latest"] == [f"{folder}/ep0-ba20-rank0.pt", 20]
    assert "holds the checkpoints of run 'run-a' (run dir /runs/a), not this run's (run-b)" in out["refused"]
    assert out["owner"]["run"] == "run-b" and out["owner"]["resumed_from"]["run"] == "run-a"


@pytest.mark.slurm  # starts a dev cluster of its own (slurmctld, slurmd, slurmdbd on MariaDB) beside the server
def test_dev_cluster_up_s3_prints_the_exports_a_client_needs_and_down_stops_it(app_env, tmp_path):
    """``eval "$(hpc-llm dev-cluster up --nodes 3 --s3)"``, a bucket listed with what it exported,
    then ``down`` (in a root and on ports of its own)."""
    import shutil

    if os.geteuid() != 0 or shutil.which("slurmctld") is None:
        pytest.skip("needs Debian slurm-wlm and root (scripts/setup-dev.sh installs it)")
    root = tmp_path / "cluster"
    extra = ["--root", str(root), "--port", str(_free_port_block(16))]
    cli = f"{sys.executable} -c 'from hpc_llm.cli import main; main()'"
    check = (
        f'{sys.executable} -c \'import boto3, os; print(boto3.client("s3").head_bucket(Bucket="hpc-llm")'
        '["ResponseMetadata"]["HTTPStatusCode"], os.environ["S3_ENDPOINT_URL"])\''
    )
    script = f'eval "$({cli} dev-cluster up --nodes 3 --s3 {" ".join(extra)})" && {check}'
    try:
        proc = subprocess.run(["bash", "-c", script], env=app_env, capture_output=True, text=True, timeout=180)
        assert proc.returncode == 0, explain(proc)
        status, endpoint = proc.stdout.split()[-2:]
        assert status == "200" and endpoint.startswith("http://127.0.0.1:")
    finally:
        off = run_cli(["dev-cluster", "down", "--root", str(root)], app_env, timeout=120)
    assert off.returncode == 0 and "weed mini (S3" in off.stdout, explain(off)
    from hpc_llm.devcluster import s3_server

    assert s3_server.pid_of(s3_server.load(root)) is None


# -- on the dev cluster ----------------------------------------------------------------------------


#: the end-to-end runs' length (and their shared reference run's)
BATCHES = 200


def s3_base(s3_tiny: str) -> list[str]:
    """One node, one rank, exclusive (preemptable); the data streamed from the store, checkpoints
    to it every 5 batches (the README's run, with a location of the test's own)."""
    return [
        *ALONE,
        f"data.remote={s3_tiny}",
        "checkpoint=uri",
        "checkpoint.interval=5ba",
        f"train.max_duration={BATCHES}ba",
    ]


def s3_reference(s3, s3_tiny, env, pytestconfig) -> dict:
    return reference([*s3_base(s3_tiny), f"checkpoint.location={s3.uri('references')}"], env, pytestconfig)


@pytest.fixture
def s3_slurm_env(slurm_env: dict[str, str], s3) -> dict[str, str]:
    return dict(slurm_env, **s3.env())


@pytest.mark.slurm
def test_wrong_credentials_or_a_missing_bucket_are_one_line_and_nothing_is_submitted(
    s3, s3_slurm_env, s3_tiny, tmp_path
):
    env = dict(s3_slurm_env, HPC_LLM_RUNS=str(tmp_path / "runs"))
    args = [*s3_base(s3_tiny), f"checkpoint.location={s3.uri('never')}"]
    wrong = run_app(args, dict(env, AWS_SECRET_ACCESS_KEY="wrong"), cwd=tmp_path, timeout=120)
    line = one_line(wrong)
    assert "refused the credentials (SignatureDoesNotMatch)" in line and "nothing was submitted" in line
    bucket = run_app([*args[:-1], "checkpoint.location=s3://no-such-bucket/ck"], env, cwd=tmp_path, timeout=120)
    assert "checkpoint.location='s3://no-such-bucket/ck': no bucket 'no-such-bucket'" in one_line(bucket)
    data = run_app([*args, "data.train_split=nope"], env, cwd=tmp_path, timeout=120)
    assert f"data.remote='{s3_tiny}': no MDS split 'nope'" in one_line(data)
    # nothing was created to submit (no run dir, no batch script) and nothing written to the store
    assert not (tmp_path / "runs").exists() and keys(s3, "never/") == {}


@pytest.mark.slurm
def test_a_second_run_at_the_first_ones_location_is_refused_before_submitting_or_resumed_on_purpose(
    s3, s3_slurm_env, s3_tiny, tmp_path
):
    """Seen before: a new run (new run dir) at the first one's location silently resumed it and
    reported batches it never trained. A folder names its run (hpc_llm-run.json)."""
    env = dict(s3_slurm_env, HPC_LLM_RUNS=str(tmp_path / "runs"))
    folder = f"shared-{uuid.uuid4().hex[:6]}"
    base = [
        "+experiment=mpt_tiny",
        f"data.remote={s3_tiny}",
        "eval=none",
        "resources.tasks_per_node=1",
        "checkpoint=uri",
        f"checkpoint.location={s3.uri(folder)}",
        "checkpoint.run_subdir=false",
        "checkpoint.interval=5ba",
    ]
    first = run_app([*base, "train.max_duration=10ba"], env, cwd=tmp_path, timeout=600)
    assert first.returncode == 0, explain(first)
    [first_dir] = [p.parent for p in (tmp_path / "runs").rglob("results.json")]
    assert latest_batch(s3, folder) == 10
    runs_before = sorted((tmp_path / "runs").rglob("results.json"))
    second = run_app([*base, "train.max_duration=15ba", "hydra/launcher=slurm"], env, cwd=tmp_path, timeout=120)
    line = one_line(second)
    assert f"checkpoint.location='{s3.uri(folder)}': holds the checkpoints of run 'mpt_tiny-" in line
    assert f"(run dir {first_dir})" in line and "checkpoint.resume_other=true" in line
    assert "nothing was submitted" in line and sorted((tmp_path / "runs").rglob("results.json")) == runs_before
    on_purpose = run_app(
        [*base, "train.max_duration=15ba", "checkpoint.resume_other=true"], env, cwd=tmp_path, timeout=600
    )
    assert on_purpose.returncode == 0, explain(on_purpose)
    [r] = [json.loads(p.read_text()) for p in (tmp_path / "runs").rglob("results.json") if p not in runs_before]
    assert r["status"] == "completed" and r["batches_done"] == 15 and r["attempts"][0]["resumed_at_batch"] == 10
    assert latest_batch(s3, folder) == 15


@pytest.mark.slurm
@pytest.mark.long
@pytest.mark.timeout(1500)
def test_a_run_on_s3_preempted_then_stopped_twice_resumes_each_time_where_it_stopped(
    s3, s3_slurm_env, s3_tiny, test_site, tmp_path, pytestconfig
):
    """Data streamed from s3://, checkpoints to s3://, keep=2, node scratch outside /tmp: a
    preemption and two stop signals (three requeues). Each stop's save is linked as latest before
    the step exits, each attempt resumes at the batch the last one stopped at (on a node whose
    scratch still holds the previous attempt's files: no stale copy of latest is reused), the loss
    is the uninterrupted run's, the bucket never holds more than keep + 1 saves, and the node
    scratch holds no checkpoint at the end."""
    ref = s3_reference(s3, s3_tiny, s3_slurm_env, pytestconfig)
    scratch = tmp_path / "scratch"
    location = f"e2e-{uuid.uuid4().hex[:6]}"
    # the README's run: python -m hpc_llm +experiment=mpt_tiny hydra/launcher=slurm data.remote=...
    #   checkpoint=uri checkpoint.location=... checkpoint.keep=2
    args = [*s3_base(s3_tiny), f"checkpoint.location={s3.uri(location)}", "checkpoint.keep=2"]
    env = with_site(dict(s3_slurm_env, HPC_LLM_RUNS=str(tmp_path / "runs")), test_site)
    job_id, run_dir = submit([*args, f"cluster.scratch={scratch}", *paced(0.1)], env, tmp_path)
    folder = f"{location}/mpt_tiny-{run_dir.parent.name}-{run_dir.name}"
    most = 0

    def count_saves() -> int:
        nonlocal most
        most = max(most, len(saves_in(s3, folder)))
        return most

    rank_at(run_dir, 0, 12)
    preempt(job_nodes(job_id, env), env)
    for n in (1, 2):
        stopped = wait_for(
            lambda n=n: (
                len(attempts(run_dir)) > n - 1
                and attempts(run_dir)[n - 1]["state"] != "running"
                and attempts(run_dir)[n - 1]
            ),
            300,
            f"stop {n}",
        )
        # a stop commits its save: latest names the batch it stopped at before the next attempt starts
        assert stopped["state"] == "stopped" and latest_batch(s3, folder) == stopped["stopped_at_batch"], stopped
        count_saves()
        wait_for(
            lambda n=n: (
                len(attempts(run_dir)) > n
                and attempts(run_dir)[n]["state"] == "running"
                and beat(run_dir, 0).get("batch", -1) > attempts(run_dir)[n]["resumed_at_batch"] + 5
            ),
            600,
            f"attempt {n + 1} to train",
        )
        count_saves()
        subprocess.run(["scancel", "--batch", "--signal=USR2", job_id], env=env, check=True)
    r = finished(run_dir, 900)
    same_loss(r, ref)
    tries = r["attempts"]
    assert len(tries) == 4 and [a["cause"] for a in tries[:3]] == ["preemption", "signal", "signal"], tries
    for before, after in zip(tries[:-1], tries[1:], strict=True):
        assert before["stopped_at_batch"] > 0 and after["resumed_at_batch"] == before["stopped_at_batch"], (
            before,
            after,
        )
        assert before["save_s"] > 0
    assert r["batches_lost"] == 0 and re.fullmatch(
        rf"s3://{s3.bucket}/{folder}/ep\d+-ba{BATCHES}-rank0\.pt", r["checkpoint"]
    )
    assert r["checkpoint_bytes"] > 0
    assert count_saves() <= 3 and len(saves_in(s3, folder)) <= 3, saves_in(s3, folder)
    left = [
        p
        for p in scratch.rglob("*")
        if p.is_file() and (p.suffix in (".pt", ".distcp", ".symlink") or CHECKPOINT_FILE.match(p.name))
    ]
    assert not left, left
    wait_for(lambda: not in_queue(job_id, env), 60, "the job to leave the queue")


@pytest.mark.slurm
@pytest.mark.long
@pytest.mark.timeout(1500)
def test_the_store_killed_then_frozen_for_a_minute_each_fails_nothing_and_blames_no_node(
    s3, s3_slurm_env, s3_tiny, test_site, tmp_path, pytestconfig
):
    """A store of its own (the session's stays up for the other tests), holding the same data:
    killed for 60 s (connections refused) then frozen for 60 s (SIGSTOP: connections hang) while
    the run trains and saves every 5 batches. Uploads wait and retry; the link of latest catches up
    once the store is back; the run completes with the uninterrupted run's loss, no node blamed."""
    from hpc_llm.devcluster import s3_server

    ref = s3_reference(s3, s3_tiny, s3_slurm_env, pytestconfig)
    root, port = tmp_path / "store", _free_port_block(5)
    own = s3_server.start(root, port)
    try:
        source, target = s3_client(s3), s3_client(own)
        for key in keys(s3, "data/tiny/"):
            body = source.get_object(Bucket=s3.bucket, Key=key)["Body"].read()
            target.put_object(Bucket=own.bucket, Key=key, Body=body)
        env = with_site(dict(s3_slurm_env, **own.env(), HPC_LLM_RUNS=str(tmp_path / "runs")), test_site)
        location = "faults"
        args = [*s3_base(s3_tiny), f"checkpoint.location={own.uri(location)}", "checkpoint.keep=2"]
        # paced so that the run outlasts both outages (about 150 s) on any machine
        job_id, run_dir = submit([*args, "fault.hang_timeout_s=60", *paced(0.75)], env, tmp_path)
        folder = f"{location}/mpt_tiny-{run_dir.parent.name}-{run_dir.name}"
        rank_at(run_dir, 0, 10)
        linked = wait_for(lambda: latest_batch(own, folder), 60, "a first link")
        s3_server.kill(own)
        killed_at = beat(run_dir, 0)["batch"]
        time.sleep(60)
        assert beat(run_dir, 0)["batch"] > killed_at + 20  # trained on meanwhile
        own = s3_server.start(root, port)
        wait_for(lambda: (latest_batch(own, folder) or 0) > max(linked, killed_at), 180, "the link to catch up")
        s3_server.freeze(own)
        frozen_at = beat(run_dir, 0)["batch"]
        time.sleep(60)
        s3_server.thaw(own)
        assert beat(run_dir, 0)["batch"] >= min(frozen_at + 20, BATCHES)
        r = finished(run_dir, 900)
    finally:
        s3_server.stop(root)
    same_loss(r, ref)
    assert r["restarts"] == 0 and not r["restarts_by_cause"], r["attempts"]
    assert all(not a.get("suspects") for a in r["attempts"])
    wait_for(lambda: not in_queue(job_id, env), 60, "the job to leave the queue")


@pytest.mark.slurm
def test_doctor_checks_the_store_from_a_compute_node_with_the_jobs_credentials(s3, s3_slurm_env, s3_tiny):
    args = ["doctor", "+experiment=mpt_tiny", "checkpoint=uri", f"checkpoint.location={s3.uri('doctor')}", "--json"]
    args += [f"data.remote={s3_tiny}"]
    proc = run_cli(args, s3_slurm_env)
    assert proc.returncode == 0, explain(proc)
    row = {r["check"]: r for r in json.loads(proc.stdout)}["object store"]
    assert row["status"] == "OK" and re.search(r"checked from n\d", row["value"]), row
    wrong = run_cli(args, dict(s3_slurm_env, AWS_SECRET_ACCESS_KEY="wrong"))
    assert wrong.returncode == 1, explain(wrong)
    row = {r["check"]: r for r in json.loads(wrong.stdout)}["object store"]
    assert row["status"] == "FAIL" and "refused the credentials (SignatureDoesNotMatch)" in row["detail"], row
