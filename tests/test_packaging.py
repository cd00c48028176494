"""What an install gets: pyproject's package list matches the folders, and a wheel built from the
repository holds one top-level package, `layerswap`, with every module and data file, and sits
beside other distributions' `spaces` and `cli` packages without either shadowing the other.

The rooms live at the repository root and are mapped into `layerswap.<room>` by pyproject's
`package-dir`, so setuptools cannot find sub-packages by itself: a new one left out of `packages`
would be missing from every install while the editable checkout works.

Run: .venv/bin/python -m pytest -q tests/test_packaging.py   (the wheel tests are marked slow:
~8 s on 2 cores, of which the build ~5 s and the fresh venv plus install ~3 s)
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path, PurePosixPath

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10 (pyproject: tomli for the tests there)
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
SETUPTOOLS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
PACKAGES: list[str] = SETUPTOOLS["packages"]
PACKAGE_DIR: dict[str, str] = SETUPTOOLS["package-dir"]
PACKAGE_DATA: dict[str, list[str]] = SETUPTOOLS.get("package-data", {})


def _folder(package: str) -> Path:
    """The folder a dotted package is built from: its nearest mapped ancestor's folder + the rest."""
    parts = package.split(".")
    for n in range(len(parts), 0, -1):
        mapped = PACKAGE_DIR.get(".".join(parts[:n]))
        if mapped is not None:
            return ROOT / mapped / Path(*parts[n:]) if parts[n:] else ROOT / mapped
    raise AssertionError(f"{package}: under no package-dir entry")


def _packages_on_disk() -> dict[str, Path]:
    """Every folder with an __init__.py under a mapped room, by the package name it installs as."""
    found = {}
    for package, folder in PACKAGE_DIR.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder).parts
            if "__pycache__" not in rel:
                found[".".join([package, *rel])] = init.parent
    return found


def _shipped_files() -> dict[str, Path]:
    """Every file a room holds (tracked by git when this is a checkout), by its path in the wheel;
    dotfiles (output markers) and bytecode are not shipped."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z", *PACKAGE_DIR.values()],
            cwd=ROOT,
            capture_output=True,
            check=True,
        ).stdout.decode()
        paths = [ROOT / p for p in listed.split("\0") if p]
    except (OSError, subprocess.CalledProcessError):  # not a git checkout: what is on disk
        paths = [p for f in PACKAGE_DIR.values() for p in (ROOT / f).rglob("*") if p.is_file()]
    out = {}
    for path in paths:
        rel = path.relative_to(ROOT)
        if path.name.startswith(".") or "__pycache__" in rel.parts or not path.exists():
            continue
        room = next(p for p, f in PACKAGE_DIR.items() if rel.parts[0] == Path(f).parts[0])
        out[str(PurePosixPath(*room.split("."), *rel.parts[1:]))] = path
    return out


# ------------------------------------------------------------------ pyproject against the folders


def test_every_room_is_mapped():
    rooms = {p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file()}
    assert rooms == set(PACKAGE_DIR.values()), "a folder with __init__.py at the root is a room"
    assert {p for p in PACKAGE_DIR if p != "layerswap"} == {f"layerswap.{r}" for r in rooms - {"layerswap"}}  # fmt: skip


def test_packages_list_matches_the_folders():
    on_disk = _packages_on_disk()
    missing = sorted(set(on_disk) - set(PACKAGES))
    assert not missing, f"sub-packages not in pyproject's packages (not installed): {missing}"
    gone = sorted(p for p in PACKAGES if not (_folder(p) / "__init__.py").is_file())
    assert not gone, f"pyproject's packages lists folders without __init__.py: {gone}"
    assert sorted(PACKAGES) == sorted(on_disk) and len(set(PACKAGES)) == len(PACKAGES)


def test_package_data_patterns_match_files():
    for package, patterns in PACKAGE_DATA.items():
        assert package in PACKAGES, f"package-data for {package}, which is not a listed package"
        for pattern in patterns:
            assert list(_folder(package).glob(pattern)), f"package-data {package}: {pattern} matches nothing"  # fmt: skip


# ------------------------------------------------------------------------------------ the wheel


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """A wheel built by pip from a copy of the repository's sources (a build in place would write
    build/ and egg-info into the working tree)."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    for folder in PACKAGE_DIR.values():
        shutil.copytree(ROOT / folder, src / folder, ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp / "dist"
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(src)]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    (whl,) = out.glob("layerswap-*.whl")
    return whl


@pytest.mark.slow
def test_wheel_holds_one_top_level_package_and_every_file(wheel):
    with zipfile.ZipFile(wheel) as z:
        names = [n for n in z.namelist() if not n.endswith("/")]
        info = next(n.split("/")[0] for n in names if n.split("/")[0].endswith(".dist-info"))
        record = {line.split(",")[0] for line in z.read(f"{info}/RECORD").decode().splitlines() if line}  # fmt: skip
        top_level = z.read(f"{info}/top_level.txt").decode().split() if f"{info}/top_level.txt" in names else None  # fmt: skip
        entry_points = z.read(f"{info}/entry_points.txt").decode()
    assert record == set(names), "RECORD lists other files than the wheel holds"
    assert {n.split("/")[0] for n in names} - {info} == {"layerswap"}
    assert top_level in (None, ["layerswap"])
    assert "layerswap = layerswap.cli:run" in entry_points
    want = _shipped_files()
    missing = sorted(set(want) - set(names))
    assert not missing, f"in the repository but not in the wheel: {missing[:20]}"
    # the package data, by name: the example configs, throughput profiles, the shipped bases
    assert {n for n in want if n.startswith("layerswap/spaces/examples/")}
    assert "layerswap/spaces/throughput.yaml" in names
    for entry in (ROOT / "world" / "bases").glob("*/prebuilt.json"):
        base = f"layerswap/world/bases/{entry.parent.name}"
        needed = ["prebuilt.json", "world_config.json", *json.loads(entry.read_text())["files"]]
        assert {f"{base}/{f}" for f in needed} <= set(names), base


FOREIGN = """FROM = "another distribution's {name}"\n"""
SIDE_BY_SIDE = """
import pathlib, sys
import cli, spaces
import layerswap.spaces.recipe as recipe
from layerswap import cli as ours

site = pathlib.Path(sys.argv[1]).resolve()
assert spaces.FROM == "another distribution's spaces", spaces.__file__
assert cli.FROM == "another distribution's cli", cli.__file__
for module in (recipe, ours):
    assert pathlib.Path(module.__file__).resolve().is_relative_to(site / "layerswap"), module.__file__
assert recipe.LayerSwapRecipe.__name__ == "LayerSwapRecipe"
print("ok", spaces.__file__, recipe.__file__)
"""


@pytest.mark.slow
def test_installed_wheel_sits_beside_foreign_spaces_and_cli(wheel, tmp_path):
    env_dir = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)], check=True)
    python = env_dir / "bin" / "python"
    site = Path(
        subprocess.run(
            [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()
    )  # fmt: skip
    for name in ("spaces", "cli"):  # what another distribution could install: generic names
        (site / name).mkdir()
        (site / name / "__init__.py").write_text(FOREIGN.format(name=name))
    install = [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "-q", str(wheel)]  # fmt: skip
    done = subprocess.run(install, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    # Third-party dependencies (pydantic, yaml) from this venv, after the new venv's own
    # site-packages (a .pth entry is appended; PYTHONPATH would come first and could shadow it).
    deps = Path(__import__("pydantic").__file__).parents[1]
    (site / "test-deps.pth").write_text(f"{deps}\n")
    cwd = tmp_path / "elsewhere"  # not the repository: its room folders would be importable
    cwd.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    run = subprocess.run(
        [python, "-c", SIDE_BY_SIDE, str(site)], cwd=cwd, env=env, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.startswith("ok"), run.stdout


# The lent GPU machine runs the tree as PYTHONPATH=repo (the repository before any installed
# copy) with no editable install: `layerswap` is then the bare layerswap/ folder, and its rooms
# must still resolve (layerswap/__init__.py puts the checkout's root on the package's path).
BARE = """
import sys
sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in repr(f)]  # no install
sys.path.insert(0, sys.argv[1])
import layerswap.search.promote, layerswap.trainables.merge.api, layerswap.cli
print(layerswap.search.promote.__file__)
"""


def test_a_bare_checkout_on_the_path_imports_every_room(tmp_path):
    run = subprocess.run([sys.executable, "-c", BARE, str(ROOT)], cwd=tmp_path, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip() == str(ROOT / "search" / "promote.py")
