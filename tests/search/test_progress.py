"""layerswap's own progress lines (search/progress.py): k/N, best so far, elapsed and ETA with a fake
clock, exact strings; and the searcher printing them as trials finish (no Ray).

Run: .venv/bin/python -m pytest -q tests/search/test_progress.py
"""

from __future__ import annotations

import pytest

from layerswap.search.progress import Stages, TrialProgress, duration


class FakeClock:
    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0s"),
        (-3, "0s"),
        (59.4, "59s"),
        (60, "1m00s"),
        (72, "1m12s"),
        (3599, "59m59s"),
        (3600, "1h00m"),
        (7500, "2h05m"),
    ],
)
def test_duration(seconds, text):
    assert duration(seconds) == text


def test_trial_lines_best_so_far_and_eta_from_mean_duration_and_concurrency():
    clock, lines = FakeClock(), []
    p = TrialProgress("search", 4, concurrency=2, clock=clock, emit=lines.append)
    p.started("a")
    p.started("b")
    clock.t = 30
    # mean 30 s, 3 to go, 2 at once: 45 s
    p.finished("a", status="ok", objective=0.4, label="#0000", detail="#0000 b=1 u=0")
    p.started("c")
    clock.t = 50
    # mean 40 s (30, 50), 2 to go, 2 at once: 40 s; a failed trial has no objective
    p.finished("b", status="failed", objective=None, label="#0001")
    clock.t = 95
    # mean 48.3 s (30, 50, 65), the last one alone: a whole trial
    p.finished("c", status="ok", objective=0.5, label="#0002")
    clock.t = 4000
    p.finished("d", status="duplicate", objective=0.45, label="#0003")  # never started: no duration
    assert lines == [
        "[search] trial 1/4  ok         objective 0.4000  best 0.4000 (#0000)  elapsed 30s  ETA 45s  #0000 b=1 u=0",
        "[search] trial 2/4  failed     objective -  best 0.4000 (#0000)  elapsed 50s  ETA 40s",
        "[search] trial 3/4  ok         objective 0.5000  best 0.5000 (#0002)  elapsed 1m35s  ETA 48s",
        "[search] trial 4/4  duplicate  objective 0.4500  best 0.5000 (#0002)  elapsed 1h06m  ETA 0s",
    ]


def test_resumed_run_counts_earlier_trials_and_keeps_their_best():
    clock, lines = FakeClock(), []
    p = TrialProgress("search", 10, done=6, best=(0.7, "#0004"), clock=clock, emit=lines.append)
    clock.t = 5
    # finished before it was started here (e.g. started before a resume): no mean yet
    p.finished("x", status="pruned", objective=float("nan"), label="#0006")
    p.started("y")
    clock.t = 25
    p.finished("y", status="ok", objective=0.9, label="#0007")
    assert lines == [
        "[search] trial 7/10  pruned     objective -  best 0.7000 (#0004)  elapsed 5s  ETA ?",
        # 20 s a trial, 2 to go, one at a time
        "[search] trial 8/10  ok         objective 0.9000  best 0.9000 (#0007)  elapsed 25s  ETA 40s",
    ]


def test_stage_lines_and_wall_time_per_stage():
    clock, lines = FakeClock(), []
    st = Stages("demo", 3, clock=clock, emit=lines.append)
    st.start("world", "world (tiny, seed 0)")
    clock.t = 12
    st.start("train", "Ray Train: 2 experts")
    clock.t = 75
    st.note("math step 4")
    clock.t = 100
    st.start("search", "merge search: 3 trials")
    clock.t = 130
    assert st.end() == {"world": 12.0, "train": 88.0, "search": 30.0}
    assert lines == [
        "[demo] stage 1/3: world (tiny, seed 0) (at 0s)",
        "[demo] stage 2/3: Ray Train: 2 experts (at 12s)",
        "[demo]   math step 4 (at 1m15s)",
        "[demo] stage 3/3: merge search: 3 trials (at 1m40s)",
    ]


def test_searcher_prints_a_line_per_finished_trial(tmp_path, capsys):
    from test_searcher import POINT, _ok, _searcher

    other = {**POINT, "bottom": 2}
    s, _, _ = _searcher(tmp_path, points=[POINT, other, POINT], progress=True, num_samples=3)
    # Tune's ConcurrencyLimiter hands the searcher its limit; the limiter keeps limiting
    assert s.set_max_concurrency(2) is False and s.lines.concurrency == 2
    s.suggest("a")
    s.suggest("b")
    s.on_trial_complete("a", _ok(0.5))
    s.on_trial_complete("b", {"status": "failed", "error": "ValueError: boom", "objective": None})
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 2, out
    assert out[0].startswith("[search] trial 1/3  ok         objective 0.5000  best 0.5000 (#0000)")
    assert out[0].endswith("#0000 b=1 u=0 t_b=0 t_u=0 w=task=1,language=1"), out[0]
    assert out[1].startswith("[search] trial 2/3  failed     objective -  best 0.5000 (#0000)")
    assert " ETA " in out[1] and out[1].endswith("#0001 b=2 u=0 t_b=0 t_u=0 w=task=1,language=1")
