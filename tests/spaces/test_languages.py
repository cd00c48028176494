"""One language table (spaces/languages.py): every spelling of a language is one language to the
data, the indicator tasks, the language check of an experiment and the search's expert pool.

Run: .venv/bin/python -m pytest -q tests/spaces/test_languages.py
"""

from __future__ import annotations

import pytest

from layerswap.spaces.languages import find_language, language_key, same_language
from layerswap.spaces.sweep import LANG_CODES
from layerswap.spaces.train_experiment import parse_train_experiment
from layerswap.trainables.train.sft_records import resolve_language


@pytest.mark.parametrize("a, b", [("sw", "swh"), ("swa", "Swahili"), ("swh_Latn", "sw"), ("en", "eng"), ("BN", "ben"), ("xa", "XA"), ("qq", "qq")])  # fmt: skip
def test_spellings_of_one_language_agree(a, b):
    assert same_language(a, b) and same_language(b, a)


@pytest.mark.parametrize("a, b", [("sw", "bn"), ("xa", "xb"), ("en", "xa"), ("qq", "sw"), ("qq", "qr")])  # fmt: skip
def test_other_languages_differ(a, b):
    assert not same_language(a, b)


def test_the_data_and_the_indicators_read_the_same_table():
    for spelling in ("sw", "swa", "swh", "swh_latn", "swahili"):
        assert resolve_language(spelling).code == "swh" == language_key(spelling)
    assert LANG_CODES["swa"] == LANG_CODES["swh"] == ("swh_Latn", "sw")
    assert find_language("klingon") is None and language_key("klingon") is None


@pytest.mark.parametrize("stated", ["swahili", "swh_Latn", "Swahili"])
def test_a_contradiction_in_any_spelling_the_loader_reads_is_refused(stated):
    """The loader reads `language: swahili` as swh; so a Bengali expert on it is refused."""
    exp = {
        "name": "t",
        "base": "b",
        "kind": "language",
        "language": "bn",
        "datasets": [{"source": "aya", "language": stated}],
        "mode": "full",
        "hyper": {"lr": 1e-4, "max_steps": 4, "batch_size": 4, "seq_len": 64},
    }
    with pytest.raises(ValueError, match=f"language: bn, but datasets\\[0\\].* is {stated} data"):
        parse_train_experiment(exp, source="exp.yaml")


@pytest.mark.parametrize("spelling", ["sw", "SW", "Swahili", "swh_Latn"])
def test_every_accepted_spelling_has_the_default_indicators(spelling):
    from layerswap.spaces.sweep import indicator_tasks

    assert indicator_tasks("language", spelling, world=False, global_mmlu=True) == ["belebele_swh_Latn", "global_mmlu_full_sw"]  # fmt: skip
