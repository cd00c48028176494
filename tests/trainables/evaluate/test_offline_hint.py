"""A built-in task whose dataset is not in the local cache, under layerswap's offline default,
says how to get it (`layerswap prefetch`, or HF_HUB_OFFLINE=0 HF_DATASETS_OFFLINE=0), where
datasets only says it "Couldn't reach" the Hub; `layerswap eval` says so before loading the model.

Run: .venv/bin/python -m pytest -q tests/trainables/evaluate/test_offline_hint.py
"""

from __future__ import annotations

import pytest
import transformers

from layerswap.cli import main
from layerswap.trainables.evaluate.lm_eval_api import offline_hint


def test_only_an_offline_miss_gets_the_hint():
    with pytest.raises(ValueError, match=r"\(OfflineModeIsEnabled\): a dataset of t1, t2 is not in the local Hugging Face cache.*layerswap prefetch"):  # fmt: skip
        with offline_hint(["t1", "t2"]):
            raise ConnectionError("Couldn't reach 'juletxara/mgsm' on the Hub (OfflineModeIsEnabled)")  # fmt: skip
    with pytest.raises(ConnectionError, match=r"^timed out$"):  # anything else passes unchanged
        with offline_hint(["t1"]):
            raise ConnectionError("timed out")


@pytest.mark.slow
def test_eval_of_an_uncached_builtin_task_says_how_to_get_it(tiny_world, tmp_path, capsys, monkeypatch):  # fmt: skip
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "empty-cache"))  # surely not cached
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-hub"))
    loaded = []  # the model must not load first (minutes at 8B) for an error its data decides
    real = transformers.AutoModelForCausalLM.from_pretrained.__func__
    monkeypatch.setattr(
        transformers.AutoModelForCausalLM,
        "from_pretrained",
        classmethod(lambda cls, *a, **k: loaded.append(a) or real(cls, *a, **k)),
    )
    assert main(["eval", str(tiny_world / "base"), "--tasks", "mgsm_direct_sw", "--limit", "1"]) == 2  # fmt: skip
    err = capsys.readouterr().err
    # a plain eval has no CONFIG for `layerswap prefetch`: it is told the environment to run online
    assert "HF_HUB_OFFLINE=0 HF_DATASETS_OFFLINE=0 layerswap eval" in err, err
    assert "layerswap prefetch" not in err, err
    assert "mgsm_direct_sw" in err and loaded == [], (err, loaded)
