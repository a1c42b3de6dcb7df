"""Accounting for the dev cluster: a private MariaDB and a slurmdbd, so ``sacct`` works.

Everything lives under the cluster root, outside /tmp:
``db/`` (MariaDB's datadir), ``etc/my.cnf``, ``etc/slurmdbd.conf`` (mode 0600, next to
slurm.conf: slurmdbd has no ``-f`` and finds it through ``$SLURM_CONF``), ``run/`` (pid files,
MariaDB's unix socket), ``log/``.

MariaDB is started by hand (``mariadb-install-db`` once, then ``mariadbd``), not through
systemd, as root, with ``skip-networking``: it listens on its unix socket only, so it takes
no TCP port; slurmdbd reaches it there through ``$MYSQL_UNIX_PORT`` (``StorageHost=localhost``).
slurmdbd listens on ``dbd_port`` (the dev cluster derives it from its ctld port); slurmctld
reaches it at ``addr``: 127.0.0.1, or the bridge's address of a cluster whose nodes are hosts
(their ``sacct`` asks it too).
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import time
from pathlib import Path

from hpc_llm.errors import ConfigError

DB_NAME = "slurm_acct_db"
DB_USER = "slurm"
BINARIES = ("mariadbd", "mariadb-install-db", "mariadb", "mariadb-admin", "slurmdbd", "sacctmgr", "sacct")
# unix socket paths are limited to 108 bytes (sun_path), NUL included.
_MAX_SOCKET_PATH = 107


class Paths:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.datadir = root / "db"
        self.my_cnf = root / "etc" / "my.cnf"
        self.dbd_conf = root / "etc" / "slurmdbd.conf"
        self.socket = root / "run" / "mariadb.sock"
        self.mariadb_pid = root / "run" / "mariadbd.pid"
        self.slurmdbd_pid = root / "run" / "slurmdbd.pid"
        self.mariadb_log = root / "log" / "mariadbd.log"
        self.slurmdbd_log = root / "log" / "slurmdbd.log"


def missing_binaries(path: str | None = None) -> list[str]:
    """The binaries accounting needs that are not on ``path`` (default: $PATH)."""
    return [b for b in BINARIES if shutil.which(b, path=path) is None]


def my_cnf(p: Paths) -> str:
    return f"""\
# Written by `hpc-llm dev-cluster up`: the dev cluster's accounting database (MariaDB).
[mariadbd]
datadir={p.datadir}
socket={p.socket}
pid-file={p.mariadb_pid}
log-error={p.mariadb_log}
user=root
# the unix socket only: no TCP port to collide with another dev cluster's
skip-networking
bind-address=127.0.0.1
innodb_buffer_pool_size=128M
innodb_log_file_size=16M
# slurmdbd warns below 900
innodb_lock_wait_timeout=900
skip-log-bin

[client]
socket={p.socket}
"""


def slurmdbd_conf(
    p: Paths, dbd_port: int, password: str, plugin_dir: Path | None = None, addr: str = "127.0.0.1"
) -> str:
    # a Slurm in a private prefix (24.11): its own plugins, not the compiled-in (system's) dir
    plugins = f"PluginDir={plugin_dir}\n" if plugin_dir else ""
    return f"""\
# Written by `hpc-llm dev-cluster up`. Mode 0600: slurmdbd refuses to start otherwise.
{plugins}AuthType=auth/none
DbdHost=localhost
DbdAddr={addr}
DbdPort={dbd_port}
SlurmUser=root
PidFile={p.slurmdbd_pid}
LogFile={p.slurmdbd_log}
DebugLevel=info
StorageType=accounting_storage/mysql
# localhost: MariaDB's unix socket, named by $MYSQL_UNIX_PORT in slurmdbd's environment
StorageHost=localhost
StorageUser={DB_USER}
StoragePass={password}
StorageLoc={DB_NAME}
"""


def _run(cmd: list[str], **kw) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


def _mariadb_ready(p: Paths) -> bool:
    return _run(["mariadb-admin", f"--socket={p.socket}", "--connect-timeout=2", "ping"]).returncode == 0


def start_mariadb(p: Paths, timeout_s: float = 30) -> None:
    """Initialise the datadir (first time only) and start ``mariadbd``; wait until it answers."""
    if len(str(p.socket)) > _MAX_SOCKET_PATH:
        raise ConfigError(f"dev-cluster root {p.root} is too long for MariaDB's unix socket {p.socket}")
    p.my_cnf.write_text(my_cnf(p))
    if not (p.datadir / "mysql").is_dir():
        shutil.rmtree(p.datadir, ignore_errors=True)
        out = _run(
            [
                "mariadb-install-db",
                f"--defaults-file={p.my_cnf}",
                "--auth-root-authentication-method=socket",
                "--skip-test-db",
            ]
        )
        if out.returncode != 0:
            raise RuntimeError(f"mariadb-install-db failed (rc={out.returncode}): {out.stderr.strip()[-2000:]}")
    p.socket.unlink(missing_ok=True)
    with open(p.mariadb_log, "ab") as log:
        # setsid -f: mariadbd stays in the foreground, so detach it (no zombie left in our process)
        subprocess.run(
            ["setsid", "-f", "mariadbd", f"--defaults-file={p.my_cnf}"],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            check=True,
        )
    deadline = time.monotonic() + timeout_s
    while not _mariadb_ready(p):
        if time.monotonic() > deadline:
            raise RuntimeError(f"MariaDB did not answer within {timeout_s:.0f}s; see {p.mariadb_log}")
        time.sleep(0.1)


def prepare_database(p: Paths, wipe: bool) -> str:
    """``slurm_acct_db`` (emptied when ``wipe``) and its user, with a new password; returns it.

    Wipe it whenever slurmctld's state is new: job ids start from 1 again then, and sacct would
    mix the jobs of an earlier cluster with this one's (``sacct -j`` shows both)."""
    password = secrets.token_hex(12)
    sql = (
        (f"DROP DATABASE IF EXISTS {DB_NAME}; " if wipe else "")
        + f"CREATE DATABASE IF NOT EXISTS {DB_NAME}; "
        + f"CREATE OR REPLACE USER '{DB_USER}'@'localhost' IDENTIFIED BY '{password}'; "
        + f"CREATE OR REPLACE USER '{DB_USER}'@'127.0.0.1' IDENTIFIED BY '{password}'; "
        + f"GRANT ALL ON {DB_NAME}.* TO '{DB_USER}'@'localhost'; "
        + f"GRANT ALL ON {DB_NAME}.* TO '{DB_USER}'@'127.0.0.1';"
    )
    out = _run(["mariadb", f"--socket={p.socket}", "-e", sql])
    if out.returncode != 0:
        raise RuntimeError(f"creating {DB_NAME} failed: {out.stderr.strip()}")
    return password


def start_slurmdbd(
    p: Paths,
    slurm_conf: Path,
    dbd_port: int,
    password: str,
    timeout_s: float = 30,
    plugin_dir: Path | None = None,
    addr: str = "127.0.0.1",
    wrap: list[str] | None = None,
) -> None:
    """Write slurmdbd.conf and start slurmdbd; wait until it accepts connections at ``addr``.
    ``plugin_dir``: a Slurm in a private prefix, whose slurmdbd is ``<plugin_dir>/../bin/slurmdbd``.
    ``wrap``: a command that runs slurmdbd (the dev cluster's controller namespaces)."""
    p.dbd_conf.write_text(slurmdbd_conf(p, dbd_port, password, plugin_dir, addr))
    p.dbd_conf.chmod(0o600)
    env = dict(os.environ, SLURM_CONF=str(slurm_conf), MYSQL_UNIX_PORT=str(p.socket))
    slurmdbd = str(plugin_dir.parent / "bin" / "slurmdbd") if plugin_dir else "slurmdbd"
    subprocess.run([*(wrap or []), slurmdbd], env=env, check=True)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with socket.create_connection((addr, dbd_port), timeout=1):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"slurmdbd not listening on {dbd_port} after {timeout_s:.0f}s; see {p.slurmdbd_log}")
            time.sleep(0.1)


def add_cluster(slurm_conf: Path, cluster: str, timeout_s: float = 30, path: str | None = None) -> None:
    """Register ``cluster`` with slurmdbd (slurmctld would on its first registration too);
    "already exists" is fine. ``path``: the PATH that finds this Slurm's sacctmgr."""
    env = dict(os.environ, SLURM_CONF=str(slurm_conf), **({"PATH": path} if path else {}))
    deadline = time.monotonic() + timeout_s
    while True:
        out = _run(["sacctmgr", "-i", "add", "cluster", cluster], env=env)
        text = out.stdout + out.stderr
        if out.returncode == 0 or "already exists" in text.lower():
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"sacctmgr add cluster {cluster} failed (rc={out.returncode}): {text.strip()}")
        time.sleep(0.5)
