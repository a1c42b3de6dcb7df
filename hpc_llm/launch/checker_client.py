"""The login side of the warm checker (:mod:`hpc_llm.job.rank.check_server`, which runs in the
job's environment and is started by module name: the login side never imports the stack nor
``hpc_llm.job``): where it lives, starting it, asking it, and ``hpc-llm check --status | --stop``.
Standard library only.

Where (the user's alone; the hpc_llm home is ``$HPC_LLM_HOME``, else ``~/.hpc_llm``)::

    <hpc_llm home>/precheck/                  0700
        cache/                                the verdicts (hpc_llm.job.rank.verdict_cache)
        checkers/<host>-<id>.sock             a checker's Unix socket, 0600 (<id>: its environment's)
        checkers/<host>-<id>.lock             held by that checker for its life (one per environment)
        checkers/<host>-<id>.json             who it is (pid, environment), while it runs
        checkers/<host>-<id>.log              what it wrote on stderr

A home on a filesystem several login nodes share gives each host its own checkers (the
host's name is in theirs) and one cache. A socket path longer than the kernel takes (107
bytes) is made in ``<tmp>/hpc_llm-<uid>/`` instead, a 0700 directory this user owns.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import socket
import stat
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpc_llm.paths import state_dir

#: the job-side module, by name (the login side does not import hpc_llm.job)
SERVER = "hpc_llm.job.rank.check_server"
#: what the client and the checker say to each other; a checker of another protocol has another name
PROTOCOL = 1
#: the longest a checker takes to bind its socket (a cold start of an image on a busy login node)
START_TIMEOUT_S = 120
#: AF_UNIX's sun_path, less its terminating NUL
SOCKET_PATH_MAX = 107


class Unavailable(Exception):
    """No warm checker could be reached or started; the message says why (the check then runs
    as one process, as it did before warm checkers)."""


class NoAnswer(Exception):
    """A warm checker took the points and gave no answer (it died, or ran past the timeout)."""


def precheck_dir() -> Path:
    return state_dir() / "precheck"


def cache_dir() -> Path:
    return precheck_dir() / "cache"


def checkers_dir() -> Path:
    return precheck_dir() / "checkers"


def private_dir(path: Path) -> Path:
    """``path`` as a directory of this user's alone (0700), made where missing; a path that is
    someone else's, or a link, is refused (a shared /tmp)."""
    try:
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
        st = os.lstat(path)
    except OSError as exc:
        raise Unavailable(f"{path}: {exc.strerror}") from None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        raise Unavailable(f"{path} is not a directory of this user's")
    if st.st_mode & 0o077:
        os.chmod(path, 0o700)
    return path


@dataclass(frozen=True)
class Place:
    """Where one environment's checker lives on this host."""

    base: Path
    socket: str

    @property
    def lock(self) -> Path:
        return self.base.with_suffix(".lock")

    @property
    def record(self) -> Path:
        return self.base.with_suffix(".json")

    @property
    def log(self) -> Path:
        return self.base.with_suffix(".log")


def host() -> str:
    """This login node's short name (a home several share holds each one's checkers)."""
    return socket.gethostname().split(".")[0]


def place(identity: str) -> Place:
    private_dir(precheck_dir())
    base = private_dir(checkers_dir()) / f"{host()}-{identity[:16]}"
    path = f"{base}.sock"
    if len(os.fsencode(path)) > SOCKET_PATH_MAX:
        short = private_dir(Path(tempfile.gettempdir()) / f"hpc_llm-{os.getuid()}")
        path = str(short / f"{hashlib.sha256(path.encode()).hexdigest()[:16]}.sock")
    return Place(base, path)


def request(path: str, message: dict[str, Any], timeout: float) -> dict[str, Any]:
    """One request, one answer (one JSON line each way)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(path)
        s.sendall(json.dumps(message).encode() + b"\n")
        chunks = []
        while chunk := s.recv(1 << 16):
            chunks.append(chunk)
    try:
        answer = json.loads(b"".join(chunks))
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        raise Unavailable("the warm checker closed the connection without an answer")
    return answer


def hello(where: Place) -> dict[str, Any] | None:
    try:
        return request(where.socket, {"op": "hello"}, timeout=10)
    except (OSError, Unavailable):
        return None


def alive(pid: int) -> bool:
    """Whether ``pid`` is a running checker (not another process that got its number since)."""
    return pid > 0 and SERVER in _cmdline(pid)


@dataclass
class Starter:
    """How to start one environment's checker: ``command(args, binds)`` is the job's python
    running ``args`` with the host directories ``binds`` visible (an image binds them)."""

    identity: str
    name: str
    command: Callable[[list[str], list[str]], list[str]]
    idle_s: float
    cache: bool


#: the checkers this process started, by socket path
_STARTED: dict[str, subprocess.Popen[bytes]] = {}


def spawn(where: Place, starter: Starter) -> subprocess.Popen[bytes]:
    """A checker for ``starter``'s environment at ``where``. Where one holds the lock already
    (two submits started one each) the second leaves at once: one checker per environment."""
    args = ["-m", SERVER, "--socket", where.socket, "--lock", str(where.lock), "--record", str(where.record)]
    args += ["--environment", starter.identity, "--name", starter.name, "--idle-s", str(starter.idle_s)]
    args += ["--cache", str(private_dir(cache_dir()))]  # each request says whether to use it
    command = starter.command(args, sorted({str(precheck_dir()), os.path.dirname(where.socket)}))
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    with open(where.log, "ab") as log:  # the checker that holds the lock empties it
        # its own session: it outlives this submit, and a ^C here does not reach it
        proc = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log, cwd="/", env=env,
            start_new_session=True,
        )  # fmt: skip
    _STARTED[where.socket] = proc
    return proc


def _starting(where: Place) -> bool:
    """Whether a checker this process started for ``where`` is still starting."""
    proc = _STARTED.get(where.socket)
    return proc is not None and proc.poll() is None


def start(starter: Starter) -> None:
    """Start the environment's checker unless it is up or starting; without waiting for it
    (the stack imports while the sweep's points are composed)."""
    where = place(starter.identity)
    if not _starting(where) and hello(where) is None:
        spawn(where, starter)


@dataclass
class Warm:
    """A checker that answered, and whether this process started it."""

    place: Place
    hello: dict[str, Any]
    started_here: bool


def connect(starter: Starter) -> Warm:
    """The environment's checker, started where none answers (a dead one's socket is replaced
    by the new checker, which holds the lock); Unavailable where none comes up."""
    where = place(starter.identity)
    deadline = time.monotonic() + START_TIMEOUT_S
    mine: subprocess.Popen[bytes] | None = None  # what this call started
    last = -1.0
    while True:
        said = hello(where)
        if said is not None:
            return Warm(where, said, where.socket in _STARTED)
        if not _starting(where):
            if mine is not None and mine.returncode != 0:
                raise Unavailable(f"the warm checker did not start ({_last_line(where.log)})")
            # none of this process' is starting: none was, or ours left because another one holds
            # the lock (started by another submit: it binds in a moment, or it died since)
            if last < 0 or time.monotonic() - last > 0.5:
                mine, last = spawn(where, starter), time.monotonic()
        if time.monotonic() > deadline:
            raise Unavailable(f"the warm checker did not answer in {START_TIMEOUT_S} s")
        time.sleep(0.02)


def check(starter: Starter, points: list[dict[str, Any]], timeout: float) -> tuple[Warm, dict[str, Any]]:
    """The points through the environment's warm checker: its hello and its answer."""
    for _ in range(3):
        warm = connect(starter)
        try:
            said = request(warm.place.socket, {"op": "check", "points": points, "cache": starter.cache}, timeout)
        except (OSError, Unavailable) as exc:
            raise NoAnswer(str(exc) or type(exc).__name__) from None
        if not said.get("stale"):
            return warm, said
        _STARTED.pop(warm.place.socket, None)  # it is ending: the stack under it changed; a new one
    raise Unavailable("the stack changed under the warm checker three times")


def _last_line(path: Path) -> str:
    try:
        lines = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return "no log"
    return " ".join((lines or ["no output"])[-1].split())[-300:]


# -- hpc-llm check --status | --stop ---------------------------------------------------------------


@dataclass
class Running:
    place: Place
    record: dict[str, Any]
    hello: dict[str, Any]


def running() -> list[Running]:
    """This user's checkers on this host that answer; the records and sockets of dead ones are
    removed."""
    out: list[Running] = []
    if not checkers_dir().is_dir():
        return out
    for path in sorted(checkers_dir().glob(f"{host()}-*.json")):
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        where = Place(path.with_suffix(""), str(record.get("socket", "")))
        said = hello(where)
        if said is not None:
            out.append(Running(where, record, said))
        elif not alive(int(record.get("pid") or 0)):  # a checker that died without cleaning up (killed)
            for stale in (where.socket, str(where.record)):
                with contextlib.suppress(OSError):
                    os.unlink(stale)
    return out


def stop(wait_s: float = 30) -> list[Running]:
    """Ask each checker to end; one that has not within ``wait_s`` gets SIGTERM (by the pid it
    gave, while that process is still a checker). Returns those stopped."""
    found = running()
    for one in found:
        with contextlib.suppress(OSError, Unavailable):
            request(one.place.socket, {"op": "stop"}, timeout=10)
    deadline = time.monotonic() + wait_s
    for one in found:
        pid = int(one.hello.get("pid") or 0)
        while alive(pid) and time.monotonic() < deadline:
            for proc in _STARTED.values():
                proc.poll()  # those this process started: reaped
            time.sleep(0.05)
        if alive(pid):
            os.kill(pid, signal.SIGTERM)
    return found


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def cached_verdicts() -> int:
    root = cache_dir()
    return sum(1 for _ in root.glob("*/*.json")) if root.is_dir() else 0


def identity(kind: str, parts: Sequence[Any]) -> str:
    """A SHA-256 naming an environment: what starts its python, and what decides what that
    python imports (``PYTHON*``, ``APPTAINER*``/``SINGULARITY*`` variables)."""
    env = sorted((k, v) for k, v in os.environ.items() if k.startswith(("PYTHON", "APPTAINER", "SINGULARITY")))
    blob = json.dumps([PROTOCOL, kind, list(parts), env], sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()
