"""The packages import one way (docs/development.md, "Layout"): cli on top, spaces at the bottom.

Parses every module's imports (top level and inside functions) with ast, so a lazy import that
runs back up the layers fails here too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# package -> the project packages it may import (besides itself)
ALLOWED = {
    "spaces": set(),
    "trainables": {"spaces"},
    "world": {"spaces", "trainables"},
    "experts": {"spaces", "trainables", "world"},
    "search": {"spaces", "trainables", "world", "experts"},
    "study": {"spaces", "trainables", "world", "experts", "search"},
    "demo": {"spaces", "trainables", "world", "experts", "search"},
    "analysis": {"spaces", "trainables"},
    "cli": {"spaces", "trainables", "world", "experts", "search", "study", "demo", "analysis"},
}
# Below search/: the Ray Train wrapper, and how every driver starts Ray (search/'s drivers and
# the Ray Train wrapper share it, so it lives in the lower layer).
RAY_ALLOWED = {
    "trainables/train/ray_train.py",
    "trainables/train/ray_failures.py",  # ray_train's adapter to Ray Train's private failure API
    "trainables/train/ray_progress.py",  # ray_train's progress lines: a Ray queue to the driver
    "trainables/train/ray_capacity.py",  # ray_train's check that the cluster's nodes hold its workers
    "trainables/train/ray_fit.py",  # ray_train's fit() under a driver's SIGINT and SIGTERM
    "trainables/train/ray_report.py",  # ray_train's worker reports: rate-limited ray.train.report calls
    "trainables/ray_session.py",
    "trainables/node_paths.py",  # one task pinned to each Ray node: what each node sees of a path
}


def _room(module: str, names: tuple[str, ...] = ()) -> set[str]:
    """The project room (`search`, ...) or outside package (`torch`) an imported name lives in.

    `layerswap.search.x` -> {"search"}; `from layerswap import search, spaces` -> both.
    """
    parts = module.split(".")
    if parts[0] != "layerswap":
        return {parts[0]}
    if len(parts) > 1:
        return {parts[1]}
    return set(names) or {"layerswap"}


def _imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for a in node.names:
                out |= _room(a.name)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out |= _room(node.module, tuple(a.name for a in node.names))
    return out


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_imports_run_one_way(package):
    bad = []
    for path in sorted((ROOT / package).rglob("*.py")):
        used = _imports(path) & set(ALLOWED)
        wrong = used - ALLOWED[package] - {package}
        if wrong:
            bad.append(f"{path.relative_to(ROOT)} imports {sorted(wrong)}")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("package", ["spaces", "trainables", "analysis", "world", "study"])
def test_ray_only_where_ray_is_the_point(package):
    bad = [
        str(p.relative_to(ROOT))
        for p in sorted((ROOT / package).rglob("*.py"))
        if "ray" in _imports(p) and str(p.relative_to(ROOT)) not in RAY_ALLOWED
    ]
    assert not bad, f"ray imported in {bad}"


def test_spaces_is_pure_data():
    heavy = {"torch", "ray", "transformers", "lm_eval"}
    bad = {
        str(p.relative_to(ROOT)): sorted(_imports(p) & heavy)
        for p in sorted((ROOT / "spaces").rglob("*.py"))
        if _imports(p) & heavy
    }
    assert not bad, bad
