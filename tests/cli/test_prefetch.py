"""`layerswap prefetch`: lists what configs need, downloads each (fetchers replaced here: no
network), names every failure and exits 1, and refuses to run with the Hub switched off.

Run: .venv/bin/python -m pytest -q tests/cli/test_prefetch.py
"""

from __future__ import annotations

from pathlib import Path

from layerswap import spaces
from layerswap.cli import main

STUDY = Path(spaces.__file__).parent / "examples" / "real_study.yaml"


def _online(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "0")


def test_dry_run_lists_and_fetches_nothing(monkeypatch, capsys):
    from layerswap.trainables import prefetch

    monkeypatch.setattr(prefetch, "fetch_model", lambda *a: (_ for _ in ()).throw(AssertionError("fetched")))  # fmt: skip
    assert main(["prefetch", str(STUDY), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "would fetch model: meta-llama/Llama-3.1-8B-Instruct" in out
    assert "would fetch dataset: aya (swh)" in out and "would fetch dataset: orca_math" in out
    assert "belebele_tel_Telu" in out


def test_every_download_runs_and_a_failure_is_named_with_exit_1(monkeypatch, capsys):
    from layerswap.trainables import prefetch

    _online(monkeypatch)
    got = []
    monkeypatch.setattr(prefetch, "fetch_model", lambda repo: got.append(("model", repo)))
    monkeypatch.setattr(prefetch, "fetch_dataset", lambda s, lang: got.append(("dataset", s, lang)))  # fmt: skip

    def tasks(names):
        raise ConnectionError("Couldn't reach 'facebook/belebele' on the Hub")

    monkeypatch.setattr(prefetch, "fetch_tasks", tasks)
    assert main(["prefetch", str(STUDY)]) == 1
    assert got[0] == ("model", "meta-llama/Llama-3.1-8B-Instruct")
    assert sorted(got[1:], key=str) == sorted([("dataset", "aya", "ben"), ("dataset", "aya", "swh"), ("dataset", "aya", "tel"), ("dataset", "orca_math", None)], key=str)  # fmt: skip
    err = capsys.readouterr().err
    assert "1 of 6 failed" in err and "Couldn't reach 'facebook/belebele'" in err


def test_offline_switches_are_refused_before_any_download(monkeypatch, capsys):
    from layerswap.trainables import prefetch

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(prefetch, "fetch_model", lambda *a: (_ for _ in ()).throw(AssertionError("fetched")))  # fmt: skip
    assert main(["prefetch", str(STUDY)]) == 2
    assert "HF_HUB_OFFLINE" in capsys.readouterr().err


def test_model_snapshots_never_take_pickled_weights():
    from layerswap.trainables.prefetch import MODEL_FILES, MODEL_SKIP

    assert "*.safetensors" in MODEL_FILES and not any(p.endswith((".bin", ".pt")) for p in MODEL_FILES)  # fmt: skip
    assert {"*.bin", "*.pt", "*.pth", "*.pkl"} <= set(MODEL_SKIP)
