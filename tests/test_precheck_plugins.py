"""The check before the queue's cached verdicts and a plugin on ``PYTHONPATH`` (issue #54 item 4).

A callback or logger the check loads from a plain directory on ``sys.path`` (no ``*.dist-info``:
``PYTHONPATH``, a source tree) was outside the stack's fingerprint: edited in place, its verdict
stayed "ok". Now the modules a check loads from such a directory are held by the verdict (by size
and mtime), and a module appearing in it changes the fingerprint.
"""

from __future__ import annotations

import importlib
import sys

from hpc_llm.job.rank import stack_fingerprint
from hpc_llm.job.rank.verdict_cache import VerdictCache


def test_a_plugin_on_pythonpath_edited_in_place_is_not_answered_from_the_cache(tmp_path, monkeypatch):
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    module = plugins / "hpc_llm_test_callback.py"
    module.write_text("THRESHOLD = 1\n")
    # on PYTHONPATH when the check started
    monkeypatch.setattr(sys, "path", [str(plugins), *sys.path])
    start = (str(plugins), *getattr(stack_fingerprint, "_START_PATH", ()))
    monkeypatch.setattr(stack_fingerprint, "_START_PATH", start, raising=False)
    monkeypatch.delitem(sys.modules, "hpc_llm_test_callback", raising=False)
    loaded = importlib.import_module("hpc_llm_test_callback")  # what the check loads (the yaml's callback)
    monkeypatch.setitem(sys.modules, "hpc_llm_test_callback", loaded)  # gone again after the test

    point = {"train": {"callbacks": {"hpc_llm_test_callback": {}}}, "world_size": 2, "device": "cpu"}
    made_with = stack_fingerprint.sources()
    assert str(module) in made_with
    cache = VerdictCache(str(tmp_path / "cache"), "venv", stack_fingerprint.fingerprint())
    cache.put(cache.key(point), [], made_with)
    assert cache.get(cache.key(point)) == []
    module.write_text("THRESHOLD = 1000\n")  # edited in place: what passed may not any more
    assert cache.get(cache.key(point)) is None

    # a file that is no module beside it changes nothing; a module that appears (and could
    # shadow one the check imports) is another stack
    first = stack_fingerprint.fingerprint()
    (plugins / "notes.txt").write_text("the user's notes")
    assert stack_fingerprint.fingerprint() == first
    (plugins / "llmfoundry.py").write_text("")
    assert stack_fingerprint.fingerprint() != first


def test_a_directory_a_library_appends_at_run_time_is_not_the_users(tmp_path, monkeypatch):
    """torch appends a temporary directory to ``sys.path`` when it is imported, gone with the
    process: neither the fingerprint nor a verdict may depend on it."""
    appended = tmp_path / "tmp-of-a-library"
    appended.mkdir()
    (appended / "_remote_module.py").write_text("")
    first = stack_fingerprint.fingerprint()
    monkeypatch.setattr(sys, "path", [*sys.path, str(appended)])
    monkeypatch.delitem(sys.modules, "_remote_module", raising=False)
    monkeypatch.setitem(sys.modules, "_remote_module", importlib.import_module("_remote_module"))
    assert stack_fingerprint.fingerprint() == first
    assert not [p for p in stack_fingerprint.sources() if p.startswith(str(appended))]
