"""The lm-eval internals behind trainables/evaluate/lm_eval_api.py: fails loudly, naming the
installed version, when an lm-eval release changes what the proxy evaluator relies on."""

from __future__ import annotations

import copy
import inspect
import subprocess

import lm_eval
import pytest
from proxy_fixtures import write_world

from layerswap.trainables.evaluate.lm_eval_api import (
    LM_EVAL_VERSION,
    REQUEST_METHODS,
    apply_filters,
    load_tasks,
    quiet_git_probe,
    tag_members,
    task_configs,
    task_index,
)
from layerswap.trainables.evaluate.scoring import config_higher_is_better

CHANGED = (
    f"lm-eval {lm_eval.__version__} (the adapter mirrors {LM_EVAL_VERSION}) no longer behaves as "
    "trainables/evaluate/lm_eval_api.py expects: re-check it and the proxy evaluator, then move "
    "the pin"
)


@pytest.fixture(scope="module")
def tasks(tmp_path_factory):
    world = write_world(tmp_path_factory.mktemp("lm_eval_api"), n_mgsm=3, n_bele=3)
    return load_tasks(["mgsm_dev", "bele_dev"], world)


def test_pinned_version():
    assert lm_eval.__version__ == LM_EVAL_VERSION, CHANGED


def test_load_tasks_gives_task_objects_by_leaf_name(tasks):
    from lm_eval.api.task import Task

    assert sorted(tasks) == ["bele_dev", "mgsm_dev"], CHANGED
    assert all(isinstance(t, Task) for t in tasks.values()), CHANGED


def test_task_configs_resolve_includes_without_data(tmp_path):
    """The search checks a proxy's direction from its config alone (no dataset opened): the
    config must carry the included built-in's metrics and their direction."""
    world = write_world(tmp_path / "w", n_mgsm=3, n_bele=3)
    for f in world.glob("*.jsonl"):
        f.unlink()  # no data: a config read must not need it
    names = ["mgsm_dev", "bele_dev", "bele_brier_dev"]
    cfgs = task_configs(names, world)
    assert cfgs["mgsm_dev"]["output_type"] == "generate_until", CHANGED  # from the include
    got = {n: config_higher_is_better(cfgs[n], n) for n in names}
    assert got == {
        "mgsm_dev": ("exact_match", True),
        "bele_dev": ("acc", True),
        "bele_brier_dev": ("brier_score", False),
    }, CHANGED


def test_filters_fill_filtered_resps_by_name(tasks):
    task = tasks["mgsm_dev"]
    assert hasattr(task, "_filters"), CHANGED
    task.build_all_requests(limit=1, rank=0, world_size=1)
    inst = copy.copy(task.instances[0])
    inst.resps, inst.filtered_resps = ["Step-by-Step Answer: 5 plus 7 equals 12."], {}
    apply_filters(task, [inst])
    names = {f["name"] for f in task.config.filter_list}
    assert set(inst.filtered_resps) == names, CHANGED
    assert inst.filtered_resps["flexible-extract"] == "12.", CHANGED  # the last number


def test_progress_switches_exist():
    """What `lm_eval_output` and `request_bars_off` turn off: the tqdm that lm_eval.api.task
    calls in build_all_requests, HFLM's request methods' `disable_tqdm`."""
    import inspect

    import lm_eval.api.task as task_module
    from lm_eval.models.huggingface import HFLM

    for name in REQUEST_METHODS:
        assert "disable_tqdm" in inspect.signature(getattr(HFLM, name)).parameters, CHANGED
    assert "tqdm(" in inspect.getsource(task_module.Task.build_all_requests), CHANGED
    assert hasattr(task_module, "tqdm"), CHANGED


# What lm-eval prints while it runs: its request and task bars, its INFO log.
LM_EVAL_NOISE = ("Running loglikelihood requests", "Running generate_until requests",
                 "Tokenizing inputs", "%|", "Building contexts")  # fmt: skip


def test_evaluate_is_quiet_unless_verbose(tasks, tmp_path_factory, capfd):
    """harness.evaluate(verbose=False) prints none of lm-eval's bars or INFO log; verbose=True
    shows them (both tasks: one generate_until, one multiple-choice)."""
    from proxy_fixtures import tiny_models

    from layerswap.trainables.evaluate.harness import evaluate
    from layerswap.world.tiny import tiny_tokenizer

    world = write_world(tmp_path_factory.mktemp("lm_eval_output"), n_mgsm=2, n_bele=2)
    tok = tiny_tokenizer()
    (model,) = tiny_models(tok, n=1)
    kw = dict(tokenizer=tok, include_path=world, limit=2, max_gen_toks=2)
    capfd.readouterr()
    evaluate(model, ["mgsm_dev", "bele_dev"], verbose=True, **kw)
    loud = "".join(capfd.readouterr())
    # "Building contexts" is an INFO log line: where it lands depends on how logging was set
    # up by earlier tests in the same process, so only the bars are required when verbose.
    assert all(s in loud for s in LM_EVAL_NOISE if s != "Building contexts"), loud[-2000:]
    evaluate(model, ["mgsm_dev", "bele_dev"], verbose=False, **kw)
    quiet = "".join(capfd.readouterr())
    assert not [s for s in LM_EVAL_NOISE if s in quiet], quiet[-2000:]


def _git(cwd, *args):
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()  # fmt: skip


def test_quiet_git_probe_mirrors_lm_evals_and_prints_nothing(tmp_path, monkeypatch, capfd):
    """Where lm-eval reaches its git probe, and that the quiet one returns what lm-eval's does:
    the commit inside a git checkout, None outside one, where lm-eval's own prints git's
    "fatal: not a git repository" (if a release stops printing it, this adapter can go)."""
    import lm_eval.evaluator as evaluator

    current = evaluator.get_git_commit_hash  # lm-eval's, or the quiet one an earlier test set
    original = getattr(current, "lm_eval_original", current)
    assert original.__module__ == "lm_eval.loggers.utils", CHANGED
    assert "get_git_commit_hash()" in inspect.getsource(evaluator.simple_evaluate), CHANGED
    monkeypatch.setattr(evaluator, "get_git_commit_hash", current)  # restored after the test
    quiet_git_probe()
    quiet = evaluator.get_git_commit_hash
    assert quiet is not original and quiet.lm_eval_original is original

    outside = tmp_path / "plain"
    outside.mkdir()
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))  # no repository above it
    monkeypatch.chdir(outside)
    capfd.readouterr()
    assert original() is None
    assert "not a git repository" in capfd.readouterr().err, CHANGED
    assert quiet() is None
    assert capfd.readouterr().err == ""

    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    _git(repo, "commit", "-q", "--allow-empty", "-m", "x")
    monkeypatch.chdir(repo)
    assert quiet() == original() == _git(repo, "describe", "--always")


def test_tag_members_reads_a_tags_tasks_from_the_index(tmp_path):
    """A tag indicator is pooled from its member tasks, which only the task index records
    (lm-eval's results hold no row for a tag): the index's entry kinds and `tags` must hold."""
    world = write_world(tmp_path / "w", n_mgsm=3, n_bele=3)
    for name in ("bele_dev", "mgsm_dev"):  # the same tasks again, under a tag
        text = (world / f"{name}.yaml").read_text().replace(f"task: {name}", f"task: {name}_t")
        (world / f"{name}_t.yaml").write_text(text + "tag: my_tag\n")
    index = task_index(["my_tag"], world)
    assert tag_members(index).get("my_tag") == ["bele_dev_t", "mgsm_dev_t"], CHANGED
