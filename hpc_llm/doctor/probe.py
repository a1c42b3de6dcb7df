"""``hpc-llm doctor``'s probe: one tiny job on a compute node that says what the node sees.

It runs through ``srun`` (one task, one CPU, two minutes; the job's partition, account
and QOS), so its report comes back on srun's stdout whatever filesystems the node
shares with the login node. The script is bash (a node without the venv still
answers) and prints ``@@hpc_llm <key>\\t<value>`` lines:

- the node's name, host name, CPUs it may use (``nproc``) and memory (``MemTotal``);
- whether a marker file the login node wrote next to the run dir is there with its
  token, and whether the node can write one back (a private ``/tmp`` from
  ``job_container/tmpfs``, or a filesystem the node does not mount, shows here);
- whether other paths (``--run``, the container image) exist and are readable;
- whether the Python the batch script runs (the supervisor; the ranks too without a
  container) starts there and imports hpc_llm;
- ``apptainer --version``, ``enroot version`` (the runtime NVIDIA's pyxis runs containers
  with: whether the login node's srun loads pyxis is :mod:`hpc_llm.doctor.gather`'s question)
  and ``nvidia-smi -L``, when they are on the task's ``PATH``;
- with the job's data or checkpoints in an object store, the store check the job itself runs
  (``python -m hpc_llm.job.rank.store_check``, in that Python; the targets come in
  ``$HPC_LLM_DOCTOR_STORES``, which srun passes like the rest of the environment, credentials
  included): whether the node reaches the store, and it takes the credentials as the job will.

Login node only: stdlib.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import secrets
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from hpc_llm.slurm.commands import HOW_TO_START, SlurmUnreachable

PREFIX = "@@hpc_llm "
#: the job's #SBATCH flags that decide where the probe may run, besides its partition
PLACEMENT = ("account", "qos", "constraint", "reservation")

#: what the node runs: bash -c SCRIPT doctor TOKEN MARKER APPTAINER ENROOT N PATH... PYTHON...
SCRIPT = r"""
say() { printf '@@hpc_llm %s\t%s\n' "$1" "$2"; }
token=$1 marker=$2 apptainer=$3 enroot=$4 n=$5
shift 5
say node "${SLURMD_NODENAME:-$(hostname)}"
say host "$(hostname)"
say job "${SLURM_JOB_ID:-}"
say cpus "$(nproc 2>/dev/null)"
say mem_kb "$(awk '/^MemTotal:/ {print $2}' /proc/meminfo 2>/dev/null)"
if [ -n "$marker" ]; then
  if [ -r "$marker" ] && [ "$(cat "$marker" 2>/dev/null)" = "$token" ]; then s=seen; else s=missing; fi
  say marker "$s"
  if printf '%s\n' "$token" > "$marker.node" 2>/dev/null; then s=ok; else s=failed; fi
  say marker_write "$s"
fi
i=0
while [ "$i" -lt "$n" ]; do
  p=$1
  shift
  if [ -r "$p" ]; then s=readable; elif [ -e "$p" ]; then s=unreadable; else s=missing; fi
  say "path:$p" "$s"
  i=$((i + 1))
done
if out=$("$@" -c 'import sys, hpc_llm; print(sys.prefix, sys.version.split()[0], hpc_llm.__version__)' 2>&1); then
  say python "ok $out"
else
  say python "failed $(printf '%s' "$out" | tail -n 1)"
fi
if [ -n "${HPC_LLM_DOCTOR_STORES:-}" ]; then
  out=$("$@" -m hpc_llm.job.rank.store_check "$HPC_LLM_DOCTOR_STORES" 2>&1)
  printf '%s\n' "$out" | while IFS= read -r line; do say store "$line"; done
fi
if command -v "$apptainer" >/dev/null 2>&1; then
  say apptainer "$("$apptainer" --version 2>&1 | head -n 1)"
else
  say apptainer ""
fi
if command -v "$enroot" >/dev/null 2>&1; then
  if out=$("$enroot" version 2>&1); then
    say enroot "$(printf '%s\n' "$out" | head -n 1)"
  else
    say enroot "failed $(printf '%s\n' "$out" | tail -n 1)"
  fi
else
  say enroot ""
fi
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi -L 2>&1 | while IFS= read -r line; do say gpu "$line"; done
else
  say nvidia_smi missing
fi
say done 1
"""


@dataclass(frozen=True)
class Probe:
    """What the probe job reported (or why it has no report)."""

    #: None: it ran and reported; else why not (one line)
    error: str | None = None
    #: True: it could not start in time (a busy partition), not a refusal
    busy: bool = False
    node: str = ""
    host: str = ""
    job_id: str = ""
    cpus: int = 0
    mem_kb: int = 0
    #: the marker next to the run dir: seen / missing, and the node's write back: ok / failed
    marker: str = ""
    marker_write: str = ""
    #: the node's own write, seen from the login node (filled in after the job)
    write_seen: bool = False
    #: path -> readable / unreadable / missing
    paths: dict[str, str] = field(default_factory=dict)
    #: "ok <sys.prefix> <python version> <hpc_llm version>" or "failed <last error line>"
    python: str = ""
    #: ``apptainer --version`` ("" when not on the node)
    apptainer: str = ""
    #: ``enroot version`` ("3.5.0"; "" when not on the task's PATH; "failed <last line>" when it
    #: did not answer)
    enroot: str = ""
    #: ``nvidia-smi -L`` lines; None when nvidia-smi is not on the node
    gpus: list[str] | None = None
    #: the store check's lines (``ok``/``fail``/``skip``, a tab, what it found), and anything else
    #: it printed (an error of the node's Python)
    stores: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ran(self) -> bool:
        return self.error is None


def parse(out: str) -> dict[str, list[str]]:
    """The probe's ``@@hpc_llm key\\tvalue`` lines -> key -> values (in order)."""
    found: dict[str, list[str]] = {}
    for line in out.splitlines():
        if line.startswith(PREFIX):
            key, _, value = line[len(PREFIX) :].partition("\t")
            found.setdefault(key, []).append(value.strip())
    return found


def from_report(fields: dict[str, list[str]], seconds: float = 0.0) -> Probe:
    def one(key: str) -> str:
        return (fields.get(key) or [""])[-1]

    def number(key: str) -> int:
        return int(one(key)) if one(key).isdigit() else 0

    return Probe(
        node=one("node"),
        host=one("host"),
        job_id=one("job"),
        cpus=number("cpus"),
        mem_kb=number("mem_kb"),
        marker=one("marker"),
        marker_write=one("marker_write"),
        paths={k.removeprefix("path:"): v[-1] for k, v in fields.items() if k.startswith("path:")},
        python=one("python"),
        apptainer=one("apptainer"),
        enroot=one("enroot"),
        gpus=None if one("nvidia_smi") == "missing" else list(fields.get("gpu", [])),
        stores=list(fields.get("store", [])),
        seconds=seconds,
    )


def nearest_existing(path: str) -> Path:
    """``path`` or its nearest ancestor that exists on this (login) node."""
    p = Path(os.path.abspath(path))
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def srun_command(
    flags: dict[str, object],
    token: str,
    marker: str,
    apptainer: str,
    paths: Sequence[str],
    python: Sequence[str],
    wait_s: int,
    enroot: str = "enroot",
) -> list[str]:
    """The ``srun`` line of the probe. ``flags``: partition, PLACEMENT and gpus_per_node (what
    the job itself would ask, those that decide where it may run)."""
    args = [
        "srun",
        "--nodes=1",
        "--ntasks=1",
        "--cpus-per-task=1",
        "--time=00:02:00",
        "--job-name=hpc_llm-doctor",
        f"--immediate={int(wait_s)}",
        "--quiet",
    ]
    for key in ("partition", *PLACEMENT, "gpus_per_node"):
        value = flags.get(key)
        if value not in (None, "", False, 0):
            args.append(f"--{key.replace('_', '-')}={value}")
    return [
        *args,
        *("bash", "-c", SCRIPT, "hpc_llm-doctor", token, marker, apptainer, enroot),
        *(str(len(paths)), *paths, *python),
    ]


#: the variable the probe reads the store check's targets from (JSON)
STORES_ENV = "HPC_LLM_DOCTOR_STORES"


def run(
    flags: dict[str, object],
    run_dir: str,
    paths: Sequence[str],
    python: Sequence[str],
    apptainer: str = "apptainer",
    wait_s: int = 120,
    stores: str = "",
    enroot: str = "enroot",
) -> Probe:
    """Run the probe job and read its report. The marker goes into the run dir's nearest
    existing ancestor on this node and is removed afterwards, with the node's own copy.
    ``stores``: the store check's targets as JSON (empty: the job uses no object store)."""
    token = secrets.token_hex(8)
    marker = nearest_existing(run_dir) / f".hpc_llm-doctor-{token}"
    wrote = False
    try:
        marker.write_text(token + "\n")
        wrote = True
    except OSError:
        pass  # the node then cannot see it either: reported as not visible
    cmd = srun_command(flags, token, str(marker), apptainer, paths, python, wait_s, enroot=enroot)
    started = time.monotonic()
    try:
        out, err, code = _srun(cmd, timeout=wait_s + 180, stores=stores)
        took = time.monotonic() - started
        fields = parse(out)
        if "done" not in fields:
            lines = [ln.strip() for ln in (err or "").splitlines() if ln.strip()]
            why = (lines or [f"srun exited with {code}"])[-1].removeprefix("srun: error: ")
            busy = code is None or any(
                s in (err or "") for s in ("Unable to allocate resources: Requested nodes are busy", "immediate")
            )
            return Probe(error=f"the probe job did not report ({why})", busy=busy, seconds=took)
        probe = from_report(fields, took)
        node_copy = marker.with_name(marker.name + ".node")
        seen = node_copy.is_file() and node_copy.read_text().strip() == token
        return dataclasses.replace(probe, write_seen=seen, marker=probe.marker if wrote else "missing")
    finally:
        for leftover in (marker, marker.with_name(marker.name + ".node")):
            with contextlib.suppress(OSError):
                leftover.unlink()


def _srun(cmd: list[str], timeout: float, stores: str = "") -> tuple[str, str, int | None]:
    """stdout, stderr and exit status of srun; None as the status when it ran out of time
    (then it is stopped with SIGINT twice, which makes srun cancel its job)."""
    if shutil.which(cmd[0]) is None:
        raise SlurmUnreachable(f"no Slurm reachable: `{cmd[0]}` is not on PATH; {HOW_TO_START}")
    env = {k: v for k, v in os.environ.items() if k != STORES_ENV}
    if stores:
        env[STORES_ENV] = stores
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        out, err = proc.communicate(timeout=timeout)
        return out, err, proc.returncode
    except subprocess.TimeoutExpired:
        for _ in range(2):
            proc.send_signal(signal.SIGINT)
            time.sleep(0.5)
        try:
            out, err = proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        return out, err + f"\nsrun: error: no report within {timeout:.0f} s", None
