"""Search spaces: define-by-run sampling, pure decoding, constraints, warm start, experiment config.

Run: .venv/bin/python -m pytest -q tests/spaces/test_search_space.py
"""

from __future__ import annotations

import optuna
import pytest
from pydantic import ValidationError

from layerswap.spaces.recipe import ExpertSoup, RecipeError, SideWeights, recipe_id
from layerswap.spaces.search_experiment import SearchExperiment, load_search_experiment
from layerswap.spaces.search_space import (
    ExpertPool,
    ExpertRef,
    SearchSpace,
    Span,
    decode,
    recipe_fields,
    suggest,
    warm_start,
)
from layerswap.spaces.task_families import heldout_task

optuna.logging.set_verbosity(optuna.logging.WARNING)
POOL = ExpertPool.from_paths(["/m0", "/m1"], ["/l0", "/l1"], base="/base")
WIDE = SearchSpace(
    bottom=Span(low=0, high=1.0, unit="fraction"),
    top=Span(low=0, high=1.0, unit="fraction"),
    bottom_transition=Span(low=0, high=1.0, unit="fraction"),
    top_transition=Span(low=0, high=1.0, unit="fraction"),
    weighting=["uniform", "explicit", "magnitude"],
    non_layer=["average", "language", "task"],
    granularity=["layer", "component"],
    attention=["language", "task"],
    soups=True,
)


def _sample(space: SearchSpace, depth: int, n: int, pool=POOL, sampler=None) -> list[dict]:
    study = optuna.create_study(
        direction="maximize", sampler=sampler or optuna.samplers.RandomSampler(seed=0)
    )
    out = []
    for _ in range(n):
        t = study.ask()
        suggest(t, space, depth, pool)
        out.append(dict(t.params))
        study.tell(t, float(sum(v for v in t.params.values() if isinstance(v, int))))
    return out


@pytest.mark.parametrize(
    ("depth", "bottom", "top"), [(32, (3, 5), (0, 2)), (12, (1, 2), (0, 1)), (28, (3, 4), (0, 2))]
)
def test_default_space_is_the_papers_ranges_scaled(depth, bottom, top):
    space = SearchSpace()
    assert space.bottom.resolve(depth) == bottom
    assert space.top.resolve(depth) == top
    seen = _sample(space, depth, 60, pool=None)
    assert {p["bottom"] for p in seen} == set(range(bottom[0], bottom[1] + 1))
    assert all(top[0] <= p.get("top", 0) <= top[1] for p in seen)


@pytest.mark.parametrize("depth", [2, 4, 7, 32])
def test_constraint_holds_by_construction(depth):
    for params in _sample(WIDE, depth, 150):
        r = decode(params, WIDE, depth, POOL)
        assert r.bottom + r.top + r.bottom_transition + r.top_transition <= depth - 1
    # also under TPE, which learns from earlier trials
    for params in _sample(
        WIDE, depth, 30, sampler=optuna.samplers.TPESampler(seed=1, n_startup_trials=5)
    ):
        decode(params, WIDE, depth, POOL)


class StrictTrial:
    """A trial that fails on anything but suggest_* (the sampler must not compute)."""

    def __init__(self, fixed):
        self.inner = optuna.trial.FixedTrial(fixed)
        self.calls = []

    def __getattr__(self, name):
        if not name.startswith("suggest_"):
            raise AssertionError(f"suggest() touched trial.{name}")
        self.calls.append(name)
        return getattr(self.inner, name)


def test_suggest_only_asks_and_decode_is_pure():
    fixed = {"task_expert": "1", "language_expert": SOUP_CHOICE, "granularity": "component"}
    fixed |= {"attention": "language", "bottom": 2, "top": 1, "bottom_transition": 1}
    fixed |= {
        "top_transition": 0,
        "non_layer": "average",
        "weights": "explicit",
        "task_weight": 0.3,
    }
    trial = StrictTrial(fixed)
    assert suggest(trial, WIDE, 8, POOL) == {}
    assert set(trial.calls) <= {"suggest_int", "suggest_categorical", "suggest_float"}
    params = dict(fixed)
    r1, r2 = decode(params, WIDE, 8, POOL), decode(params, WIDE, 8, POOL)
    assert params == fixed and r1 == r2 and recipe_id(r1) == recipe_id(r2)
    assert r1.task_expert == "/m1"
    assert r1.language_expert == ExpertSoup(soup=["/l0", "/l1"])
    assert r1.attention == "language" and r1.mlp.bottom == 2 and r1.mlp.top == 1
    assert r1.transition_weights == SideWeights(task=0.3, language=0.7)
    assert recipe_fields(r1)["granularity"] == "component"


SOUP_CHOICE = "soup"


def test_weights_are_not_asked_when_unused():
    space = SearchSpace(weighting=["uniform", "magnitude"], non_layer=["language", "average"])
    trial = StrictTrial(
        {
            "bottom": 1,
            "top": 0,
            "bottom_transition": 0,
            "top_transition": 0,
            "non_layer": "language",
        }
    )
    suggest(trial, space, 12, None)
    r = decode(dict(trial.inner.params), space, 12, None)
    assert "weights" not in trial.inner.params and r.transition_weights == SideWeights()


def test_warm_start_is_the_paper_default():
    p32 = warm_start(SearchSpace(), 32, POOL)
    r = decode(p32, SearchSpace(), 32, POOL)
    assert (r.bottom, r.top, r.bottom_transition, r.top_transition) == (5, 2, 0, 0)
    assert r.task_expert == "/m0" and r.language_expert == "/l0" and r.non_layer == "average"
    r12 = decode(warm_start(SearchSpace(), 12, None), SearchSpace(), 12, None)
    assert (r12.bottom, r12.top) == (2, 1)
    # a space that excludes the default: clamped into range
    narrow = SearchSpace(bottom=Span(low=0, high=1))
    assert decode(warm_start(narrow, 32, None), narrow, 32, None).bottom == 1


def test_warm_start_is_enqueued_first_in_a_real_study():
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=0))
    study.enqueue_trial(warm_start(SearchSpace(), 32, POOL))
    study.optimize(lambda t: float(suggest(t, SearchSpace(), 32, POOL) == {}), n_trials=3)
    assert study.trials[0].params["bottom"] == 5 and study.trials[0].params["top"] == 2


def test_decode_rejects_bad_params():
    with pytest.raises(ValueError, match="unknown parameter"):
        decode({"bottum": 1}, WIDE, 8, POOL)
    with pytest.raises(RecipeError, match="exceeds"):
        decode({"bottom": 5, "top": 3}, WIDE, 8, POOL)
    with pytest.raises(ValueError, match="non_layer"):
        decode({"bottom": 1, "non_layer": "task"}, SearchSpace(), 8, POOL)
    with pytest.raises(ValueError, match="index 5"):
        decode({"task_expert": "5"}, WIDE, 8, POOL)


def test_expert_kinds_filter_and_span_validation():
    pool = ExpertPool(
        task=[ExpertRef(path="/m", kind="full"), ExpertRef(path="/ml", kind="lora")],
        language=[ExpertRef(path="/l", kind="lora")],
        base="/b",
    )
    space = SearchSpace(expert_kinds=["lora"])
    p = warm_start(space, 12, pool)
    assert decode(p, space, 12, pool).task_expert == "/ml"
    with pytest.raises(ValidationError):
        Span(low=3, high=1)
    with pytest.raises(ValidationError):
        Span(low=0.5, high=1.5, unit="fraction")
    with pytest.raises(ValidationError):
        SearchSpace(extra_field=1)


def test_experiment_config(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "e.yaml").write_text(
        "language: xa\nbase: b\ntask_experts: [m]\nlanguage_experts: [l]\nworld: w\n"
        "search: {num_samples: 3}\n"
    )
    exp = load_search_experiment(tmp_path / "e.yaml")
    assert exp.task_experts == [str(tmp_path / "m")] and exp.search.num_samples == 3
    assert [p.task for p in exp.proxy_list] == ["world_belebele_brier_xa_dev"]
    assert exp.target_task == "world_mgsm_direct_xa"
    assert heldout_task("world_belebele_xa_dev") == "world_belebele_xa"
    (tmp_path / "bad.yaml").write_text(
        "language: xa\ntask_experts: [m]\nlanguage_experts: [l]\nspaace: {}\n"
    )
    with pytest.raises(ValueError, match="spaace"):
        load_search_experiment(tmp_path / "bad.yaml")
    with pytest.raises(ValidationError, match=r"proxies .the default. .*the search's target"):
        SearchExperiment(
            language="xa",
            base="b",
            task_experts=["m"],
            language_experts=["l"],
            target="world_belebele_brier_xa_dev",
        )
    with pytest.raises(ValidationError, match="at least one of each"):
        SearchExperiment(language="xa", base="b", task_experts=["m"])
    with pytest.raises(ValidationError, match="magnitude needs"):
        SearchExperiment(language="xa", task_experts=["m"], language_experts=["l"])


def test_experiment_paths_follow_the_one_rule(tmp_path, monkeypatch):
    """Against the file's folder, then the working directory (trials run in folders of their
    own, so what exists only from the working directory is made absolute); Hub ids stay."""
    cfg, cwd = tmp_path / "cfg", tmp_path / "cwd"
    (cfg / "m").mkdir(parents=True)
    (cwd / "runs/l").mkdir(parents=True)
    (cfg / "e.yaml").write_text(
        "language: xa\nbase: meta-llama/Llama-3.1-8B\ntask_experts: [m]\n"
        "language_experts: [runs/l]\nworld: nowhere\n"
    )
    monkeypatch.chdir(cwd)
    exp = load_search_experiment(cfg / "e.yaml")
    assert exp.task_experts == [str(cfg / "m")]
    assert exp.language_experts == [str(cwd / "runs/l")]
    assert exp.base == "meta-llama/Llama-3.1-8B" and exp.world == "nowhere"
