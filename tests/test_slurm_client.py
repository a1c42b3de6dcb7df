"""The one Slurm client's runner (hpc_llm.slurm.commands): a busy controller is asked again, one
that cannot be asked is one error, a refusal is an answer. Fake client commands on PATH that
fail as real ones do (the parsers are tested on real outputs in tests/test_slurm_parsers.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpc_llm.rundir import epoch
from hpc_llm.slurm import commands
from hpc_llm.slurm.commands import SlurmUnreachable

BUSY = "slurm_load_jobs error: Socket timed out on send/recv operation"


@pytest.fixture
def slurm_bin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder first on PATH for fake client commands, and a SLURM_CONF that exists."""
    folder = tmp_path / "bin"
    folder.mkdir()
    conf = tmp_path / "slurm.conf"
    conf.write_text("# a login node's config\n")
    monkeypatch.setenv("PATH", str(folder))  # no real Slurm client: only the fakes
    monkeypatch.setenv("SLURM_CONF", str(conf))
    monkeypatch.setattr(commands, "BUSY_PAUSE_S", 0.01)
    return folder


def fake(folder: Path, name: str, answers: list[tuple[int, str, str]]) -> Path:
    """``name`` answering call i with answers[i] (exit code, stdout, stderr), the last one again
    after that; each call noted in <folder>/<name>.calls."""
    calls = folder / f"{name}.calls"
    lines = ["#!/bin/sh", f'echo x >> "{calls}"', f'n=$(/usr/bin/wc -l < "{calls}")']
    for i, (code, out, err) in enumerate(answers, start=1):
        test = f'[ "$n" -le {i} ]' if i < len(answers) else "true"
        lines.append(f"if {test}; then printf '%s' '{out}'; printf '%s\\n' '{err}' >&2; exit {code}; fi")
    script = folder / name
    script.write_text("\n".join(lines) + "\n")
    script.chmod(0o755)
    return calls


def test_a_busy_controller_is_asked_again_until_it_answers(slurm_bin):
    calls = fake(slurm_bin, "scontrol", [(1, "", BUSY), (1, "", BUSY), (0, "JobId=7 JobState=RUNNING\n", "")])
    out = commands.run(["scontrol", "show", "job", "7"], timeout=10)
    assert out.returncode == 0 and "RUNNING" in out.stdout
    assert len(calls.read_text().splitlines()) == 3


def test_a_controller_busy_every_time_is_one_error_naming_what_it_said(slurm_bin):
    calls = fake(slurm_bin, "squeue", [(1, "", BUSY)])
    with pytest.raises(SlurmUnreachable, match="Socket timed out"):
        commands.run(["squeue", "-h"], timeout=10, tries=3)
    assert len(calls.read_text().splitlines()) == 3


def test_a_refusal_is_an_answer_not_retried(slurm_bin):
    calls = fake(slurm_bin, "scontrol", [(1, "", "slurm_update error: Access/permission denied")])
    with epoch.as_user("a test's update"):
        out = commands.run(["scontrol", "update", "JobId=7", "ExcNodeList=n2"], timeout=10)
    assert out.returncode == 1 and commands.said(out) == "slurm_update error: Access/permission denied"
    assert len(calls.read_text().splitlines()) == 1
    assert commands.asked(["scontrol", "show", "job", "7"], unknown_job="permission denied") is None


def test_a_change_to_slurm_outside_the_epoch_check_is_refused_before_it_runs(slurm_bin):
    """hpc_llm's own code never changes Slurm without the run's epoch check (or the login side's
    as_user): a mutating command asked otherwise is a bug, refused before any scontrol runs."""
    calls = fake(slurm_bin, "scontrol", [(0, "", "")])
    fake(slurm_bin, "scancel", [(0, "", "")])
    for args in (["scontrol", "requeue", "7"], ["scontrol", "update", "JobId=7", "NodeList=n1"], ["scancel", "7"]):
        with pytest.raises(commands.Unchecked, match="without the run's epoch check"):
            commands.run(args, timeout=10)
    assert not calls.exists()
    assert commands.run(["scontrol", "show", "job", "7"], timeout=10).returncode == 0  # a question is no change
    assert len(calls.read_text().splitlines()) == 1


def test_no_client_and_no_config_are_one_line_each(slurm_bin, tmp_path, monkeypatch):
    with pytest.raises(SlurmUnreachable, match="`sinfo` is not on PATH"):
        commands.run(["sinfo"])
    fake(slurm_bin, "sinfo", [(0, "low*|3|16|up\n", "")])
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "missing.conf"))
    with pytest.raises(SlurmUnreachable, match="SLURM_CONF=.*missing.conf does not exist"):
        commands.run(["sinfo"])
