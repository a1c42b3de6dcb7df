"""The wire's messages: every type survives the line it travels as; anything else is dropped."""

from __future__ import annotations

import dataclasses
import socket
import time

import pytest

from hpc_llm.job import messages
from hpc_llm.job.supervisor.fleet import Fleet, Joined

EXAMPLES = [
    messages.Hello("tok", "n1", 1, 42, "10.0.0.1", 4000),
    messages.Warm(3.25),
    messages.Beat(7, (messages.RankBeat(0, 7, 12, "train", 99, 2), messages.RankBeat(1, 6, 12, "save", 98, 2))),
    messages.PortFound(2, 20123),
    messages.Started(2, {0: 99, 1: 98}),
    messages.Exit(2, 1, "n2", -9, "killed by SIGKILL", True),
    messages.Stopped(2, (1,)),
    messages.Stalled(2, 6.5),
    messages.Bye("agent error: RuntimeError: boom"),
    messages.Pong("n1", 2),
    messages.Ping(),
    messages.FindPort(3),
    messages.Start(3, 1, 2, 8, "10.0.0.1", 20123, {"HPC_LLM_GENERATION": "3"}),
    messages.Signal(3, "SIGUSR2"),
    messages.Kill(3),
    messages.End(),
    messages.Probe("tok"),
]


def test_every_message_type_has_an_example():
    assert {type(m) for m in EXAMPLES} == set(messages.TYPES.values())


@pytest.mark.parametrize("msg", EXAMPLES, ids=lambda m: m.T)
def test_a_message_is_one_line_of_json_and_decodes_to_itself(msg):
    line = messages.encode(msg)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert messages.decode(line.rstrip(b"\n")) == msg


@pytest.mark.parametrize(
    "line",
    [b"not json", b"[1, 2]", b'{"t": "nonsense"}', b'{"no": "type"}', b'{"t": "exit", "gen": 1}', b'{"t": "beat"}'],
)
def test_anything_else_is_not_a_message(line):
    assert messages.decode(line) is None


def test_a_newer_peer_s_extra_field_is_ignored():
    line = b'{"t": "kill", "gen": 4, "reason": "from a newer hpc_llm"}'
    assert messages.decode(line) == messages.Kill(4)


def test_an_agent_of_another_wire_version_is_refused_and_one_of_this_version_joins():
    fleet = Fleet("tok", beat_s=1.0, node_timeout_s=3.0, probe_timeout_s=1.5, lease_s=4.5, host="127.0.0.1")
    fleet.start()
    try:
        old = socket.create_connection(("127.0.0.1", fleet.port))
        hello = dataclasses.replace(messages.Hello("tok", "old", 1, 1, "127.0.0.1", 1), v=messages.VERSION + 1)
        old.sendall(messages.encode(hello))
        new = socket.create_connection(("127.0.0.1", fleet.port))
        new.sendall(messages.encode(messages.Hello("tok", "new", 2, 2, "127.0.0.1", 1)))
        deadline, seen = time.monotonic() + 10, []
        while time.monotonic() < deadline and Joined("new") not in seen:
            seen += fleet.events(timeout=0.1)
        assert Joined("new") in seen and Joined("old") not in seen
        old.settimeout(5)
        assert old.recv(1) == b""  # closed by the supervisor
        assert set(fleet.view()) == {"new"}
        old.close()
        new.close()
    finally:
        fleet.close()
