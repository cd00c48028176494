"""Without --verbose a command's output holds no `datasets` "Generating ... split" bars and no
transformers "Loading weights" bars (cli/__init__.py quiet_progress_bars); with it, both show.

`layerswap search` runs in a process of its own through its preflight (whose data check parses
the proxies' dev files into a fresh `datasets` cache), and a stand-in for the trials loads the
base with transformers, as the driver does in the demo's indicator stage and in promotion.

Run: .venv/bin/python -m pytest -q tests/cli/test_progress_bars.py   (~20 s: two commands)
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import yaml

from tests.search.search_fixtures import experiment, make_experts

# The trials replaced by a model load, as the driver's own (indicators, promotion) load models.
_CLI = """import sys
import layerswap.search.search as search
def trials(exp, run_dir, **kwargs):
    from transformers import AutoModelForCausalLM
    AutoModelForCausalLM.from_pretrained(exp.base)
    print("TRIALS STAND-IN DONE", flush=True)
    raise SystemExit(0)
search.run_search = trials
from layerswap.cli import main
sys.exit(main(sys.argv[1:]))
"""
BARS = ("Generating dev split", "Loading weights")


@pytest.fixture(scope="module")
def search_yaml(tiny_world, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bars")
    exp = experiment(tiny_world, make_experts(tiny_world, tmp / "experts"))
    cfg = tmp / "search.yaml"
    cfg.write_text(yaml.safe_dump(exp.model_dump(mode="json")))
    return cfg


@pytest.mark.slow  # ~8 s a command: torch, lm-eval and a model load in a process of its own
@pytest.mark.parametrize("verbose", [False, True])
def test_progress_bars_only_with_verbose(search_yaml, tmp_path, verbose):
    env = {k: v for k, v in os.environ.items() if "PROGRESS_BARS" not in k}
    env |= {"HF_DATASETS_CACHE": str(tmp_path / "hf_datasets_cache")}  # fresh: every split parsed
    argv = ["search", str(search_yaml), "--out", str(tmp_path / "run"), "--no-promote"]
    proc = subprocess.run(
        [sys.executable, "-c", _CLI, *argv, *(["--verbose"] if verbose else [])],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "TRIALS STAND-IN DONE" in proc.stdout, out
    for bar in BARS:
        assert (bar in out) == verbose, f"{bar!r} {'missing' if verbose else 'shown'}:\n{out}"


def test_hub_download_bars_stay(monkeypatch):
    """transformers' switch also turns off huggingface_hub's bars; a model download can take
    minutes, so those are turned back on (unless the user's HF_HUB_DISABLE_PROGRESS_BARS)."""
    from huggingface_hub.utils import are_progress_bars_disabled, enable_progress_bars
    from transformers.utils import logging as transformers_logging

    from layerswap.cli import quiet_progress_bars

    monkeypatch.delenv("HF_HUB_DISABLE_PROGRESS_BARS", raising=False)
    monkeypatch.setenv("HF_DATASETS_DISABLE_PROGRESS_BARS", "0")  # only transformers' switch
    try:
        quiet_progress_bars()
        assert not transformers_logging.is_progress_bar_enabled()
        assert not are_progress_bars_disabled()
    finally:
        transformers_logging.enable_progress_bar()
        enable_progress_bars()
