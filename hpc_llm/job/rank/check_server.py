"""The warm checker: the check before the queue (:mod:`hpc_llm.job.rank.foundry_check`) kept
running in the job's environment on the login node, so that a submit does not start the
training stack from scratch. One per user, host and environment (a venv's python, an image),
started by the login side on first use (:mod:`hpc_llm.launch.checker_client`)::

    python -m hpc_llm.job.rank.check_server --socket PATH --lock PATH --record PATH \\
        --cache DIR --environment ID --name TEXT --idle-s 600

It binds its Unix socket first (0600, in a directory of the user's alone, 0700; a peer of
another uid is refused even so), answers at once what needs no stack (``hello``, verdicts
from the cache), then imports the stack in its main thread while checks wait for it. It
ends itself after ``--idle-s`` seconds without a request, at ``stop``, when the stack under it
changed (another install: the next submit starts a fresh one), when its socket is no longer
its own (removed, or replaced), and at SIGTERM or SIGINT. A second checker started for the same
lock file while one holds it leaves at once. Stdlib only until the stack is imported.

One request per connection, one JSON object a line each way:

* ``{"op": "hello"}``: ``{"pid", "state": "importing" | "ready" | "missing" | "broken", "stack",
  "started", "ready_at", "idle_s", "idle_for_s", "rss_mb", "name"}``
* ``{"op": "check", "points": [...], "cache": true}`` (foundry_check's points; ``cache``: false
  neither reads nor writes verdicts): ``{"problems": [[i, key,
  message], ...], "cached", "checked", "waited_s", "import_s", "check_s", "stack"}``; or ``{"stale": true}``
  (the stack changed; this checker is ending), ``{"missing": module}``, ``{"error": line}``
* ``{"op": "stop"}``: ``{"stopping": true}``
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import signal
import socket
import socketserver
import struct
import sys
import threading
import time
from typing import Any

from hpc_llm.job.rank.stack_fingerprint import describe, fingerprint, sources, unchanged, versions
from hpc_llm.job.rank.verdict_cache import VerdictCache

#: a connection that sends nothing for this long is dropped (a client that died mid-request)
READ_TIMEOUT_S = 60
#: the longest a check waits for the stack to import (a cold start on a very busy login node)
IMPORT_WAIT_S = 600


class Checker:
    """The checker's state, shared by the request threads and the main thread."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.stack = fingerprint()
        self.versions = describe(versions())
        self.cache = VerdictCache(args.cache, args.environment, self.stack)
        self.state = "importing"
        self.missing = ""
        self.error = ""
        self.started = time.time()
        self.ready_at: float | None = None
        #: hpc_llm's sources this process runs, once the stack is imported (then the check's own)
        self.sources: dict[str, list[int]] = sources()
        self.ready = threading.Event()
        self.ending = threading.Event()
        self.checking = threading.Lock()  # one sweep at a time: the stack's globals are not thread-safe
        self.active = 0
        self.last = time.monotonic()
        self.guard = threading.Lock()

    def busy(self, delta: int) -> None:
        with self.guard:
            self.active += delta
            self.last = time.monotonic()

    def idle_for(self) -> float:
        with self.guard:
            return 0.0 if self.active else time.monotonic() - self.last

    def import_stack(self) -> None:
        from hpc_llm.job.rank.foundry_check import import_stack

        try:
            import_stack()
            self.sources = sources()
            self.state = "ready"
        except ImportError as exc:
            self.state, self.missing = "missing", f"{exc.name or exc}"
        except Exception as exc:  # a stack that does not import: said to the client, once
            self.state, self.error = "broken", f"{type(exc).__name__}: {exc}".splitlines()[0]
        self.ready_at = time.time()
        self.ready.set()

    def hello(self) -> dict[str, Any]:
        return {
            "pid": os.getpid(),
            "name": self.args.name,
            "state": self.state,
            "stack": self.versions,
            "started": self.started,
            "ready_at": self.ready_at,
            "idle_s": self.args.idle_s,
            "idle_for_s": round(self.idle_for(), 1),
            "rss_mb": _rss_mb(),
        }

    def check(self, points: list[dict[str, Any]], cached: bool = True) -> dict[str, Any]:
        if fingerprint() != self.stack or not unchanged(self.sources):  # installed over; hpc_llm edited
            self.ending.set()
            return {"stale": True}
        cache = self.cache if cached else VerdictCache(None, "", "")
        keys = [cache.key(p) for p in points]
        verdicts = [cache.get(k) for k in keys]
        todo = [i for i, v in enumerate(verdicts) if v is None]
        t0 = time.perf_counter()
        if todo and not self.ready.wait(IMPORT_WAIT_S):
            return {"error": f"the training stack did not import in {IMPORT_WAIT_S} s"}
        waited = time.perf_counter() - t0
        if todo and self.state != "ready":
            self.ending.set()  # nothing to keep warm
            return {"missing": self.missing} if self.state == "missing" else {"error": self.error}
        t1 = time.perf_counter()
        if todo:
            from hpc_llm.job.rank.foundry_check import check_points

            with self.checking:
                found = check_points([points[i] for i in todo])
            made_with = sources()
            for i, problems in zip(todo, found, strict=True):
                verdicts[i] = [list(p) for p in problems]
                cache.put(keys[i], problems, made_with)
        return {
            "problems": [[i, key, message] for i, v in enumerate(verdicts) for key, message in v or ()],
            "cached": len(points) - len(todo),
            "checked": len(todo),
            "waited_s": round(waited, 3),
            "import_s": round((self.ready_at or time.time()) - self.started, 3),
            "check_s": round(time.perf_counter() - t1, 3),
            "stack": self.versions,
        }


def _rss_mb() -> float | None:
    with contextlib.suppress(OSError, ValueError, IndexError):
        with open("/proc/self/status") as f:
            line = next(ln for ln in f if ln.startswith("VmRSS:"))
        return round(int(line.split()[1]) / 1024, 1)
    return None


class Handler(socketserver.StreamRequestHandler):
    timeout = READ_TIMEOUT_S
    server: Server

    def handle(self) -> None:
        checker = self.server.checker
        checker.busy(+1)
        try:
            try:
                request = json.loads(self.rfile.readline())
                op = request.get("op")
                if op == "hello":
                    reply = checker.hello()
                elif op == "check":
                    reply = checker.check(list(request["points"]), bool(request.get("cache", True)))
                elif op == "stop":
                    checker.ending.set()
                    reply = {"stopping": True}
                else:
                    reply = {"error": f"unknown request {op!r}; allowed: hello, check, stop"}
            except Exception as exc:  # one bad request is that client's answer, not the end of the checker
                reply = {"error": f"{type(exc).__name__}: {exc}".splitlines()[0]}
            with contextlib.suppress(OSError):
                self.wfile.write((json.dumps(reply) + "\n").encode())
        finally:
            checker.busy(-1)


class Server(socketserver.ThreadingUnixStreamServer):
    """socketserver's threaded Unix-socket server; the glue below is what it does not do: a
    socket made 0600 from the start (the umask while binding), peers of another uid refused
    (SO_PEERCRED), and knowing whether the path is still this server's."""

    daemon_threads = True

    def __init__(self, path: str, checker: Checker) -> None:
        self.checker = checker
        super().__init__(path, Handler, bind_and_activate=False)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # a dead checker's: this one holds the lock
        old = os.umask(0o177)
        try:
            self.server_bind()
        finally:
            os.umask(old)
        os.chmod(path, 0o600)
        self.inode = os.stat(path).st_ino
        self.server_activate()

    def verify_request(self, request: Any, client_address: Any) -> bool:
        creds = request.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        _pid, uid, _gid = struct.unpack("3i", creds)
        return bool(uid == os.getuid())

    def owns_socket(self) -> bool:
        try:
            return os.stat(self.server_address).st_ino == self.inode  # type: ignore[arg-type]
        except OSError:
            return False


def _write_record(path: str, record: dict[str, Any]) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(record, f)
    os.replace(tmp, path)


def serve(args: argparse.Namespace) -> int:
    os.umask(0o077)  # its record, its socket and the verdicts it writes: the user's alone
    lock = open(args.lock, "a")  # noqa: SIM115 - held until the process ends
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return 0  # another checker of this environment is up or starting: the client finds it
    with contextlib.suppress(OSError):
        os.ftruncate(sys.stderr.fileno(), 0)  # its log: this checker's alone
    checker = Checker(args)
    server = Server(args.socket, checker)
    record = {"pid": os.getpid(), "socket": args.socket, "name": args.name, "started": checker.started}
    _write_record(args.record, {**record, "idle_s": args.idle_s, "environment": args.environment})
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True).start()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: checker.ending.set())
    checker.import_stack()  # in the main thread: some of the stack sets signal handlers as it imports
    threading.Thread(target=checker.cache.prune, daemon=True).start()
    while not checker.ending.wait(1.0):
        if checker.idle_for() > args.idle_s or not server.owns_socket():
            break
    server.shutdown()  # no new request; those under way are answered first
    deadline = time.monotonic() + READ_TIMEOUT_S
    while checker.active and time.monotonic() < deadline:
        time.sleep(0.02)
    if server.owns_socket():
        with contextlib.suppress(OSError):
            os.unlink(args.socket)
    with contextlib.suppress(OSError):
        os.unlink(args.record)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hpc_llm.job.rank.check_server")
    parser.add_argument("--socket", required=True, help="the Unix socket to listen on")
    parser.add_argument("--lock", required=True, help="held for the checker's life: one checker per lock")
    parser.add_argument("--record", required=True, help="a JSON file saying who this checker is")
    parser.add_argument("--cache", help="the verdicts' directory (hpc_llm.job.rank.verdict_cache)")
    parser.add_argument("--environment", default="", help="the environment as the login side names it")
    parser.add_argument("--name", default="", help="the environment, for hpc-llm check --status")
    parser.add_argument("--idle-s", type=float, default=600, help="end after this many seconds without a request")
    return serve(parser.parse_args(argv))


if __name__ == "__main__":  # pragma: no cover - started by the login side
    code = main()
    sys.stderr.flush()
    os._exit(code)  # the interpreter's teardown of the loaded stack (~2 s) helps nobody
