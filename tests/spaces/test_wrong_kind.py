"""A config file given to the command of another kind (a train config to `plan`, a search config
to `merge`, a study to `train`) is one line saying what it is and which command reads it, not
every field the expected kind rejects.

Run: .venv/bin/python -m pytest -q tests/spaces/test_wrong_kind.py
"""

from __future__ import annotations

from pathlib import Path

import pytest

from layerswap import spaces
from layerswap.cli import main

EXAMPLES = Path(spaces.__file__).parent / "examples"


@pytest.mark.parametrize(
    ("argv", "file", "said"),
    [
        (
            ["plan"],
            "real_llama31_8b_math_full.yaml",
            "not a study: it is a training experiment, which `layerswap train FILE` reads",
        ),
        (
            ["plan"],
            "real_llama31_8b_sw_search.yaml",
            "not a study: it is a merge-search experiment, which `layerswap search FILE` reads",
        ),
        (
            ["train", "--plan"],
            "real_study.yaml",
            "not an experiment: it is a study, which `layerswap plan FILE` reads",
        ),
        (
            ["merge", "--out", "never"],
            "real_llama31_8b_sw_search.yaml",
            "not a recipe: it is a merge-search experiment, which `layerswap search FILE` reads",
        ),
    ],
)
def test_a_config_of_another_kind_is_named(argv, file, said, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = EXAMPLES / file
    cmd = [argv[0], str(path), *argv[1:]]
    assert main(cmd) == 2
    err = capsys.readouterr().err
    assert err == f"layerswap: error: {path}: {said}\n"
    assert not (tmp_path / "never").exists()


def test_a_broken_config_of_the_right_kind_still_lists_its_fields(tmp_path, capsys):
    bad = tmp_path / "train.yaml"
    bad.write_text((EXAMPLES / "world_math_full.yaml").read_text() + "learning_rate: 0.1\n")
    assert main(["train", str(bad), "--plan"]) == 2
    err = capsys.readouterr().err
    assert "invalid experiment" in err and "learning_rate: Extra inputs are not permitted" in err
