"""The package's shape holds: one owner for a run directory's names, one reader of
Slurm's job variables, no import circle, a handful of modules at the top.

These are AST walks over the source (imports inside functions included), so they
see what an import-time check cannot.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests.conftest import ROOT

PKG = ROOT / "hpc_llm"
SOURCES = sorted(p for p in PKG.rglob("*.py"))

#: the names of a run directory's files and folders (hpc_llm.rundir.layout.RunDir owns them)
RUN_DIR_NAMES = {
    ".hpc_llm",
    "logs",
    "heartbeat",
    "failures",
    "job.pkl",
    "return.pkl",
    "results.json",
    "attempts.json",
    "progress.json",
    "trained.json",
    "provenance.json",
    "git.diff",
    "sbatch.sh",
    "train_config.yaml",
    "checkpoints",
    "unfinished",
    ".submitit",
}
#: where such a literal means something else, and why
LITERAL_ALLOWED = {
    ("hpc_llm/rundir/layout.py", "*"): "the one owner",
    # the user's own state directory (~/.hpc_llm: ledger, dev cluster), not a run dir
    ("hpc_llm/paths.py", ".hpc_llm"): "the user's state dir",
    # the name of the `hpc-llm logs` subcommand
    ("hpc_llm/cli.py", "logs"): "a subcommand's name",
    ("hpc_llm/cli.py", ".hpc_llm"): "help text naming the user's state dir",
    # torch DCP's CheckpointException.failures (an attribute), not the run dir's folder
    ("hpc_llm/job/rank/safe_load.py", "failures"): "an attribute of torch's exception",
}
#: Slurm variables that are not about the job (the client's config file)
NOT_JOB_VARIABLES = {"SLURM_CONF"}


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the Constant nodes that are docstrings (prose may name files)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def run_dir_literals(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    docs = _docstrings(tree)
    rel = _rel(path)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            value = node.value
            names = {value} | set(re.split(r"[/\\]", value))
            for name in sorted(names & RUN_DIR_NAMES):
                if (rel, "*") in LITERAL_ALLOWED or (rel, name) in LITERAL_ALLOWED:
                    continue
                found.append(f"{rel}:{node.lineno}: {value!r}")
    return found


def slurm_variable_reads(path: Path) -> list[str]:
    """``env["SLURM_X"]``, ``env.get("SLURM_X")``, ``os.getenv("SLURM_X")``, ``"SLURM_X" in env``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    rel = _rel(path)

    def slurm(node: ast.AST | None) -> str | None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("SLURM_"):
            return node.value if node.value not in NOT_JOB_VARIABLES else None
        return None

    found = []
    for node in ast.walk(tree):
        name = None
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
            name = slurm(node.slice)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args:
            if node.func.attr in ("get", "getenv", "pop", "setdefault"):
                name = slurm(node.args[0])
        elif isinstance(node, ast.Compare) and any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops):
            name = slurm(node.left)
        if name:
            found.append(f"{rel}:{node.lineno}: reads {name}")
    return found


def test_the_walks_find_what_they_look_for(tmp_path):
    """The checks below would fail on code like today's before the refactor (and on a typo'd path)."""
    bad = tmp_path / "hpc_llm" / "bad.py"
    bad.parent.mkdir()
    bad.write_text(
        "import os\n"
        "from pathlib import Path\n"
        "def f(run_dir):\n"
        "    '''reads results.json'''\n"
        "    p = Path(run_dir) / '.hpc_llm' / 'trained.json'\n"
        "    q = Path(run_dir, 'logs/rank0.log')\n"
        "    return os.environ.get('SLURM_PROCID'), os.environ['SLURM_JOB_ID'], 'SLURM_NTASKS' in os.environ\n"
    )
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        assert len(run_dir_literals(bad)) == 3  # '.hpc_llm', 'trained.json', 'logs/rank0.log'; not the docstring
        assert len(slurm_variable_reads(bad)) == 3
    finally:
        ROOT = saved


@pytest.mark.parametrize("path", SOURCES, ids=_rel)
def test_no_run_dir_name_outside_RunDir(path):
    assert not run_dir_literals(path), "use hpc_llm.rundir.layout.RunDir: " + "; ".join(run_dir_literals(path))


@pytest.mark.parametrize("path", SOURCES, ids=_rel)
def test_no_slurm_job_variable_read_outside_JobEnv(path):
    if _rel(path) == "hpc_llm/job/env.py":
        return
    assert not slurm_variable_reads(path), "use hpc_llm.job.env.JobEnv: " + "; ".join(slurm_variable_reads(path))


# -- imports ------------------------------------------------------------------


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def import_graph(paths: list[Path]) -> dict[str, set[str]]:
    """module -> the hpc_llm modules it imports anywhere in its source (functions included)."""
    modules = {module_name(p): p for p in paths}

    def resolve(target: str) -> str | None:
        while target and target not in modules:
            target = target.rpartition(".")[0]
        return target or None

    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [f"{node.module}.{a.name}" for a in node.names]
            else:
                continue
            for t in targets:
                if t.startswith("hpc_llm"):
                    dep = resolve(t)
                    if dep and dep != name and dep != "hpc_llm":
                        deps.add(dep)
        graph[name] = deps
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_cycle_finder_finds_a_circle_through_a_lazy_import(tmp_path):
    pkg = tmp_path / "hpc_llm"
    (pkg / "job").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "job" / "__init__.py").write_text("")
    (pkg / "job" / "entry.py").write_text("from hpc_llm.payload import Payload\n")
    (pkg / "payload.py").write_text("def f():\n    from hpc_llm.job import entry\n")
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        found = cycles(import_graph(sorted(pkg.rglob("*.py"))))
    finally:
        ROOT = saved
    assert found == [["hpc_llm.job.entry", "hpc_llm.payload"]]


def test_no_import_circle_among_hpc_llm_modules():
    assert cycles(import_graph(SOURCES)) == []


def test_the_package_top_is_a_handful_of_modules_and_each_folder_says_its_side():
    modules = sorted(p.name for p in PKG.glob("*.py"))
    assert len(modules) <= 6, modules
    for init in sorted(PKG.glob("*/__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        side = re.search(r"\b(login node|in the job|in-job|both sides)\b", doc, flags=re.I)
        assert len(doc.splitlines()) >= 3 and side, f"{_rel(init)}: say in a few lines what it holds and where it runs"
