"""The import graph is visible and acyclic: project imports sit at the top of modules, except the
few lazy ones that say why, and no module reaches itself through others.

Parses every module of every room with ast (nothing is imported). Run:
.venv/bin/python -m pytest -q tests/test_imports.py
"""

from __future__ import annotations

import ast
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10 (pyproject: tomli for the tests there)
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
PACKAGE_DIRS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
    "package-dir"
]
LAZY_SHARE = 0.10  # project imports inside function bodies, of all imports


def _modules() -> dict[str, Path]:
    """Dotted module name -> file, for every module the package-dir mapping installs."""
    out = {}
    for package, folder in PACKAGE_DIRS.items():
        for path in (ROOT / folder).rglob("*.py"):
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join([package, *parts])] = path
    return out


MODULES = _modules()


def _target(name: str) -> str | None:
    """The project module an imported dotted name lives in (itself, or its nearest parent)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(tree: ast.AST):
    """(node, [imported dotted names]) for every absolute import statement in `tree`."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield node, [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module != "__future__":
                yield node, [f"{node.module}.{a.name}" for a in node.names]


def _in_functions(tree: ast.AST) -> set[int]:
    funcs = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
    return {id(n) for f in funcs for n in ast.walk(f) if isinstance(n, ast.Import | ast.ImportFrom)}


def _has_reason(lines: list[str], node: ast.stmt) -> bool:
    """A comment on the import's own lines, or just above the block of imports it belongs to."""
    if any("#" in line for line in lines[node.lineno - 1 : node.end_lineno or node.lineno]):
        return True
    i = node.lineno - 2
    while i >= 0 and lines[i].strip().startswith(("from ", "import ", ")", "#")):
        if lines[i].strip().startswith("#"):
            return True
        i -= 1
    return False


def test_no_import_circle():
    graph = {}
    for module, path in MODULES.items():
        deps = set()
        for _, names in _imports(ast.parse(path.read_text(), str(path))):
            deps |= {t for t in map(_target, names) if t and t != module}
        graph[module] = deps
    cycles, done = [], set()

    def visit(module: str, stack: list[str]) -> None:
        if module in stack:
            cycles.append(" -> ".join([*stack[stack.index(module) :], module]))
            return
        if module in done:
            return
        for dep in sorted(graph[module]):
            visit(dep, [*stack, module])
        done.add(module)

    for module in sorted(graph):
        visit(module, [])
    assert not cycles, "import circles:\n" + "\n".join(sorted(set(cycles)))


def test_project_imports_sit_at_the_top_or_say_why():
    total, lazy, silent = 0, [], []
    for path in sorted(MODULES.values()):
        text = path.read_text()
        tree, lines = ast.parse(text, str(path)), text.splitlines()
        inner = _in_functions(tree)
        for node, names in _imports(tree):
            total += 1
            if id(node) in inner and any(_target(n) for n in names):
                where = f"{path.relative_to(ROOT)}:{node.lineno}"
                lazy.append(where)
                if not _has_reason(lines, node):
                    silent.append(where)
    assert len(lazy) <= LAZY_SHARE * total, (
        f"{len(lazy)} of {total} imports are project imports inside functions "
        f"(at most {LAZY_SHARE:.0%}): {lazy}"
    )
    assert not silent, "lazy project imports without a comment saying why:\n" + "\n".join(silent)
