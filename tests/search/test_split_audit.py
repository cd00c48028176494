"""The merge search never reads a test split, checked from outside: every file its processes open.

The trials' own `splits_read` says which splits the evaluator meant to read; these tests record,
with an audit hook in every Ray process (tests/search/audit_hook), which world files were really
opened, so a task wired to the wrong file cannot hide behind a correct-looking report.

The first test runs `layerswap search` itself, with promotion on, through the command's preflight
(its checks of every task's data, promotion's test-split tasks included) up to where the trials
would start: the driver must not open a test split either.

Run: .venv/bin/python -m pytest -q tests/search/test_split_audit.py   (Ray starts per slow test)
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from audit_hook import sitecustomize as audit
from audit_hook.sitecustomize import read_log
from search_fixtures import audited_ray, experiment, make_experts

from layerswap.spaces.search_experiment import world_proxies

# `datasets` caches a loaded split as <builder>-<split>.arrow, written first as
# <builder>-<split>-00000-00000-of-NNNNN.arrow (it maps the file in natively when reading it
# back, which no audit hook sees: hence the fresh cache, so every split is parsed from its JSONL).
TEST_ARROW = re.compile(r"-test(-[0-9]+)*(-of-[0-9N]+)?\.arrow$")


@pytest.fixture(scope="module")
def experts(tiny_world, tmp_path_factory) -> dict[str, Path]:
    return make_experts(tiny_world, tmp_path_factory.mktemp("audit") / "experts")


def _real(path: str) -> Path:
    return Path(os.path.realpath(path))


def audited_search(world: Path, exp, tmp: Path):
    """Run the search with every process's opens under `world` recorded.

    Returns:
        (SearchResult, [(pid, mode, path)] of every open, by the driver and every Ray process).
    """
    from layerswap.search.search import run_search

    with audited_ray(tmp, [world]) as log_dir:
        res = run_search(exp, tmp / "run", progress=False)
    return res, read_log(log_dir)


def assert_no_test_split_opened(opens: list[tuple[int, str, str]], world: Path) -> None:
    """No world test-split file (data/<set>/<lang>/test.jsonl), nor a cached test split, opened."""
    data = Path(os.path.realpath(world)) / "data"
    bad = sorted(
        {
            f"{path} (pid {pid}, mode {mode})"
            for pid, mode, path in opens
            if (Path(path).name == "test.jsonl" and _real(path).is_relative_to(data))
            or TEST_ARROW.search(Path(path).name)
        }
    )
    assert not bad, "the search's processes opened test-split file(s):\n  " + "\n  ".join(bad)


def assert_opened(opens: list[tuple[int, str, str]], files: list[Path]) -> None:
    """Each file is in the record: the hook fires in the workers, so a record without test
    files means none was read, not that nothing was watched."""
    for f in files:
        assert any(_real(path) == f.resolve() for _, _, path in opens), (
            f"no Ray worker was seen opening {f}; recorded: {opens}"
        )


# `layerswap search` as the console script runs it, its trials replaced by a line saying the
# command got there: the preflight, the data check included, is the command's own.
_CLI = """import sys
import layerswap.search.search as search
def trials(*args, **kwargs):
    print("PREFLIGHT PASSED", flush=True)
    raise SystemExit(0)
search.run_search = trials
from layerswap.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_the_search_command_with_promotion_opens_no_test_split_before_its_trials(tiny_world, experts, tmp_path):  # fmt: skip
    # Before: the data check built promotion's tasks (the target, the proxies' held-out twins) as
    # lm-eval builds them, parsing the xa MGSM, xa Belebele and English MGSM test.jsonl files.
    proxies = [*world_proxies("xa"), {"task": "world_mgsm_direct_en_dev"}]
    exp = experiment(tiny_world, experts, proxies=proxies)
    assert exp.promote is not None and exp.target_task == "world_mgsm_direct_xa"
    cfg = tmp_path / "search.yaml"
    cfg.write_text(yaml.safe_dump(exp.model_dump(mode="json")))
    log_dir, cache = tmp_path / "audit", tmp_path / "hf_datasets_cache"
    log_dir.mkdir()
    env = {**os.environ, **audit.environment(log_dir, [tiny_world, cache])}
    env |= {"HF_DATASETS_CACHE": str(cache), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", _CLI, "search", str(cfg), "--out", str(tmp_path / "run")],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert proc.returncode == 0 and "PREFLIGHT PASSED" in proc.stdout, proc.stdout + proc.stderr
    opens = read_log(log_dir)
    assert_no_test_split_opened(opens, tiny_world)
    # Not vacuously: the data check was watched parsing the proxies' dev files.
    data = tiny_world / "data"
    assert_opened(opens, [data / "belebele/xa/dev.jsonl", data / "mgsm/en/dev.jsonl"])


@pytest.mark.slow
def test_the_search_opens_dev_files_and_no_test_split(tiny_world, experts, tmp_path):
    exp = experiment(
        tiny_world,
        experts,
        # the world default (Brier-scored Belebele) and a generated task beside it
        proxies=[*world_proxies("xa"), {"task": "world_mgsm_direct_en_dev"}],
        search={"num_samples": 2},
        proxy_eval={"limit": 4, "max_gen_toks": 4},
    )
    res, opens = audited_search(tiny_world, exp, tmp_path)

    assert res.n_trials == 2
    assert_no_test_split_opened(opens, tiny_world)
    # Not vacuously: the workers were watched opening the proxies' dev files (target-language
    # Belebele dev, English MGSM dev).
    data = tiny_world / "data"
    assert_opened(opens, [data / "belebele/xa/dev.jsonl", data / "mgsm/en/dev.jsonl"])


@pytest.mark.slow
def test_the_audit_catches_a_dev_task_that_reads_the_test_file(tiny_world, experts, tmp_path):
    """A proxy task named and reported as a dev split but wired to the test JSONL: what the
    trials report looks clean, and only the outside record shows the test file was read."""
    from layerswap.trainables.evaluate.tasks import write_world_tasks

    scratch, leaky = tmp_path / "world_tasks", tmp_path / "leaky_tasks"
    write_world_tasks(tiny_world, scratch)
    cfg = yaml.safe_load((scratch / "world_belebele_xa_dev.yaml").read_text())
    cfg["task"], cfg["tag"] = "leaky_belebele_xa_dev", ["leaky"]
    test_file = tiny_world.resolve() / "data" / "belebele" / "xa" / "test.jsonl"
    cfg["dataset_kwargs"]["data_files"]["dev"] = str(test_file)
    leaky.mkdir()
    (leaky / "leaky_belebele_xa_dev.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    exp = experiment(
        tiny_world,
        experts,
        proxies=[
            {"task": "leaky_belebele_xa_dev", "chance": 0.25},
            {"task": "world_mgsm_direct_en_dev"},
        ],
        include_path=[str(leaky)],
        search={"num_samples": 2},
        proxy_eval={"limit": 4, "max_gen_toks": 4},
    )
    res, opens = audited_search(tiny_world, exp, tmp_path)

    assert res.n_trials == 2
    # The self-report is blind to it: every split read is a dev split of a `_dev` task.
    assert res.splits_read and all(t.endswith("_dev") and s == "dev" for t, s in res.splits_read)
    with pytest.raises(AssertionError, match=r"belebele/xa/test\.jsonl \(pid \d+") as caught:
        assert_no_test_split_opened(opens, tiny_world)
    print(caught.value)  # the message a real regression would fail with (pytest -s shows it)
