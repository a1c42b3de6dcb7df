"""How the check before the queue runs (issue 44, docs/guides/precheck.md): a cache of verdicts
keyed by what the check reads, a warm checker per user, host and environment on a Unix socket
of the user's alone, and the one line that says which ran. Timings are the benchmarks' business
(benchmarks/precheck.py, benchmarks/login_latency.py): nothing here is timed.

Most tests drive the warm checker in an environment without the training stack (this venv's
python with ``-S``: no site-packages, hpc_llm from PYTHONPATH), which starts it in milliseconds:
what is about the socket, its permissions, its idle end and its stale socket needs no stack.
Those marked ``stack`` submit through the real one. Every test stops the checkers it started.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from hpc_llm.job.rank import stack_fingerprint
from hpc_llm.job.rank.verdict_cache import VerdictCache
from hpc_llm.launch import checker_client as checkers
from tests.conftest import PY, ROOT, explain, run_app, run_cli
from tests.test_containers import images_dir, sandbox  # noqa: F401 - fixtures

DRY = ["hydra/launcher=slurm", "hydra.launcher.dry_run=true"]


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """This test's hpc_llm home, here and in what it starts; its checkers stopped at the end."""
    path = tmp_path / "hpc_llm_home"
    monkeypatch.setenv("HPC_LLM_HOME", str(path))
    yield path
    checkers.stop()
    assert not checkers.running()


@pytest.fixture
def checked_env(app_env: dict[str, str], home: Path) -> dict[str, str]:
    return {**app_env, "HPC_LLM_HOME": str(home), "HPC_LLM_PRECHECK": "1"}


def no_stack(idle_s: float = 600, name: str = "no stack") -> checkers.Starter:
    """A checker in an environment without the training stack: it starts at once (hpc_llm from
    PYTHONPATH: the `pythonpath` fixture)."""
    return checkers.Starter(
        checkers.identity("test", [name, idle_s]), name, lambda args, binds: [PY, "-S", *args], idle_s, cache=True
    )


@pytest.fixture
def pythonpath(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a checker started without site-packages (``-S``) imports hpc_llm from."""
    monkeypatch.setenv("PYTHONPATH", str(ROOT))


def gone(pid: int, within_s: float = 60) -> bool:
    """Whether process ``pid`` ended (a child of this process is reaped) within ``within_s``."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        for proc in checkers._STARTED.values():
            proc.poll()
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


def line(proc: subprocess.CompletedProcess) -> str:
    [said] = [ln for ln in proc.stderr.splitlines() if ln.startswith("hpc_llm: check before the queue:")]
    return said


def errors(proc: subprocess.CompletedProcess) -> list[str]:
    return [ln.removeprefix("hpc_llm: error: ") for ln in proc.stderr.splitlines() if ln.startswith("hpc_llm: error:")]


# -- the cache's key: what the check reads --------------------------------------------------------


def test_the_fingerprint_follows_what_is_installed(tmp_path, monkeypatch):
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.setattr(sys, "path", [str(tmp_path / "cwd"), str(site)])
    (tmp_path / "cwd").mkdir()
    first = stack_fingerprint.fingerprint()
    (tmp_path / "cwd" / "notes.txt").write_text("a file made where the user works")
    assert stack_fingerprint.fingerprint() == first
    (site / "llm_foundry-0.22.0.dist-info").mkdir()
    installed = stack_fingerprint.fingerprint()
    assert installed != first
    (site / "llm_foundry-0.22.0.dist-info").rename(site / "llm_foundry-0.23.0.dist-info")
    assert stack_fingerprint.fingerprint() not in (first, installed)


def test_a_verdict_is_kept_per_environment_stack_and_point_and_dropped_when_hpc_llm_changes(tmp_path):
    point = {"train": {"max_duration": "1xx"}, "world_size": 2, "device": "cpu"}
    cache = VerdictCache(str(tmp_path), "venv A", "stack 1")
    problems = [("max_duration", "ValueError: Invalid time string: 1xx")]
    cache.put(cache.key(point), problems, stack_fingerprint.sources())
    assert cache.get(cache.key(point)) == [list(p) for p in problems]
    for other in (VerdictCache(str(tmp_path), "venv B", "stack 1"), VerdictCache(str(tmp_path), "venv A", "stack 2")):
        assert other.get(other.key(point)) is None
    for changed in ({**point, "world_size": 4}, {**point, "train": {"max_duration": "2xx"}}):
        assert cache.get(cache.key(changed)) is None
    # made with a source of hpc_llm's that has changed since: not used
    source = "job/rank/foundry_check.py"
    st = (ROOT / "hpc_llm" / source).stat()
    cache.put(cache.key(point), problems, {source: [st.st_size, st.st_mtime_ns - 1]})
    assert cache.get(cache.key(point)) is None
    assert VerdictCache(None, "venv A", "stack 1").get(cache.key(point)) is None


def test_concurrent_writers_of_a_verdict_never_show_half_a_file(tmp_path):
    cache = VerdictCache(str(tmp_path), "env", "stack")
    key = cache.key({"train": {}, "world_size": 1, "device": "cpu"})
    long = [(f"key{i}", "x" * 2000) for i in range(50)]
    seen: list[object] = []

    def write() -> None:
        for _ in range(100):
            cache.put(key, long, {})

    writers = [threading.Thread(target=write) for _ in range(4)]
    for w in writers:
        w.start()
    while any(w.is_alive() for w in writers):
        seen.append(cache.get(key))
    assert all(s is None or len(s) == 50 for s in seen) and cache.get(key) is not None
    assert not [p for p in tmp_path.rglob("*.tmp")]


def test_the_environment_named_changes_with_the_venv_and_the_image(tmp_path, sandbox, monkeypatch):  # noqa: F811
    import shutil

    from hpc_llm.config.compose import compose
    from hpc_llm.launch.precheck import environment

    monkeypatch.setenv("HPC_LLM_CACHE", str(tmp_path / "cache"))
    venvs = {
        environment(compose(["hydra/launcher=slurm", f"hydra.launcher.python={p}"])).identity
        for p in (PY, "/usr/bin/python3")
    }
    assert len(venvs) == 2
    other = tmp_path / "other"
    shutil.copytree(sandbox, other, symlinks=True)
    image = ["container=apptainer", "container.executable=/bin/true"]
    first = environment(compose([*image, f"container.image={sandbox}"])).identity
    second = environment(compose([*image, f"container.image={other}"])).identity
    assert len({first, second} | venvs) == 4
    # the same image, rebuilt in place
    os.utime(other, ns=(0, other.stat().st_mtime_ns + 10**9))
    assert environment(compose([*image, f"container.image={other}"])).identity != second


# -- the warm checker, without the stack ---------------------------------------------------------


def test_the_checker_socket_is_the_users_alone_and_another_user_cannot_connect(home, pythonpath, tmp_path_factory):
    warm = checkers.connect(no_stack())
    sock = Path(warm.place.socket)
    assert sock.stat().st_mode & 0o777 == 0o600 and sock.parent.stat().st_mode & 0o777 == 0o700
    assert (home / "precheck").stat().st_mode & 0o777 == 0o700
    if os.geteuid() != 0:
        pytest.skip("needs root to run a client as user nobody")
    # pytest's own directories are 0700 too: opened up to the hpc_llm home, so that the checker's
    # own directory and socket are what keeps user nobody out
    base = Path(str(tmp_path_factory.getbasetemp()))
    root = base.parent if base.name.startswith("popen-gw") else base
    for d in (home, *home.parents):
        d.chmod(d.stat().st_mode | 0o755)
        if d == root:
            break
    as_nobody = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", PY, "-S", "-c"]
    probe = subprocess.run([*as_nobody, "pass"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"user nobody cannot run {PY}: {probe.stderr.strip()[-200:]}")
    client = (
        "import socket, sys\n"
        "s = socket.socket(socket.AF_UNIX)\n"
        "s.settimeout(10)\n"
        "try:\n"
        "    s.connect(sys.argv[1]); s.sendall(b'{\"op\": \"hello\"}\\n'); print('answer', s.recv(4096))\n"
        "except OSError as e:\n"
        "    print(type(e).__name__)\n"
    )
    refused = subprocess.run([*as_nobody, client, str(sock)], capture_output=True, text=True, timeout=60)
    assert refused.stdout.strip() == "PermissionError", explain(refused)
    # a directory and socket opened to everyone by mistake: the checker still answers its user only
    private = [d for d in (sock.parent, *sock.parents) if d.stat().st_mode & 0o777 == 0o700]
    try:
        for d in private:
            d.chmod(0o711)
        sock.chmod(0o666)
        closed = subprocess.run([*as_nobody, client, str(sock)], capture_output=True, text=True, timeout=60)
    finally:
        for d in private:
            d.chmod(0o700)
    assert closed.stdout.strip() in ("answer b''", "BrokenPipeError", "ConnectionResetError"), explain(closed)
    assert checkers.hello(warm.place) is not None  # its user still gets answers


def test_the_checker_ends_after_its_idle_timeout_and_leaves_nothing(home, pythonpath):
    warm = checkers.connect(no_stack(idle_s=1))
    pid = int(warm.hello["pid"])
    assert warm.hello["state"] in ("importing", "missing") and warm.started_here
    assert gone(pid), f"checker {pid} still running after its idle timeout"
    assert not Path(warm.place.socket).exists() and not warm.place.record.exists()
    assert not checkers.alive(pid) and not checkers.running()


def test_a_dead_checkers_socket_is_replaced_and_status_and_stop_see_the_live_one(home, pythonpath):
    starter = no_stack()
    first = checkers.connect(starter)
    os.kill(int(first.hello["pid"]), signal.SIGKILL)
    assert gone(int(first.hello["pid"]))
    assert Path(first.place.socket).exists()  # left behind: nobody listens on it
    second = checkers.connect(starter)
    assert second.hello["pid"] != first.hello["pid"] and second.place == first.place
    [live] = checkers.running()
    assert live.hello["pid"] == second.hello["pid"]
    [stopped] = checkers.stop()
    assert stopped.hello["pid"] == second.hello["pid"] and gone(int(second.hello["pid"]))


def test_two_clients_at_once_start_one_checker_and_share_it(home, pythonpath):
    """Separate processes, as two submits are: both get the one checker's answer."""
    code = (
        "import json, sys\n"
        "from hpc_llm.launch import checker_client as c\n"
        "s = c.Starter('shared', 'two at once', lambda args, binds: [sys.executable, '-S', *args], 600, True)\n"
        "w = c.connect(s)\n"
        "print(json.dumps(c.request(w.place.socket, {'op': 'hello'}, 10)['pid']))\n"
    )
    procs = [
        subprocess.Popen([PY, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    pids = {json.loads(out) for out, _ in outs}
    assert len(pids) == 1, outs
    [one] = checkers.running()
    assert one.hello["pid"] == pids.pop()


def test_a_bad_idle_timeout_is_one_line_before_anything(checked_env, tmp_path, runs_dir):
    proc = run_app(["+experiment=mpt_tiny", *DRY, "precheck.idle_s=0"], checked_env, cwd=tmp_path)
    assert proc.returncode == 2, explain(proc)
    assert errors(proc) == [
        "precheck.idle_s=0: the warm checker would end before it is asked; allowed: seconds > 0 "
        "(precheck.warm=false: no warm checker)"
    ]
    assert not runs_dir.exists()


def test_a_job_python_without_the_stack_is_said_once_and_the_checker_ends(checked_env, tmp_path, runs_dir):
    """The venv's python with -S has no stack: warned as before; its checker does not stay."""
    args = ["+experiment=mpt_tiny", *DRY, f"hydra.launcher.python='{PY} -S'"]
    proc = run_app(args, {**checked_env, "PYTHONPATH": str(ROOT)}, cwd=tmp_path)
    assert proc.returncode == 0, explain(proc)
    [said] = [ln for ln in proc.stderr.splitlines() if "has no training stack" in ln]
    assert "no module composer" in said
    deadline = time.monotonic() + 60
    while checkers.running() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not checkers.running()


# -- through the training stack -------------------------------------------------------------------


@pytest.mark.stack
def test_a_bad_value_is_refused_cold_warm_and_from_the_cache(checked_env, tmp_path, runs_dir):
    """The first submit starts the checker (cold); the same again is answered from the cache; two
    submits at once, one bad and one good, share the warm checker; a changed config is checked
    again. Each refusal stops everything before the queue."""
    tiny = ["+experiment=mpt_tiny", *DRY]
    bad = run_app([*tiny, "train.max_duration=1xx"], checked_env, cwd=tmp_path)
    assert bad.returncode == 2, explain(bad)
    refusal = "train.max_duration='1xx': ValueError: Invalid time string: 1xx; allowed: an integer and a unit"
    assert errors(bad)[0].startswith(refusal) and ", cold, started the warm checker:" in line(bad), bad.stderr
    again = run_app([*tiny, "train.max_duration=1xx"], checked_env, cwd=tmp_path)
    assert again.returncode == 2 and errors(again) == errors(bad), explain(again)
    assert re.search(r": 1 point, from the cache; [\d.]+ s in all", line(again)), line(again)
    assert not runs_dir.exists()
    # two at once: one warm checker answers both
    procs = [
        subprocess.Popen(
            [PY, "-m", "hpc_llm", *tiny, extra], env=checked_env, cwd=tmp_path, stderr=subprocess.PIPE, text=True
        )
        for extra in ("train.precision=amp_bf17", "train.max_duration=8ba")
    ]
    (_, wrong), (_, right) = (p.communicate(timeout=300) for p in procs)
    assert procs[0].returncode == 2 and procs[1].returncode == 0, (wrong, right)
    assert "hpc_llm: error: train.precision='amp_bf17': ValueError: Value amp_bf17 not found in Precision" in wrong
    for stderr in (wrong, right):
        assert ": 1 point, warm, 1 checked in" in stderr, stderr
    assert len(list(runs_dir.rglob("sbatch.sh"))) == 1
    [one] = checkers.running()
    # a changed config (another learning rate) is checked; the point as before (mpt_tiny's lr) is not
    sweep = run_app([*tiny, "train.max_duration=8ba", "train.optimizer.lr=3e-3,1e-3"], checked_env, cwd=tmp_path)
    assert sweep.returncode == 0, explain(sweep)
    assert ": 2 points, warm, 1 checked in" in line(sweep) and "1 from the cache" in line(sweep), line(sweep)
    assert [r.hello["pid"] for r in checkers.running()] == [one.hello["pid"]]
    # precheck.cache=false: checked again, by the same checker
    uncached = run_app([*tiny, "train.max_duration=1xx", "precheck.cache=false"], checked_env, cwd=tmp_path)
    assert uncached.returncode == 2 and errors(uncached) == errors(bad), explain(uncached)
    assert ": 1 point, warm, 1 checked in" in line(uncached), line(uncached)


@pytest.mark.stack
def test_another_venv_is_not_answered_from_the_first_ones_cache(checked_env, tmp_path):
    """A second venv (its own site-packages, this venv's packages added to it) gets its own
    checker and its own verdicts: the same config is checked there, cold."""
    import sysconfig

    venv = tmp_path / "venv2"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    [site] = list((venv / "lib").glob("python3*/site-packages"))
    (site / "stack.pth").write_text(f"import site; site.addsitedir({sysconfig.get_paths()['purelib']!r})\n")
    args = ["+experiment=mpt_tiny", *DRY, "train.max_duration=4ba"]
    first = run_app(args, checked_env, cwd=tmp_path)
    assert first.returncode == 0 and ", cold, started the warm checker:" in line(first), explain(first)
    cached = run_app(args, checked_env, cwd=tmp_path)
    assert "from the cache" in line(cached), explain(cached)
    other = run_app([*args, f"hydra.launcher.python={venv / 'bin' / 'python'}"], checked_env, cwd=tmp_path)
    assert other.returncode == 0, explain(other)
    assert ", cold, started the warm checker:" in line(other) and "venv2" in line(other), line(other)
    assert len(checkers.running()) == 2
    status = run_cli(["check", "--status"], checked_env)
    assert "warm checkers of this user on this host: 2" in status.stdout, explain(status)
    stop = run_cli(["check", "--stop"], checked_env)
    assert stop.returncode == 0 and "stopped 2 warm checker(s)" in stop.stdout, explain(stop)
    assert not checkers.running()


@pytest.mark.stack
def test_without_a_warm_checker_the_check_is_one_process_and_uses_the_cache(checked_env, tmp_path):
    args = ["+experiment=mpt_tiny", *DRY, "precheck.warm=false", "train.eval_interval=5xx"]
    cold = run_app(args, checked_env, cwd=tmp_path)
    assert cold.returncode == 2 and errors(cold)[0].startswith("train.eval_interval='5xx'"), explain(cold)
    assert ", cold, one process (precheck.warm=false): the stack imported in" in line(cold), line(cold)
    cached = run_app(args, checked_env, cwd=tmp_path)
    assert cached.returncode == 2 and errors(cached) == errors(cold) and "from the cache" in line(cached)
    assert not checkers.running()
    fresh = run_app([*args, "precheck.cache=false"], checked_env, cwd=tmp_path)
    assert fresh.returncode == 2 and ", cold, one process" in line(fresh), explain(fresh)
