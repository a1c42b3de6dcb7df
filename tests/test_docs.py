"""The docs agree with the code.

Every hookspec is documented, with its signature, in the plugin reference; the
upstream fixes are one numbered list in docs/upstream-fixes.md that the code and
the docs cite by number; every module and file the docs name exists, and every
module under hpc_llm/job/ is named in the design docs; every `docs/...md,
"Section"` citation names a section that exists; every config key and every
`hpc-llm` command and option is in the reference; no doc grows past ~600 lines.
"""

import ast
import inspect
import re
from pathlib import Path

from hpc_llm.plugins import hookspecs
from tests.conftest import ROOT

DOCS = ROOT / "docs"
PLUGINS_DOC = DOCS / "reference" / "plugins.md"


def docs_files() -> list[Path]:
    """README.md and every Markdown file under docs/."""
    return [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]


def test_every_hookspec_is_documented_with_its_signature():
    doc = PLUGINS_DOC.read_text()
    specs = [name for name, fn in inspect.getmembers(hookspecs, inspect.isfunction) if name.startswith("hpc_llm_")]
    assert len(specs) >= 4
    for name in specs:
        params = ", ".join(inspect.signature(getattr(hookspecs, name)).parameters)
        assert f"`{name}({params})`" in doc, f"docs/reference/plugins.md does not document {name}({params})"


def test_every_hook_is_prefixed():
    for name, fn in inspect.getmembers(hookspecs, inspect.isfunction):
        if hasattr(fn, "hpc_llm_spec"):
            assert name.startswith("hpc_llm_")


def test_every_method_of_the_component_interfaces_is_documented():
    from hpc_llm.plugins.base import KINDS

    doc = PLUGINS_DOC.read_text()
    for base in KINDS.values():
        for name, _fn in inspect.getmembers(base, inspect.isfunction):
            if not name.startswith("_"):
                assert f"`{name}(" in doc, f"docs/reference/plugins.md does not document {base.__name__}.{name}"
        if base.__name__ == "Evaluator":
            assert "`top_level_keys`" in doc


def test_docs_cite_no_file_outside_the_repository():
    """The project's design docs are docs/design/; nothing points at files elsewhere."""
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
    assert (DOCS / "design" / "overview.md").is_file()


# -- the upstream fixes: one numbered list, in docs/upstream-fixes.md ---------------

FIXES = DOCS / "upstream-fixes.md"
COMPAT = ROOT / "hpc_llm" / "job" / "rank" / "compat.py"
#: "upstream fix 3", "upstream fixes 3 and 4", "upstream fixes 8 to 12" (line breaks allowed);
#: "upstream hazard N" is the same citation in older wording
CITATION = re.compile(r"upstream\s+(?:fix|hazard)(?:e?s)?\s+(\d+)(?:\s*(,|and|to|-)\s*(\d+))?")
#: "`hpc_llm/job/rank/task.py: node_local_dir`": a name defined in that file
LOCATION = re.compile(r"(hpc_llm/[\w/]+\.py): (\w+)")
#: what a list entry says the upstream version is: "(Composer 0.32)", "(torch 2.7)", ...
VERSION = re.compile(r"\(([A-Za-z][\w. -]*? \d+\.\d+)")


def upstream_fixes(doc: str) -> dict[int, str]:
    """The numbered list of docs/upstream-fixes.md: number -> the entry's text."""
    section = doc
    starts = list(re.finditer(r"^(\d+)\. \*\*", section, re.M))
    entries: dict[int, str] = {}
    for i, m in enumerate(starts):
        end = starts[i + 1].start() if i + 1 < len(starts) else len(section)
        number = int(m.group(1))
        assert number not in entries, f"upstream fix {number} is numbered twice"
        entries[number] = section[m.start() : end]
    return entries


def cited_fixes(text: str) -> set[int]:
    """The fix numbers a text cites."""
    cited: set[int] = set()
    for m in CITATION.finditer(text):
        first, joiner, last = int(m.group(1)), m.group(2), m.group(3)
        if last is None:
            cited.add(first)
        elif joiner in ("to", "-"):
            cited.update(range(first, int(last) + 1))
        else:
            cited.update({first, int(last)})
    return cited


def applied_patches() -> list[ast.FunctionDef]:
    """The patch functions compat.apply() calls, in order."""
    tree = ast.parse(COMPAT.read_text())
    functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    calls = [
        n.func.id
        for n in ast.walk(functions["apply"])
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in functions
    ]
    patches = [name for name in functions if name.startswith("_patch_")]
    assert sorted(calls) == sorted(patches), f"compat.apply() calls {calls}, compat.py defines {patches}"
    return [functions[name] for name in calls]


def _citing_files() -> list[Path]:
    this = Path(__file__).resolve()
    files = docs_files()
    for folder in ("hpc_llm", "hydra_plugins", "tests", "benchmarks", "sbatch_templates", "conf", "scripts"):
        files += sorted(
            p for p in (ROOT / folder).rglob("*") if p.suffix in (".py", ".md", ".j2", ".yaml", ".sh") and p.is_file()
        )
    return [p for p in files if p.resolve() != this]


def test_upstream_fixes_are_numbered_1_to_n_and_each_says_what_version_and_where():
    fixes = upstream_fixes(FIXES.read_text())
    assert list(fixes) == list(range(1, len(fixes) + 1)), f"docs/upstream-fixes.md numbers them {list(fixes)}"
    for number, entry in fixes.items():
        assert VERSION.search(entry), f"upstream fix {number} names no upstream version: {entry[:80]!r}"
        where = LOCATION.findall(entry)
        assert where, f"upstream fix {number} does not say where the code handles it (`hpc_llm/...py: name`)"


def test_every_cited_upstream_fix_exists():
    fixes = upstream_fixes(FIXES.read_text())
    wrong = {
        str(p.relative_to(ROOT)): sorted(cited_fixes(p.read_text(errors="replace")) - set(fixes))
        for p in _citing_files()
    }
    assert {k: v for k, v in wrong.items() if v} == {}, f"cited, but docs/upstream-fixes.md has 1-{len(fixes)}"
    for text in (COMPAT.read_text(), (DOCS / "guides" / "long-runs.md").read_text()):
        assert cited_fixes(text), "compat.py and the guides cite the fixes by number"


def test_every_patch_compat_applies_is_cited_by_number_and_the_entry_names_it():
    fixes = upstream_fixes(FIXES.read_text())
    patches = applied_patches()
    assert len(patches) >= 6
    covered: set[int] = set()
    for fn in patches:
        numbers = cited_fixes(ast.get_docstring(fn) or "")
        assert numbers, f"compat.{fn.name}'s docstring cites no 'docs/upstream-fixes.md, upstream fix N'"
        for n in numbers:
            assert n in fixes, f"compat.{fn.name} cites upstream fix {n}, which docs/upstream-fixes.md lacks"
            assert f"hpc_llm/job/rank/compat.py: {fn.name}" in fixes[n], (
                f"upstream fix {n} does not name compat.{fn.name}"
            )
        covered |= numbers
    in_compat = {n for n, entry in fixes.items() if "hpc_llm/job/rank/compat.py: " in entry}
    assert in_compat == covered, f"entries naming compat.py {sorted(in_compat)}, patches citing {sorted(covered)}"
    assert not re.search(r"^\s*\d+\. ", ast.get_docstring(ast.parse(COMPAT.read_text())) or "", re.M), (
        "compat.py keeps no numbered list of its own"
    )


def test_citation_parsing():
    assert cited_fixes("docs/upstream-fixes.md, upstream\n   fix 1; upstream fixes 3 and 4") == {1, 3, 4}
    assert cited_fixes("upstream fixes 8 to 10, upstream hazard 2") == {2, 8, 9, 10}
    assert cited_fixes("the upstream version; fixes 3") == set()


# -- every module or file the docs name exists -------------------------------------

#: paths in the docs that are upstream's, not this repository's
UPSTREAM_PATHS = {"scripts/train/yamls/pretrain/mpt-*.yaml"}  # LLM Foundry's pretraining yamls
_NOT_IN_A_NAME = r"(?<![\w./~$<>-])"
FILE_PATH = re.compile(
    _NOT_IN_A_NAME
    + r"(?:hpc_llm|tests|benchmarks|scripts|sbatch_templates|containers|conf|docs|plugins|hydra_plugins)/[\w./*-]*"
)
MODULE = re.compile(_NOT_IN_A_NAME + r"hpc_llm(?:\.[A-Za-z_]\w*)+")
#: a module named from its folder in the package, as flow pictures do: "job/task.py"
SHORT_PATH = re.compile(
    _NOT_IN_A_NAME + r"(?:config|plugins|launch|slurm|doctor|devcluster|rundir|job|builtin|data|results)/\w+\.py"
)


def _wheel_paths() -> dict[str, str]:
    """Paths a wheel has that the repository keeps elsewhere (hpc_llm/_data/conf -> conf)."""
    text = (ROOT / "pyproject.toml").read_text()
    table = re.search(r"^\[tool\.hatch\.build\.targets\.wheel\.force-include\]\n(.*?)(?=^\[|\Z)", text, re.M | re.S)
    pairs = re.findall(r'^"([^"]+)" = "([^"]+)"', table.group(1) if table else "", re.M)
    return {dest: src for src, dest in pairs}


def _path_exists(name: str) -> bool:
    name = name.rstrip(".")
    for dest, src in _wheel_paths().items():
        if dest.startswith(name.rstrip("/") + "/"):
            return True  # a folder only the wheel has
        if name == dest or name.startswith(dest + "/"):
            name = src + name[len(dest) :]
    if "*" in name:
        return any(ROOT.glob(name.rstrip("/")))
    return (ROOT / name).exists()


def _top_level_names(module: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.parse(module.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
            if any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
                names |= {e.value for e in getattr(node.value, "elts", []) if isinstance(e, ast.Constant)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.ImportFrom):
            names |= {a.asname or a.name for a in node.names}
    return names


def _module_exists(dotted: str) -> bool:
    """``hpc_llm.x.y`` is a module or package, or ``hpc_llm.x.y.Name`` one of its top-level names."""
    path = ROOT / "hpc_llm"
    parts = dotted.split(".")[1:]
    while parts and (path / parts[0]).is_dir():
        path = path / parts.pop(0)
    if parts and (path / f"{parts[0]}.py").is_file():
        path = path / f"{parts.pop(0)}.py"
    if not parts:
        return True
    module = path if path.suffix == ".py" else path / "__init__.py"
    return module.is_file() and parts[0] in _top_level_names(module)


def missing_names(text: str) -> list[str]:
    """The module and file paths a text names that the repository does not have."""
    missing = [
        p
        for p in FILE_PATH.findall(text)
        if p not in UPSTREAM_PATHS and not _path_exists(re.sub(r"\b[A-Z][A-Z_]+\b", "*", p))  # NAME: any
    ]
    missing += [
        p for p in SHORT_PATH.findall(text) if not (ROOT / "hpc_llm" / p).is_file() and not (ROOT / p).is_file()
    ]
    missing += [m for m in MODULE.findall(text) if not _module_exists(m)]
    for path, name in LOCATION.findall(text):
        if not (ROOT / path).is_file() or name not in _top_level_names(ROOT / path):
            missing.append(f"{path}: {name}")
    return missing


def test_every_module_and_file_the_docs_name_exists():
    missing = {str(p.relative_to(ROOT)): missing_names(p.read_text()) for p in docs_files()}
    assert {k: v for k, v in missing.items() if v} == {}


# -- the design docs name every module of the job ------------------------------------

DESIGN = DOCS / "design"


def job_modules() -> list[str]:
    """Every module under hpc_llm/job/, as a path (packages' ``__init__.py`` left out)."""
    return sorted(str(p.relative_to(ROOT)) for p in (ROOT / "hpc_llm" / "job").rglob("*.py") if p.name != "__init__.py")


def named_in(text: str, module: str) -> bool:
    """``module`` (``hpc_llm/job/x/y.py``) is named in ``text``: by its path or its dotted name."""
    dotted = module[: -len(".py")].replace("/", ".").removesuffix(".__main__")
    return module in text or re.search(rf"{re.escape(dotted)}(?![\w.])", text) is not None


def test_every_module_under_job_is_named_in_the_design_docs():
    text = "\n".join(p.read_text() for p in sorted(DESIGN.rglob("*.md")))
    unnamed = [m for m in job_modules() if not named_in(text, m)]
    assert len(job_modules()) > 20
    assert unnamed == [], f"modules of hpc_llm/job/ that docs/design/ never names: {unnamed}"


def test_a_module_is_named_by_its_path_or_its_dotted_name():
    assert named_in("`hpc_llm/job/rank/fence.py`", "hpc_llm/job/rank/fence.py")
    assert named_in("(hpc_llm.job.rank.fence)", "hpc_llm/job/rank/fence.py")
    assert named_in("python -m hpc_llm.job.agent", "hpc_llm/job/agent/__main__.py")
    assert not named_in("hpc_llm.job.rank.fenced", "hpc_llm/job/rank/fence.py")
    assert not named_in("fence.py", "hpc_llm/job/rank/fence.py")


# -- links, sizes, the reference against the code ---------------------------------------

#: [text](target) in Markdown; targets that leave the repository are left out
LINK = re.compile(r"\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but - and _ dropped, spaces -."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    return {slug(h) for h in re.findall(r"^#+ (.+)$", text, re.M)}


def test_every_link_between_the_docs_leads_somewhere():
    broken = []
    for doc in docs_files():
        for target in LINK.findall(re.sub(r"```.*?```", "", doc.read_text(), flags=re.S)):
            if re.match(r"[a-z]+:", target):
                continue  # https://, mailto:
            file, _, anchor = target.partition("#")
            path = (doc.parent / file).resolve() if file else doc
            if not path.exists():
                broken.append(f"{doc.relative_to(ROOT)}: {target}")
            elif anchor and path.suffix == ".md" and anchor not in anchors(path):
                broken.append(f"{doc.relative_to(ROOT)}: {target} (no such heading)")
    assert broken == [], broken


def test_slugs_are_githubs():
    assert slug("Slurm 24.11 beside 22.05, verified") == "slurm-2411-beside-2205-verified"
    assert slug("What hpc_llm sets in it") == "what-hpc_llm-sets-in-it"
    assert slug("The seeds' experiments") == "the-seeds-experiments"
    assert slug("`dev-cluster`") == "dev-cluster"


def test_the_readme_is_a_front_door_and_no_doc_is_a_tome():
    assert len((ROOT / "README.md").read_text().splitlines()) < 300
    long = {str(p.relative_to(ROOT)): n for p in DOCS.rglob("*.md") if (n := len(p.read_text().splitlines())) > 650}
    assert long == {}, f"split these by purpose: {long}"


def test_every_config_key_is_in_the_reference():
    import dataclasses

    from hpc_llm.config import schema

    doc = (DOCS / "reference" / "config.md").read_text()
    keys = []
    for f in dataclasses.fields(schema.HpcLlmConfig):
        section = getattr(schema, f.type, None) if isinstance(f.type, str) else f.type
        if dataclasses.is_dataclass(section):
            keys += [f"{f.name}.{g.name}" for g in dataclasses.fields(section)]
        else:
            keys.append(f.name)
    assert len(keys) > 80
    missing = [k for k in keys if f"| `{k}` |" not in doc]
    assert missing == [], f"keys of hpc_llm/config/schema.py that docs/reference/config.md lacks: {missing}"


def test_every_command_and_option_is_in_the_cli_reference():
    import argparse

    from hpc_llm.cli import build_parser

    doc = (DOCS / "reference" / "cli.md").read_text()
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    missing = []
    for name, parser in sub.choices.items():
        if f"### `{name}`" not in doc:
            missing.append(name)
            continue
        section = doc.split(f"### `{name}`", 1)[1].split("\n### ", 1)[0]
        missing += [
            f"{name} {o}"
            for a in parser._actions
            for o in a.option_strings
            if o not in ("-h", "--help") and f"`{o}" not in section
        ]
    assert missing == [], f"docs/reference/cli.md lacks: {missing}"


def test_a_stale_name_is_caught():
    stale = (
        "`hpc_llm/launchers/payload.py`, hpc_llm/trainconfig.py and `hpc_llm/job/distenv.py`; "
        "`hpc_llm.launchers.payload`, hpc_llm.rundir.payload.RankEntry, hpc_llm.job.health; "
        "`hpc_llm/job/rank/task.py: no_such_function`, tests/test_nothing.py, (job/health.py)"
    )
    assert missing_names(stale) == [
        "hpc_llm/launchers/payload.py",
        "hpc_llm/trainconfig.py",
        "hpc_llm/job/distenv.py",
        "tests/test_nothing.py",
        "job/health.py",
        "hpc_llm.launchers.payload",
        "hpc_llm.rundir.payload.RankEntry",
        "hpc_llm.job.health",
        "hpc_llm/job/rank/task.py: no_such_function",
    ]
    fresh = (
        "`hpc_llm/rundir/payload.py`, hpc_llm/job/, hpc_llm.launch.slurm.RankEntry, hpc_llm.job, "
        "hpc_llm.hookimpl, `hpc_llm/job/rank/task.py: node_local_dir`, `.hpc_llm/job.pkl`, "
        "`~/.hpc_llm/dev-cluster`, hpc_llm/_data/conf, containers/*.def, sbatch_templates/default.sh.j2, "
        "(job/rank/preflight.py)"
    )
    assert missing_names(fresh) == []


# -- citations of the docs in code, tests and scripts ---------------------------------

#: docs/design/control-plane.md, "Spare nodes"   /   docs/design/verified/slurm.md ("Slurm 24.11 ...")
SECTION_CITATION = re.compile(r'(docs/[\w/.-]+?\.md)(?:,\s*|\s*\()"([^"]+)"')
#: any doc named by its path
DOC_PATH = re.compile(r"(?<![\w./-])docs/[\w/.-]+?\.md")


def headings(path: Path) -> list[str]:
    return re.findall(r"^#+ (.+)$", re.sub(r"```.*?```", "", path.read_text(), flags=re.S), re.M)


def test_every_cited_doc_and_section_exists():
    wrong = {}
    for p in _citing_files():
        text = p.read_text(errors="replace")
        for doc in DOC_PATH.findall(text):
            if not (ROOT / doc).is_file():
                wrong.setdefault(str(p.relative_to(ROOT)), []).append(doc)
        for doc, title in SECTION_CITATION.findall(text):
            title = " ".join(title.split())
            if (ROOT / doc).is_file() and not any(h.startswith(title) for h in headings(ROOT / doc)):
                wrong.setdefault(str(p.relative_to(ROOT)), []).append(f"{doc}, {title!r}")
    assert wrong == {}, wrong


def test_the_old_design_doc_is_cited_nowhere():
    """docs/design.md was cut into docs/design/, docs/guides/ and docs/upstream-fixes.md."""
    citing = [str(p.relative_to(ROOT)) for p in _citing_files() if "docs/design.md" in p.read_text(errors="replace")]
    assert citing == [], citing
