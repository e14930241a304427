"""The layering rules of docs/architecture.md, read from the code's own imports (function-level imports count:
they run too; imports under `if TYPE_CHECKING:` do not)."""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGES = {"memascend_cli": "memascend_cli", "memascend_engine": "engine", "memascend_presets": "presets"}
MAX_LINES = 700
MAX_FUNCTION_LINES = 150
"""A hard ceiling; the style target is under 100 lines a function."""
SOURCE_FOLDERS = ("memascend_cli", "engine", "csrc", "scripts", "benchmarks", "presets")


def _modules() -> dict[str, pathlib.Path]:
    mods = {}
    for name, folder in PACKAGES.items():
        for path in (ROOT / folder).rglob("*.py"):
            rel = path.relative_to(ROOT / folder).with_suffix("")
            parts = [name, *(p for p in rel.parts if p != "__init__")]
            mods[".".join(parts)] = path
    return mods


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def _imports(name: str, path: pathlib.Path, mods: dict) -> set[str]:
    """The project modules `name` imports, at any depth of its code."""
    found: set[str] = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]

    def visit(node):
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name in mods)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                found.add(sub if sub in mods else target)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text()))
    return {m for m in found if m in mods and m != name}


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    mods = _modules()
    return {name: _imports(name, path, mods) for name, path in mods.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []
    counter = [0]

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return out


def test_the_graph_sees_function_level_imports(graph):
    # commands import their machinery inside the command function (fast --help): the graph must see it
    assert "memascend_cli.run.prepared" in graph["memascend_cli.commands.train"]


def test_no_import_cycles(graph):
    assert _cycles(graph) == []


def test_a_command_imports_no_other_command(graph):
    commands = {m for m in graph if m.startswith("memascend_cli.commands.")}
    offenders = {c: sorted(graph[c] & commands) for c in commands if graph[c] & commands}
    assert offenders == {}


def test_the_cli_side_never_imports_the_engine_at_module_level():
    """`memascend --help` and `plan` stay torch-free: the engine is only imported inside functions."""
    for path in (ROOT / "memascend_cli").rglob("*.py"):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                bad = [n for n in names if n.split(".")[0] in ("torch", "deepspeed", "memascend_engine")]
                assert not bad, f"{path.relative_to(ROOT)} imports {bad} at module level"


def test_no_source_file_over_700_lines():
    sources = [p for folder in SOURCE_FOLDERS
               for p in (ROOT / folder).rglob("*") if p.suffix in (".py", ".cpp", ".h", ".sh")]
    long = {str(p.relative_to(ROOT)): n for p in sources if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}


def test_no_python_function_over_150_lines():
    long = {}
    for path in (p for folder in SOURCE_FOLDERS for p in (ROOT / folder).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long[f"{path.relative_to(ROOT)}:{node.name}"] = n
    assert long == {}


def test_the_repository_stays_slim():
    # Recorded runs are compact summaries (timelines gzipped beside them); a reader's checkout stays small.
    import subprocess

    p = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True)
    if p.returncode != 0:
        pytest.skip("not a git checkout: no tracked files to count")
    files = [ROOT / f for f in p.stdout.decode().split("\0") if f]
    lines = sum(f.read_bytes().count(b"\n") for f in files if f.is_file())
    docs_bytes = sum(f.stat().st_size for f in files if f.is_file() and f.relative_to(ROOT).parts[0] == "docs")
    assert lines < 100_000, f"{lines:,} tracked lines"
    # Each quiet sitting's compact records add ~0.1 MiB (2026-12-06: 3.05 MiB); timelines stay gzipped, traces out.
    assert docs_bytes < 3.5 * 2**20, f"docs/ holds {docs_bytes / 2**20:.2f} MiB"
