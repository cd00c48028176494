"""A resumed promotion keeps every model an earlier one evaluated the same way, and evaluates the
rest: a missing or broken result file, a changed `promote` budget, a checkpoint whose content
changed (search/promote_kept.py).

Run: .venv/bin/python -m pytest -q tests/search/test_promote_kept.py   (about 30 s)
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from search_fixtures import experiment, make_experts, one_trial_run

from layerswap.search.promote import promote
from layerswap.search.promote_kept import tasks_digest
from layerswap.trainables.evaluate import harness

pytestmark = pytest.mark.usefixtures("one_thread")

TARGET = "world_mgsm_direct_xa"
PROXY = [{"task": "world_belebele_xa_dev", "chance": 0.25}]


@pytest.fixture
def run(tiny_world, tmp_path):
    """(experiment, RUN, candidate name, experts) after one full promotion of RUN."""
    paths = {k: Path(shutil.copytree(v, tmp_path / "experts" / k)) for k, v in make_experts(tiny_world, tmp_path / "made").items()}  # fmt: skip
    run_dir, rid = one_trial_run(tmp_path, paths)
    exp = experiment(tiny_world, paths, proxies=PROXY, promote={"top_k": 1, "limit": 2, "max_gen_toks": 4, "baselines": ["base"], "num_fewshot": 0, "write_best": False})  # fmt: skip
    promote(exp, run_dir, progress=False)
    return exp, run_dir, f"candidate_{rid}", paths


def _counted(monkeypatch) -> list[tuple]:
    """Patch lm-eval's entry point to record the tasks of each call (one per shot group)."""
    seen: list[tuple] = []
    real = harness.evaluate

    def evaluate(model, tasks, *a, **kw):
        seen.append(tuple(tasks))
        return real(model, tasks, *a, **kw)

    monkeypatch.setattr(harness, "evaluate", evaluate)
    return seen


def _values(rows: list[dict]) -> dict:
    return {(r["model"], r["task"]): r["value"] for r in rows}


def test_a_second_promotion_keeps_every_model(run, monkeypatch, capsys):
    exp, run_dir, cand, _ = run
    first = json.loads((run_dir / "promotion" / "lm_eval" / cand / f"{TARGET}.json").read_text())
    seen = _counted(monkeypatch)
    res = promote(exp, run_dir, progress=True)
    assert seen == []  # nothing evaluated again
    out = capsys.readouterr().out
    assert out.count("(kept from the earlier promotion)") == 2, out
    again = json.loads((run_dir / "promotion" / "lm_eval" / cand / f"{TARGET}.json").read_text())
    assert again == first  # the raw result, as lm-eval wrote it
    assert res.best_model == cand and len(res.rows) == 2 * 3  # 2 models x target, dev, held-out


def test_only_a_model_without_a_whole_result_is_evaluated(run, monkeypatch):
    exp, run_dir, _, _ = run
    before = _values(promote(exp, run_dir, progress=False).rows)
    (run_dir / "promotion" / "lm_eval" / "base" / f"{TARGET}.json").write_text('{"config": ')
    seen = _counted(monkeypatch)
    res = promote(exp, run_dir, progress=False)
    assert len(seen) == 1  # one shot group of the base: the candidate was kept
    assert _values(res.rows) == before  # the same items, the same scores


def test_another_budget_or_changed_checkpoint_is_evaluated_again(run, monkeypatch):
    exp, run_dir, _, paths = run
    seen = _counted(monkeypatch)
    more = exp.model_copy(update={"promote": exp.promote.model_copy(update={"limit": 3})})
    res = promote(more, run_dir, progress=False)
    assert len(seen) == 2 and {r["n_items"] for r in res.rows} == {3}
    seen.clear()
    cfg = paths["base"] / "config.json"
    cfg.write_text(json.dumps(json.loads(cfg.read_text()) | {"layerswap_test_note": 1}))
    promote(more, run_dir, progress=False)
    # The base's content id changed, and with it the candidate's (its recipe names the base):
    # both are other models now, evaluated again.
    assert len(seen) == 2


def test_a_result_from_another_device_is_evaluated_again(run, monkeypatch):
    """Kernels differ between devices: a model scored on a GPU is not mixed into a CPU board."""
    exp, run_dir, cand, _ = run
    for f in (run_dir / "promotion" / "lm_eval" / cand).glob("*.json"):
        raw = json.loads(f.read_text())
        assert raw["config"]["layerswap_promotion"]["device"] == "cpu"
        raw["config"]["layerswap_promotion"]["device"] = "cuda"
        f.write_text(json.dumps(raw))
    seen = _counted(monkeypatch)
    promote(exp, run_dir, progress=False)
    assert len(seen) == 1  # the candidate's one shot group; the base was kept


def test_the_task_digest_follows_the_world_and_the_task_folders(tiny_world, tmp_path):
    """A rebuilt world (its manifest lists every data file's sha256) or an edited task file gives
    another digest, so promotion evaluates again; Python's caches do not count."""
    world, tasks = tmp_path / "world", tmp_path / "tasks"
    world.mkdir()
    (world / "world.json").write_text('{"files": {"data/mgsm/xa/test.jsonl": "aa"}}')
    (tasks / "sub").mkdir(parents=True)
    (tasks / "sub" / "t.yaml").write_text("task: t\n")
    exp = experiment(tiny_world, make_experts(tiny_world, tmp_path / "made"))
    exp = exp.model_copy(update={"world": str(world)})
    first = tasks_digest(exp, [str(tasks)])
    (tasks / "__pycache__").mkdir()
    (tasks / "__pycache__" / "x.pyc").write_bytes(b"1")
    assert tasks_digest(exp, [str(tasks)]) == first
    # A writer killed mid-write of a task file leaves its temporary: lm-eval reads no such file.
    (tasks / "sub" / ".t.yaml.tmp-4242-0123abcd").write_text("task: t\nnum_fewshot: 5\n")
    assert tasks_digest(exp, [str(tasks)]) == first
    (world / "world.json").write_text('{"files": {"data/mgsm/xa/test.jsonl": "bb"}}')
    second = tasks_digest(exp, [str(tasks)])
    assert second != first
    (tasks / "sub" / "t.yaml").write_text("task: t\nnum_fewshot: 2\n")
    assert tasks_digest(exp, [str(tasks)]) not in (first, second)


def test_the_task_digest_does_not_follow_where_the_world_lies(tiny_world, tmp_path):
    """The task YAMLs name the world's files by absolute path: a run resumed after its world
    moved (same manifest) keeps its results."""
    tasks = {}
    for name in ("a", "b"):
        world = tmp_path / name / "world"
        world.mkdir(parents=True)
        (world / "world.json").write_text('{"files": {}}')
        folder = tmp_path / name / "tasks"
        folder.mkdir()
        (folder / "t.yaml").write_text(f"task: t\ntest: {world}/data/mgsm/xa/test.jsonl\n")
        exp = experiment(tiny_world, make_experts(tiny_world, tmp_path / "made"))
        tasks[name] = tasks_digest(exp.model_copy(update={"world": str(world)}), [str(folder)])
    assert tasks["a"] == tasks["b"]


def _generation(folder: Path) -> dict:
    """The generation settings a model built from `folder` decodes with, as a JSON dict (as
    lm-eval's HFLM loads a merged folder: its generation_config.json, else config.json's)."""
    from transformers import AutoConfig, GenerationConfig

    if (folder / "generation_config.json").exists():
        return GenerationConfig.from_pretrained(folder).to_dict()
    return GenerationConfig.from_model_config(AutoConfig.from_pretrained(folder)).to_dict()


def test_a_changed_decoding_of_the_primary_is_evaluated_again_a_resave_is_kept(run, monkeypatch):
    """Content ids do not hash generation_config.json, but lm-eval's generate reads it: the
    candidate (whose recipe's primary is the task expert) decoded with another
    repetition_penalty is another result; the same settings saved again by another
    transformers version, in another key order, are the same one."""
    exp, run_dir, cand, paths = run
    settings = _generation(paths["task"])
    resaved = dict(reversed(list(settings.items()))) | {"transformers_version": "4.40.0"}
    (paths["task"] / "generation_config.json").write_text(json.dumps(resaved, indent=4))
    seen = _counted(monkeypatch)
    promote(exp, run_dir, progress=False)
    assert seen == []  # same settings: both models kept
    changed = settings | {"repetition_penalty": 1.05}
    (paths["task"] / "generation_config.json").write_text(json.dumps(changed))
    res = promote(exp, run_dir, progress=False)
    assert len(seen) == 1  # the candidate's one shot group; the base decodes as before: kept
    raw = json.loads((run_dir / "promotion" / "lm_eval" / cand / f"{TARGET}.json").read_text())
    base_raw = json.loads((run_dir / "promotion" / "lm_eval" / "base" / f"{TARGET}.json").read_text())  # fmt: skip
    assert raw["config"]["layerswap_promotion"]["decoding"] != base_raw["config"]["layerswap_promotion"]["decoding"]  # fmt: skip
    assert res.best_model == cand
