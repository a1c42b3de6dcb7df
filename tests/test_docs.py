"""Every hookspec is documented, with its signature, in the plugin guide."""

import inspect

from hpc_llm.plugins import hookspecs
from tests.conftest import ROOT


def test_every_hookspec_is_documented_with_its_signature():
    doc = (ROOT / "docs" / "plugins.md").read_text()
    specs = [name for name, fn in inspect.getmembers(hookspecs, inspect.isfunction) if name.startswith("hpc_llm_")]
    assert len(specs) >= 4
    for name in specs:
        params = ", ".join(inspect.signature(getattr(hookspecs, name)).parameters)
        assert f"`{name}({params})`" in doc, f"docs/plugins.md does not document {name}({params})"


def test_every_hook_is_prefixed():
    for name, fn in inspect.getmembers(hookspecs, inspect.isfunction):
        if hasattr(fn, "hpc_llm_spec"):
            assert name.startswith("hpc_llm_")
