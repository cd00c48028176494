"""The interrupted line says how that command continues (cli/continue_hint.py): a sweep or a
plain `train` with --continue, a search with --continue (or --resume), a demo with --resume,
and nothing for a command that starts over. In-process: the command is interrupted by a
KeyboardInterrupt raised where its function would run.

Run: .venv/bin/python -m pytest -q tests/cli/test_continue_hint.py
"""

from __future__ import annotations

import pytest

import layerswap.cli as cli_root
from layerswap.cli import continue_hint


@pytest.mark.parametrize(
    ("argv", "tail"),
    [
        (["train", "x.yaml", "--out", "r"], " (train continues with --continue)"),
        (["search", "x.yaml", "--out", "r"], " (search continues with --continue (or --resume))"),
        (["demo", "--out", "d"], " (demo continues with --resume)"),
        (["merge", "r.yaml", "--out", "o"], ""),
    ],
)
def test_the_interrupted_line_says_how_the_command_continues(argv, tail, monkeypatch, capsys):
    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli_root, "_run_command", interrupted)
    monkeypatch.setattr(continue_hint, "_COMMAND", [])
    assert cli_root.main(argv) == 130
    err = capsys.readouterr().err
    assert err == f"layerswap: interrupted (SIGINT); nothing half-written was kept{tail}\n", err
