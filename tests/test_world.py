"""The control plane reaches the world only through hpc_llm.world (the seam the simulator replaces).

A module of the supervisor or the agents that called ``time.sleep``, opened a socket, spawned a
process or sent a signal itself would run on the real clock and the real network under the
simulation (hpc_llm.sim): its seeds would stop replaying, and the bug it hides would be found
on a cluster instead. So every such call in the control plane's modules is refused here, by
reading their source; the stdlib modules may still be named for their constants, types and
exceptions (``selectors.EVENT_READ``, ``subprocess.TimeoutExpired``), which touch nothing.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "hpc_llm"

#: the control plane: what the simulator runs for real (docs/design/simulation.md). The ranks'
#: side (hpc_llm/job/rank/, the heartbeat thread in heartbeat.py, the stack's warm-up and node
#: checks) runs only on a real node and is the dev cluster's to test.
CONTROL_PLANE = sorted(
    [
        *(PKG / "job/supervisor").glob("*.py"),
        *(PKG / "job/agent" / n for n in ("loop.py", "orphan.py", "takeover.py", "node.py", "ranks.py")),
        PKG / "job/wire.py",
        PKG / "job/env.py",
        *(PKG / "slurm" / n for n in ("commands.py", "allocation.py", "requeue.py", "query.py")),
        PKG / "rundir/epoch.py",
    ]
)

#: stdlib modules whose calls touch the world: what each may still be named for
WORLD_MODULES = {
    "time": {"strftime", "gmtime", "localtime", "struct_time"},
    "socket": {"IPPROTO_TCP", "TCP_NODELAY", "SOL_SOCKET", "SO_ERROR", "SO_KEEPALIVE", "socket", "timeout"},
    "selectors": {"EVENT_READ", "EVENT_WRITE", "SelectorKey", "BaseSelector"},
    "subprocess": {"TimeoutExpired", "CompletedProcess", "CalledProcessError"},
    # a lock or an event is taken or set only around work that never waits (hpc_llm/job/supervisor/fleet.py)
    "threading": {"Lock", "Event"},
}
#: calls of os and signal that touch the world (the rest, os.path and friends, are pure or file I/O)
WORLD_CALLS = {
    "os": {"kill", "killpg", "fork", "waitpid", "wait", "getpid", "setsid", "environ", "system", "popen"}
    | {f"exec{s}" for s in ("l", "le", "lp", "lpe", "v", "ve", "vp", "vpe")},
    "signal": {"signal", "setitimer", "alarm", "pthread_kill", "set_wakeup_fd"},
}


def touches(path: Path) -> list[str]:
    """Every use in ``path`` of a stdlib name that would reach past the seam."""
    tree = ast.parse(path.read_text())
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in {*WORLD_MODULES, *WORLD_CALLS}:
            allowed = WORLD_MODULES.get(node.module, set())
            banned = WORLD_CALLS.get(node.module, set())
            found += [
                f"{path.relative_to(ROOT)}:{node.lineno}: from {node.module} import {a.name}"
                for a in node.names
                if (node.module in WORLD_MODULES and a.name not in allowed) or a.name in banned
            ]
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            mod, name = node.value.id, node.attr
            if (mod in WORLD_MODULES and name not in WORLD_MODULES[mod]) or name in WORLD_CALLS.get(mod, set()):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {mod}.{name}")
    return found


def test_the_list_is_the_control_plane():
    # a module added to the supervisor's folder is in the list by its glob; the agent's are named
    agent = {p.name for p in (PKG / "job/agent").glob("*.py")}
    named = {p.name for p in CONTROL_PLANE if p.parent.name == "agent"}
    rank_side = {"__init__.py", "__main__.py", "warm.py", "forker.py", "node_check.py"}
    assert agent - named == rank_side, "a new module of the agent: the control plane's (list it) or the ranks' side?"
    assert all(p.is_file() for p in CONTROL_PLANE)


@pytest.mark.parametrize("path", CONTROL_PLANE, ids=lambda p: str(p.relative_to(PKG)))
def test_a_control_plane_module_reaches_the_world_only_through_the_seam(path):
    assert touches(path) == []


def test_a_call_past_the_seam_is_caught(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import os, time, signal, subprocess, selectors\n"
        "from socket import create_connection\n"
        "from subprocess import TimeoutExpired\n"
        "time.sleep(1); os.kill(1, 9); signal.signal(15, None); subprocess.run(['x'])\n"
        "selectors.DefaultSelector(); os.environ.get('X'); os.path.join('a'); selectors.EVENT_READ\n"
    )
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        found = touches(bad)
    finally:
        ROOT = saved
    assert [f.split(": ", 1)[1] for f in found] == [
        "from socket import create_connection",
        "time.sleep",
        "os.kill",
        "signal.signal",
        "subprocess.run",
        "selectors.DefaultSelector",
        "os.environ",
    ]
