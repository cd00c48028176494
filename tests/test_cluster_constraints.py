"""cluster-constraints.txt pins every package a cluster node installs for layerswap (the runtime
dependencies in pyproject.toml and everything they pull in) to the versions the tests ran with,
inside pyproject's bounds: cluster.yaml's setup_commands install with `-c` on it, so nodes the
autoscaler starts hours later install the same versions as the head and as CI.

Regenerate after changing the venv (from the repository root):
    .venv/bin/python tests/test_cluster_constraints.py > cluster-constraints.txt

Run: .venv/bin/python -m pytest -q tests/test_cluster_constraints.py
"""

from __future__ import annotations

import importlib.metadata as md
import re
from pathlib import Path

import yaml
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10 (pyproject: tomli for the tests there)
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
FILE = ROOT / "cluster-constraints.txt"
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
HEADER = """\
# The versions the tests ran with, for `pip install -c` on every cluster node (cluster.yaml's
# setup_commands): layerswap's runtime dependencies (pyproject.toml) and everything they pull in,
# so nodes the autoscaler starts later install what the head and CI have. torch is pinned
# without its local build tag: on a node pip takes PyPI's wheel of that version (CUDA on Linux).
# Generated, do not edit; after changing the venv (tests/test_cluster_constraints.py checks it):
#     .venv/bin/python tests/test_cluster_constraints.py > cluster-constraints.txt
"""


# What only a CUDA build of torch requires (exactly pinned by that torch itself): left out, so
# the file is the same whether the venv has the CPU wheel (CI) or a CUDA one (a GPU machine).
CUDA_BUILD_ONLY = re.compile(r"nvidia-.*|cuda-.*|triton")


def runtime_requirements() -> list[Requirement]:
    return [Requirement(r) for r in PROJECT["dependencies"]]


def closure() -> dict[str, str]:
    """{canonical name: installed version} of the runtime dependencies and all they require,
    markers evaluated for this interpreter (the image's Python matches: py311)."""
    seen: dict[str, str] = {}
    todo = [(r, set(r.extras)) for r in runtime_requirements()]
    while todo:
        req, extras = todo.pop()
        name = canonicalize_name(req.name)
        if CUDA_BUILD_ONLY.fullmatch(name):
            continue
        dist = md.distribution(name)
        new = name not in seen
        seen[name] = dist.version
        for text in dist.requires or []:
            sub = Requirement(text)
            envs = [default_environment() | {"extra": e} for e in extras or {""}]
            if sub.marker is None or any(sub.marker.evaluate(env) for env in envs):
                if new or sub.marker is not None:  # an extra's requirements on a later visit
                    todo.append((sub, set(sub.extras)))
    return seen


def constraints_text() -> str:
    pins = {n: Version(v).public for n, v in closure().items()}  # 2.13.0+cpu -> 2.13.0
    return HEADER + "".join(f"{n}=={v}\n" for n, v in sorted(pins.items()))


def pins() -> dict[str, str]:
    lines = [ln for ln in FILE.read_text().splitlines() if ln and not ln.startswith("#")]
    found = [re.fullmatch(r"([a-z0-9-]+)==([0-9][^\s]*)", ln) for ln in lines]
    assert all(found), [ln for ln, m in zip(lines, found, strict=True) if not m]
    return {m[1]: m[2] for m in found}


def test_every_runtime_dependency_is_pinned_inside_pyproject_bounds():
    have = pins()
    for req in runtime_requirements():
        name = canonicalize_name(req.name)
        assert name in have, f"{name} is a runtime dependency but not in {FILE.name}"
        assert req.specifier.contains(have[name], prereleases=True), (name, have[name], req)


def test_the_constraints_are_the_tested_versions():
    """The file is what the generator writes from this venv (the message says how to redo it)."""
    assert FILE.read_text() == constraints_text(), (
        f"{FILE.name} differs from the installed versions: regenerate it (see its header)"
    )


def test_every_cluster_pip_install_uses_the_constraints():
    cluster = yaml.safe_load((ROOT / "cluster.yaml").read_text())
    where = "/home/ray/layerswap"
    assert cluster["file_mounts"][where] == "."  # the repository, this file included
    pips = [
        c
        for role in ("setup_commands", "head_setup_commands", "worker_setup_commands")
        for c in cluster.get(role, [])
        if "pip install" in c
    ]
    assert pips and all(f"-c {where}/{FILE.name}" in c for c in pips), pips


if __name__ == "__main__":
    print(constraints_text(), end="")
