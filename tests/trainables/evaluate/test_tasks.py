"""World task YAMLs: writing them opens no data file (the search writes them and must never open
a test split), and `layerswap eval --world` exits 2 on a damaged world, naming the file, without
a traceback.

Run: .venv/bin/python -m pytest -q tests/trainables/evaluate/test_tasks.py
"""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from layerswap.trainables.evaluate.tasks import write_world_tasks


@pytest.fixture
def damaged(tiny_world, tmp_path):
    """A copy of the tiny world whose xa MGSM test file ends in a line that is not JSON."""
    w = tmp_path / "w"
    shutil.copytree(tiny_world, w)
    test = w / "data/mgsm/xa/test.jsonl"
    line = test.read_bytes().count(b"\n") + 1
    with open(test, "ab") as f:
        f.write(b'{"question": "x", \n')
    return w, line


def test_writing_task_yamls_opens_no_data_file(damaged, tmp_path):
    w, _ = damaged
    opened, on = [], [True]

    def hook(event, args):
        if on[0] and event == "open":
            opened.append(str(args[0]))

    sys.addaudithook(hook)  # audit hooks cannot be removed: switched off below instead
    try:
        names = write_world_tasks(w, tmp_path / "tasks")
    finally:
        on[0] = False
    assert names and [f for f in opened if f.startswith(str(w / "data"))] == []


def test_cli_eval_exits_2_naming_the_file(damaged, tiny_world):
    w, _ = damaged
    args = ["eval", str(tiny_world / "base"), "--world", str(w), "--tasks", "world_mgsm_direct_xa"]
    run = subprocess.run(
        [sys.executable, "-m", "layerswap.cli", *args, "--limit", "1"],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr
    assert "data/mgsm/xa/test.jsonl: sha256 differs" in run.stderr
