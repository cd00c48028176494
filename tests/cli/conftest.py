"""Fixtures for the CLI tests: inputs built once per session and only ever read.

`expert_pair` (the tiny world's base and two perturbed experts, what a search takes),
`analysis_run` (a synthetic run folder, what `analyze` reads) and `merged_model` (a folder
`layerswap merge` wrote), and `read_only` (folders this process sees as a read-only mount). The
tiny world and the tiny family come from tests/conftest.py.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.cli.cli_process import Cli


@pytest.fixture(scope="session")
def expert_pair(tiny_world, tmp_path_factory) -> dict[str, Path]:
    """`base` (the world's), `task`, `language` and `language2`: the base plus seeded noise."""
    from tests.search.search_fixtures import make_experts

    return make_experts(tiny_world, tmp_path_factory.mktemp("expert_pair"))


@pytest.fixture(scope="session")
def analysis_run(tmp_path_factory) -> Path:
    """A run folder with a registry, trials, an Optuna study and promotion results."""
    from tests.analysis.analysis_synth import make_run

    return make_run(tmp_path_factory.mktemp("analysis_run"))


@pytest.fixture(scope="session")
def merged_model(family, tmp_path_factory) -> Path:
    """A layer swap of the session's tiny `family`, written by `layerswap merge`."""
    import yaml

    from layerswap.cli import main

    root = tmp_path_factory.mktemp("merged_model")
    recipe = root / "recipe.yaml"
    recipe.write_text(
        yaml.safe_dump(
            {
                "method": "layer_swap",
                "task_expert": family.ref("task"),
                "language_expert": family.ref("language"),
                "bottom": 2,
                "top": 2,
            }
        )
    )
    assert main(["merge", str(recipe), "--out", str(root / "merged"), "-q"]) == 0
    return root / "merged"


@pytest.fixture
def cli(tmp_path):
    """`cli(*args, env=...)` starts a command; all are killed at teardown.

    Commands run in an empty folder: `python -m` puts the working folder first on sys.path, and
    a folder there named like a project package (world/, search/) would shadow it.
    """
    started: list[Cli] = []
    cwd = tmp_path / ".cwd"
    cwd.mkdir()

    def start(*args: object, env: dict[str, str] | None = None) -> Cli:
        started.append(Cli(*args, cwd=cwd, env=env))
        return started[-1]

    yield start
    for c in started:
        c.kill()


@pytest.fixture
def read_only(monkeypatch) -> Callable[[Path], None]:
    """`read_only(folder)`: from then on `os.access` says `folder` is not writable, as on a
    read-only mount (root ignores a folder's modes; a real mount needs a namespace of its own:
    tests/cli/test_bad_input_checks.py does that in its slow tests)."""
    folders: list[Path] = []
    real = os.access

    def access(path, mode, *a, **kw) -> bool:
        if mode & os.W_OK and Path(path).resolve() in folders:
            return False
        return real(path, mode, *a, **kw)

    monkeypatch.setattr(os, "access", access)
    return lambda folder: folders.append(Path(folder).resolve())
