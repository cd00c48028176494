"""A training experiment's `language` must not contradict a language its data states: the
registry labels the expert with it, and a search for that language picks the expert. Refused at
validation (naming the field and both languages, exit 2 from the CLI); a dataset whose language
is unknown is no contradiction.

Run: .venv/bin/python -m pytest -q tests/spaces/test_train_language_agrees.py
"""

from __future__ import annotations

import pytest
import yaml

from layerswap.cli import main
from layerswap.spaces.train_experiment import TrainExperiment, parse_train_experiment

WORLD = "runs/world/data/sft"
MATH_EN, LANG_XA = {"path": f"{WORLD}/math_en.jsonl"}, {"path": f"{WORLD}/lang_xa.jsonl"}


def _exp(kind: str, language: str, *datasets: dict, mode: str = "full") -> dict:
    return {
        "name": "t",
        "base": "runs/world/base",
        "kind": kind,
        "language": language,
        "datasets": list(datasets),
        "mode": mode,
        "hyper": {"lr": 1e-4, "max_steps": 4, "batch_size": 4, "seq_len": 64},
    }


@pytest.mark.parametrize(
    ("exp", "says"),
    [
        # the world's xa language data, labelled xb: a search for xb would pick an xa expert
        (_exp("language", "xb", {"path": f"{WORLD}/lang_xa.jsonl"}), ["language: xb", "xa"]),
        # the world's English math data alone is no xa expert
        (_exp("math", "xa", {"path": f"{WORLD}/math_en.jsonl"}), ["language: xa", "en"]),
        # a source's `language` (aliases compared: sw is swh, bn is ben)
        (_exp("language", "sw", {"source": "aya", "language": "ben"}), ["language: sw", "ben"]),
        (_exp("language", "bn", {"source": "aya", "language": "swh"}), ["language: bn", "swh"]),
        # two datasets, neither in the experiment's language
        (
            _exp("math", "xb", MATH_EN, LANG_XA, mode="mix"),
            ["language: xb", "datasets[0]", "datasets[1]", "en", "xa"],
        ),
    ],
)
def test_a_contradicting_language_is_refused(exp, says):
    with pytest.raises(ValueError) as e:
        parse_train_experiment(exp, source="exp.yaml")
    for word in says:
        assert word in str(e.value)


@pytest.mark.parametrize(
    "exp",
    [
        _exp("language", "xa", {"path": f"{WORLD}/lang_xa.jsonl"}),
        _exp("math", "en", {"path": f"{WORLD}/math_en.jsonl"}),
        # the shipped mix: English math and xa language data make an xa expert
        _exp("math", "xa", MATH_EN, LANG_XA, mode="mix"),
        # the same language spelled another way
        _exp("language", "sw", {"source": "aya", "language": "swh"}),
        _exp("math", "eng", {"source": "orca_math", "language": "en"}),
        _exp("language", "XA", {"path": f"{WORLD}/lang_xa.jsonl"}),
        # a language the data does not state: nothing to contradict
        _exp("language", "xb", {"path": "my_data/xb_rows.jsonl"}),
        _exp("language", "xb", {"source": "aya"}),
        # a spelling the project does not know is not certainly another language
        _exp("language", "sw", {"source": "aya", "language": "Swahili"}),
        # one dataset of unknown language may be the expert's language
        _exp("math", "xb", MATH_EN, {"path": "mine/xb.jsonl"}, mode="mix"),
    ],
)
def test_an_agreeing_or_unknown_language_is_accepted(exp):
    assert isinstance(parse_train_experiment(exp), TrainExperiment)


def test_the_cli_refuses_it_in_one_line_with_exit_2(tmp_path, capsys):
    f = tmp_path / "exp.yaml"
    f.write_text(yaml.safe_dump(_exp("language", "xb", {"path": f"{WORLD}/lang_xa.jsonl"})))
    assert main(["train", str(f), "--plan"]) == 2
    err = capsys.readouterr().err
    assert "language: xb" in err and "lang_xa.jsonl" in err
    assert "Traceback" not in err
