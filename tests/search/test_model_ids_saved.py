"""A search, its --resume and its promotion hash each expert file once across processes; a touched
file is hashed again.

The search saves its experts' file digests in RUN/search/model_ids.json; a later process (a
promotion after `--resume`, a resumed search) starts with an empty in-memory cache and must read
them from there. The count is taken at the hashing function's reader, from outside the cache.
Run: .venv/bin/python -m pytest -q tests/search/test_model_ids_saved.py   (slow: Ray, lm-eval)
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import pytest
from search_fixtures import experiment, make_experts

from layerswap.trainables import model_ids

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def hashed(monkeypatch) -> Counter:
    """Every file the content ids read, counted by real path (the in-memory cache starts empty)."""
    seen: Counter = Counter()
    real = model_ids._file_sha256

    def counting(path: str) -> str:
        seen[os.path.realpath(path)] += 1
        return real(path)

    monkeypatch.setattr(model_ids, "_file_sha256", counting)
    monkeypatch.setattr(model_ids, "_FILE_DIGESTS", {})
    return seen


def _new_process(monkeypatch) -> None:
    """What a new `layerswap` process starts with: no digests in memory."""
    monkeypatch.setattr(model_ids, "_FILE_DIGESTS", {})


@pytest.mark.slow
def test_resume_and_promotion_in_new_processes_hash_nothing_the_search_hashed(
    tiny_world, tmp_path, ray_session, hashed, monkeypatch
):
    from layerswap.search.promote import promote
    from layerswap.search.search import run_search

    paths = make_experts(tiny_world, tmp_path / "experts")
    exp = experiment(
        tiny_world,
        paths,
        search={"num_samples": 2, "max_concurrent": 1},
        # soup_uniform: a recipe baseline, whose id hashes both experts; write_best merges the
        # best recipe to disk, whose model card names its id
        promote={"top_k": 1, "limit": 2, "max_gen_toks": 4, "baselines": ["soup_uniform"]},
    )
    run = tmp_path / "run"
    run_search(exp, run, progress=False)
    weights = {role: os.path.realpath(paths[role] / "model.safetensors") for role in paths}
    assert hashed[weights["task"]] == hashed[weights["language"]] == 1, hashed
    assert all(n == 1 for n in hashed.values()), hashed
    assert (run / "search" / "model_ids.json").is_file()

    # A resumed search (one more trial) in a new process proposes without hashing.
    hashed.clear()
    _new_process(monkeypatch)
    more = exp.model_copy(update={"search": exp.search.model_copy(update={"num_samples": 3})})
    assert run_search(more, run, resume=True, progress=False).n_trials == 3
    assert not hashed, f"--resume hashed again: {dict(hashed)}"

    _new_process(monkeypatch)
    board = promote(exp, run, progress=False)
    assert board.best_dir is not None and "soup_uniform" in {r["model"] for r in board.rows}
    assert not hashed, f"promotion hashed again: {dict(hashed)}"

    # A changed expert (same size, new mtime) is hashed again, and only it.
    st = Path(weights["language"]).stat()
    os.utime(weights["language"], ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    _new_process(monkeypatch)
    promote(exp, run, progress=False)
    assert dict(hashed) == {weights["language"]: 1}
