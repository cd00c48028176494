"""The ΔW map finds models a real run records by Hub id (the papers' configs: `base:
meta-llama/...`) in the local Hugging Face cache, never the network, and says which model it
could not find (analysis/load.py `RunData.model_folder`, analysis/delta_report.py). Run:
.venv/bin/python -m pytest -q tests/analysis/test_delta_model_refs.py
"""

from __future__ import annotations

import shutil

import huggingface_hub.constants
import pandas as pd
from analysis_synth import make_run

from layerswap.analysis.delta_report import pick_experts
from layerswap.analysis.load import load_run

HUB_ID = "org-x/base-8b"


def _hub_base_run(tmp_path):
    """A synthetic run whose registry records its base as HUB_ID, and an empty HF cache."""
    run = make_run(tmp_path / "made", with_study=False)
    reg = pd.read_parquet(run / "experts" / "registry.parquet")
    base = run / reg["base"].iloc[0]
    reg["base"] = HUB_ID
    reg.to_parquet(run / "experts" / "registry.parquet")
    return run, base


def _cache(cache, base):
    """`base` as the Hub cache lays out a snapshot of HUB_ID."""
    repo = cache / f"models--{HUB_ID.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("0" * 40)
    shutil.copytree(base, repo / "snapshots" / ("0" * 40))


def test_a_hub_id_base_is_read_from_the_local_cache(tmp_path, monkeypatch):
    run, base = _hub_base_run(tmp_path)
    cache = tmp_path / "hf"
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)

    experts, notes = pick_experts(load_run(run))
    assert experts == [] and notes, notes  # not cached: named, not mistaken for RUN/org-x/...
    assert f"its base: {HUB_ID}: not found here, nor as a Hub model in the local cache" in notes[0]

    _cache(cache, base)
    experts, notes = pick_experts(load_run(run))
    assert {e.kind for e in experts} == {"math", "language"}, notes
    assert all(e.base.parent.parent.name == "models--org-x--base-8b" for e in experts)


def test_a_search_of_explicit_experts_is_mapped_from_its_pool(tmp_path):
    """A search given expert folders writes no registry; its pool (search/pool.json) names the
    experts and the base."""
    from layerswap.spaces.search_space import ExpertPool

    run = make_run(tmp_path / "made", with_study=False)
    reg = pd.read_parquet(run / "experts" / "registry.parquet")
    folders = {k: str(run / reg.loc[reg["kind"] == k, "path"].iloc[0]) for k in ("math", "language")}  # fmt: skip
    pool = ExpertPool(
        task=[{"path": folders["math"]}], language=[{"path": folders["language"]}],
        base=str(run / reg["base"].iloc[0]),
    )  # fmt: skip
    (run / "experts" / "registry.parquet").unlink()
    (run / "search").mkdir(exist_ok=True)
    (run / "search" / "pool.json").write_text(pool.model_dump_json())

    experts, notes = pick_experts(load_run(run))
    assert [(e.kind, str(e.path)) for e in experts] == [("math", folders["math"]), ("language", folders["language"])], notes  # fmt: skip
