"""A bad input found inside a Ray task (the demo trains its experts in tasks) is one line naming
it and exit 2, as anywhere else, not Ray's remote traceback.

Run: .venv/bin/python -m pytest -q tests/cli/test_ray_task_errors.py   (~15 s: a local Ray)
"""

from __future__ import annotations

import argparse

import pytest

from layerswap import cli


@pytest.fixture
def command(monkeypatch):
    """`command(func)`: make `func` the only subcommand that cli.main runs."""

    def use(func):
        p = argparse.ArgumentParser(prog="layerswap")
        p.set_defaults(func=func, command="test")  # as the real parser sets it
        monkeypatch.setattr(cli, "build_parser", lambda: p)

    return use


def test_a_bad_input_raised_in_a_ray_task_is_one_line(ray_session, command, capsys):
    import ray

    @ray.remote
    def train():
        raise FileExistsError("runs/demo/train/math: holds a training run of another experiment")

    command(lambda args: ray.get(train.remote()))
    assert cli.main([]) == 2
    err = capsys.readouterr().err
    assert err == "layerswap: error: runs/demo/train/math: holds a training run of another experiment\n"  # fmt: skip
