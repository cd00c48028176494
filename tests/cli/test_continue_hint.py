"""The interrupted line says how that command continues (cli/continue_hint.py): a sweep or a
plain `train` with --continue, a search with --continue (or --resume), a demo with --resume,
and nothing for a command that starts over (a merge-only demo; with --overwrite, which put the
earlier run back, "--overwrite starts over"); and what its writers finished or put back before
the interrupt (trainables/outcome.py). In-process: the command is interrupted by a
KeyboardInterrupt raised where its function would run, or in the middle of a real merge's swap.

Run: .venv/bin/python -m pytest -q tests/cli/test_continue_hint.py
"""

from __future__ import annotations

import os

import pytest
import yaml

import layerswap.cli as cli_root
from layerswap.cli import continue_hint


@pytest.mark.parametrize(
    ("argv", "tail"),
    [
        (["train", "x.yaml", "--out", "r"], " (train continues with --continue)"),
        (["search", "x.yaml", "--out", "r"], " (search continues with --continue (or --resume))"),
        (["demo", "--out", "d"], " (demo continues with --resume)"),
        (["merge", "r.yaml", "--out", "o"], ""),
        (["demo", "--merge-only", "--out", "d"], ""),  # it said "continues with --resume"
        (["train", "x.yaml", "--out", "r", "--overwrite"], " (train --overwrite starts over)"),
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


def test_an_overwrite_put_back_says_so_not_continue(tmp_path, monkeypatch, capsys):
    """An interrupted `train --overwrite` put the earlier run back, removing the new one; its
    line said "(train continues with --continue)", which would take up the earlier run."""
    from layerswap.trainables.outputs import replacing

    run = tmp_path / "exp"
    run.mkdir()
    (run / "done.txt").write_text("the earlier run")

    def interrupted(args):
        with replacing([run]):
            run.mkdir()
            raise KeyboardInterrupt

    monkeypatch.setattr(cli_root, "_run_command", interrupted)
    assert cli_root.main(["train", "x.yaml", "--out", str(tmp_path), "--overwrite"]) == 130
    err = capsys.readouterr().err
    tail = f"; the earlier {run} was put back as it was (train --overwrite starts over)\n"
    assert err.endswith(tail), err
    assert (run / "done.txt").read_text() == "the earlier run"


def test_an_interrupt_after_the_merge_swap_says_the_output_is_complete(family, tmp_path, monkeypatch, capsys):  # fmt: skip
    """SIGINT between `merge --overwrite`'s rename of the new folder into place and the
    deletion of the old one (a red-team's repro): exit 130 said only "nothing half-written was
    kept" while the new merge was in place and the old one gone. The rename raises the
    interrupt itself, just after renaming: the microsecond window a real signal rarely hits."""
    import layerswap.trainables.atomic as atomic

    out = tmp_path / "m"
    recipe = tmp_path / "r.yaml"
    swap = {"method": "layer_swap", "task_expert": family.ref("task"), "language_expert": family.ref("language")}  # fmt: skip
    recipe.write_text(yaml.safe_dump({**swap, "bottom": 2, "top": 2}))
    assert cli_root.main(["merge", str(recipe), "--out", str(out), "-q"]) == 0
    recipe.write_text(yaml.safe_dump({**swap, "bottom": 3, "top": 1}))
    real = os.rename

    def rename(src, dst):
        real(src, dst)
        if str(dst) == str(out):  # the new output is in place, the old one set aside
            raise KeyboardInterrupt

    monkeypatch.setattr(atomic.os, "rename", rename)
    assert cli_root.main(["merge", str(recipe), "--out", str(out), "-q", "--overwrite"]) == 130
    err = capsys.readouterr().err
    said = f"nothing half-written was kept; {out} was written in full before the interrupt, replacing the earlier m\n"  # fmt: skip
    assert err.endswith(said), err
    assert "top: 1" in (out / "layerswap_recipe.yaml").read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m", "r.yaml"]
