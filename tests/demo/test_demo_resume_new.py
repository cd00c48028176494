"""`layerswap demo --resume` on a folder with no demo run: it starts one, saying so first.

The stages themselves are stubbed (the whole pipeline is tests/demo/test_demo.py's, minutes):
this checks only what the command says before the work starts.
Run: .venv/bin/python -m pytest -q tests/demo/test_demo_resume_new.py
"""

from __future__ import annotations

import pytest

import layerswap.demo.pipeline as pipeline
from layerswap.cli import main


class _Started(Exception):
    """Raised by the stubbed stages: the point where the demo's work would begin."""


@pytest.fixture
def stages_stubbed(monkeypatch):
    def started(out, st, verbose, resume):
        print("[stub] stages start", flush=True)
        raise _Started(str(out))

    monkeypatch.setattr(pipeline, "_run_stages", started)


@pytest.mark.parametrize("empty_dir", [False, True], ids=["missing", "empty"])
def test_resume_without_a_run_says_it_starts_a_new_one(tmp_path, capfd, stages_stubbed, empty_dir):  # fmt: skip
    out = tmp_path / "demo"
    if empty_dir:
        out.mkdir()
    with pytest.raises(_Started):
        main(["demo", "--out", str(out), "--resume"])
    err = capfd.readouterr().err
    line = f"layerswap: {out}: no demo run to resume; starting a new one"
    assert line in err.splitlines(), err


def test_help_says_resume_starts_a_missing_run(capsys):
    with pytest.raises(SystemExit):
        main(["demo", "--help"])
    helptext = " ".join(capsys.readouterr().out.split())
    assert "no demo run in it starts a new one" in helptext, helptext
