"""Every hookspec is documented, with its signature, in the plugin guide."""

import inspect
from pathlib import Path

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


def test_every_method_of_the_component_interfaces_is_documented():
    from hpc_llm.plugins.base import KINDS

    doc = (ROOT / "docs" / "plugins.md").read_text()
    for base in KINDS.values():
        for name, _fn in inspect.getmembers(base, inspect.isfunction):
            if not name.startswith("_"):
                assert f"`{name}(" in doc, f"docs/plugins.md does not document {base.__name__}.{name}"
        if base.__name__ == "Evaluator":
            assert "`top_level_keys`" in doc


def test_docs_cite_no_file_outside_the_repository():
    """The project's design doc is docs/design.md; nothing points at files elsewhere."""
    texts = [
        p
        for p in ROOT.rglob("*")
        if p.suffix in (".py", ".md", ".yaml", ".j2", ".def", ".sh", ".toml")
        and not any(part.startswith(".") for part in p.relative_to(ROOT).parts)
    ]
    this = Path(__file__).resolve()
    cited = [
        str(p.relative_to(ROOT))
        for p in texts
        if p.resolve() != this
        and ("DESIGN.md" in p.read_text(errors="replace") or "../shared" in p.read_text(errors="replace"))
    ]
    assert cited == [], cited
    assert (ROOT / "docs" / "design.md").is_file()
