"""RayReporter: metric reports rate-limited, checkpoint reports always through, progress after.

Ray's report and context are stood in for (one rank): the multi-worker path runs in
tests/trainables/train/test_ray_train.py. Run:
.venv/bin/python -m pytest -q tests/trainables/train/test_ray_report.py
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from layerswap.trainables.train import ray_report
from layerswap.trainables.train.ray_report import RayReporter


@pytest.fixture
def calls(monkeypatch):
    """Ray's report calls as (metrics, checkpoint dir name or None), on a one-rank context."""
    seen: list[tuple[dict, str | None]] = []
    ctx = SimpleNamespace(get_world_size=lambda: 1, get_world_rank=lambda: 0)
    monkeypatch.setattr(ray_report.ray.train, "get_context", lambda: ctx)
    monkeypatch.setattr(
        ray_report.ray.train,
        "report",
        lambda metrics, checkpoint=None, **kw: seen.append(
            (metrics, kw.get("checkpoint_dir_name"))
        ),
    )
    return seen


def _reporter(interval_s, progress=None) -> RayReporter:
    return RayReporter(interval_s=interval_s, upload=None, store_run=None, progress=progress)


def test_metric_reports_are_rate_limited_checkpoints_are_not(tmp_path, calls):
    lines: list[tuple[dict, Path | None]] = []
    report = _reporter(interval_s=3600, progress=lambda m, p: lines.append((m, p)))
    report({"step": 1}, None)  # the first metric report goes through
    report({"step": 2}, None)  # within the interval: dropped
    ckpt = tmp_path / "checkpoint_000003"
    ckpt.mkdir()
    report({"step": 3, "checkpoint": True}, ckpt)  # a checkpoint: always
    report({"step": 4}, None)  # the checkpoint restarted the interval: dropped

    assert calls == [({"step": 1}, None), ({"step": 3, "checkpoint": True}, ckpt.name)]
    # progress lines for every report, forwarded or not (they go to the driver's console)
    assert [m["step"] for m, _ in lines] == [1, 2, 3, 4]


def test_zero_interval_forwards_every_report(calls):
    report = _reporter(interval_s=0)
    for step in range(3):
        report({"step": step}, None)
    assert [m["step"] for m, _ in calls] == [0, 1, 2]
