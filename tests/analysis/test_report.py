"""`layerswap analyze`: the report renders from a synthetic run directory (HTML embeds every
figure, Markdown has the tables), absent files give "not in this run", bad input exits 2 and
writes nothing."""

from __future__ import annotations

import base64
import json
import re

import pandas as pd
import pytest
import yaml

from layerswap.analysis.indicators import indicator_table
from layerswap.analysis.load import load_run, target_tasks
from layerswap.analysis.treatments import friedman_matrix, treatment_tables, treatment_values
from layerswap.cli import main


@pytest.mark.slow
def test_report_renders_with_embedded_figures_and_tables(report):
    html = (report / "report.html").read_text()
    md = (report / "report.md").read_text()
    pngs = sorted((report / "figures").glob("*.png"))
    assert len(pngs) >= 10
    embedded = re.findall(r"src='data:image/png;base64,([A-Za-z0-9+/=]+)'", html)
    assert len(embedded) == len(pngs)
    assert {base64.b64decode(e) for e in embedded} == {p.read_bytes() for p in pngs}
    assert "<img" in html and "src='figures/" not in html  # self-contained
    for title in (
        "Merging indicators",
        "Where the experts changed",
        "The merge search",
        "Treatments",
        "Against the experts",
    ):
        assert title in html and f"## {title}" in md
    assert "| level | indicator | n | dev items | spearman [95% CI]" in md
    assert "| treatment | base | partial | lora | full |" in md
    assert "| model | target | items | vs better expert (language_expert) | vs base (base) |" in md
    assert "Friedman test over 2 conditions" in md and "not in this run" not in md.lower()
    for p in pngs:  # every figure is linked from the Markdown with its caption
        assert f"(figures/{p.name})" in md
    summary = json.loads((report / "summary.json").read_text())
    assert summary["sections"]["delta"]["suggested_boundaries"]["bottom"] == 2
    assert summary["sections"]["delta"]["suggested_boundaries"]["top"] == 1
    assert summary["sections"]["delta"]["suggested_boundaries"]["usable_warm_start"] is True
    assert "no warm start" not in md
    # The depth table: the math expert changed layers 2-4 of 6 (the middle half only), the
    # language expert layers 0, 1 and 5 (bottom quarter, top quarter and one middle layer).
    regions = summary["sections"]["delta"]["depth_regions"]
    math = next(v for k, v in regions.items() if k.startswith("math"))
    lang = next(v for k, v in regions.items() if k.startswith("language"))
    for group in ("attention", "MLP"):
        assert math[group]["bottom quarter"] == math[group]["top quarter"] == 0.0
        assert math[group]["middle half"] > 0
        assert lang[group]["bottom quarter"] > lang[group]["middle half"] > 0
        assert lang[group]["top quarter"] > lang[group]["middle half"]
    assert "| expert | attention bottom quarter |" in md and "The paper's Fig. 2" in md


@pytest.mark.slow
def test_rerun_needs_overwrite(run_dir, report, capsys):
    assert main(["analyze", str(run_dir), "--out", str(report)]) == 2
    assert "already exists" in capsys.readouterr().err


def test_out_may_not_replace_the_run_or_its_inputs(run_dir, tmp_path, capsys, tree_state):
    before = tree_state(run_dir)
    for out in (run_dir, run_dir / "experts", run_dir / "search" / "new", run_dir.parent):
        assert main(["analyze", str(run_dir), "--out", str(out), "--overwrite"]) == 2
        err = capsys.readouterr().err
        assert str(out) in err and "input" in err and "Traceback" not in err
    other = tmp_path / "mine"  # a folder layerswap never wrote
    other.mkdir()
    (other / "notes.txt").write_text("keep me")
    assert main(["analyze", str(run_dir), "--out", str(other), "--overwrite"]) == 2
    assert "not written by layerswap" in capsys.readouterr().err
    assert (other / "notes.txt").read_text() == "keep me"
    assert tree_state(run_dir) == before


def test_indicator_table_joins_experts_and_trials(run_dir):
    run = load_run(run_dir)
    assert target_tasks(run) == ["world_mgsm_direct_xa", "world_mgsm_direct_xb"]
    df, levels = indicator_table(run, "world_mgsm_direct_xa")
    assert len(df) == 8 and levels["merge: objective"] == "merge"
    assert levels["language expert: belebele_xa_dev"] == "expert"
    trials = pd.read_parquet(run_dir / "search" / "trials.parquet").set_index("recipe_id")
    reg = pd.read_parquet(run_dir / "experts" / "registry.parquet").set_index("expert_id")
    for _, r in df.iterrows():
        tr = trials.loc[r["recipe_id"]]
        assert r["merge: objective"] == tr["objective"]
        want = reg.loc[tr["task_expert_id"], "ind__world_mgsm_direct_en_dev"]
        assert r["math expert: mgsm_direct_en_dev"] == want


def test_a_lower_is_better_proxy_is_negated_so_good_still_correlates_up(run_dir, tmp_path):
    """A Brier-scored proxy (lower is better, as the saved experiment says) enters the table
    negated and labelled, so a good indicator's Spearman is positive like the others'."""
    from layerswap.analysis.load import EXPERIMENT

    exp = {"language": "xa", "base": "b", "task_experts": ["m"], "language_experts": ["l"],
           "proxies": [{"task": "world_belebele_xa_dev", "chance": 0.75, "best": 0, "worst": 2},
                       {"task": "world_mgsm_direct_en_dev"}]}  # fmt: skip
    (tmp_path / EXPERIMENT).parent.mkdir(parents=True)
    (tmp_path / EXPERIMENT).write_text(json.dumps(exp))
    assert load_run(tmp_path).lower_is_better == {"world_belebele_xa_dev"}
    (tmp_path / EXPERIMENT).write_text(json.dumps({**exp, "a_field_of_later_code": 1}))
    assert load_run(tmp_path).lower_is_better == {"world_belebele_xa_dev"}  # proxies only
    (tmp_path / EXPERIMENT).write_text(json.dumps({**exp, "proxies": None}))
    assert load_run(tmp_path).lower_is_better == set()  # implicit: before Brier proxies
    (tmp_path / EXPERIMENT).write_text("{not json")
    with pytest.raises(ValueError, match=r"experiment\.json: not a search experiment's proxies"):
        load_run(tmp_path)

    run = load_run(run_dir)
    plain, _ = indicator_table(run, "world_mgsm_direct_xa")
    run.lower_is_better = {"world_belebele_xa_dev"}
    flipped, levels = indicator_table(run, "world_mgsm_direct_xa")
    name = "merge: belebele_xa_dev (negated: lower is better)"
    assert levels[name] == "merge" and "merge: belebele_xa_dev" not in flipped
    assert flipped[name].tolist() == (-plain["merge: belebele_xa_dev"]).tolist()
    assert (
        flipped["merge: mgsm_direct_en_dev"].tolist() == plain["merge: mgsm_direct_en_dev"].tolist()
    )


def test_treatments_table_and_friedman_matrix(run_dir):
    vals = treatment_values(load_run(run_dir))
    t1, t3 = treatment_tables(vals)
    assert t1.loc["base model", "base"] == "0.070"  # (0.08 + 0.06) / 2 from promotion
    assert t1.loc["simultaneous", "partial"] == "0.165†"  # registry, dev split
    assert "(n=" not in t3.loc["xa", "layer swap / full"]  # one model: the chosen swap
    assert t3.loc["xa", "layer swap (mean of 8 promoted candidates) / full"].endswith("(n=8)")
    cells = friedman_matrix(vals)
    mat, treats, blocks = cells.matrix, cells.treatments, cells.conditions
    assert mat.shape == (2, len(treats)) and len(blocks) == 2
    assert "base model" not in treats and "TIES / full" not in treats
    assert "layer swap / full" in treats


def test_friedman_matrix_drops_gaps():
    rows = [
        ("math-only", "full", "xa", ("b", "xa"), 0.1, "test", "promotion"),
        ("math-only", "full", "xb", ("b", "xb"), 0.2, "test", "promotion"),
        ("layer swap", "full", "xa", ("b", "xa"), 0.3, "test", "promotion"),
        ("layer swap", "full", "xb", ("b", "xb"), 0.4, "test", "promotion"),
        ("data mixing", "full", "xa", ("b", "xa"), 0.2, "test", "promotion"),
    ]
    vals = pd.DataFrame(rows, columns=["treatment", "mode", "language", "block", "value", "split", "source"])  # fmt: skip
    cells = friedman_matrix(vals)
    assert cells.treatments == ["layer swap / full", "math-only / full"]
    assert cells.matrix.shape == (2, 2) and cells.dropped_treatments == ["data mixing / full"]


def test_missing_files_say_not_in_this_run(tmp_path, capsys):
    run = tmp_path / "sparse_run"
    run.mkdir()
    out = tmp_path / "rep"
    # A folder with none of a run's files is not a run: refused, nothing written into it.
    assert main(["analyze", str(run), "--out", str(out)]) == 2
    assert f"{run}: not a run folder: none of experts/registry.parquet" in capsys.readouterr().err
    assert not out.exists() and list(run.iterdir()) == []
    # A demo's recipe whose checkpoints are gone: every section says what it lacks.
    recipe = {"method": "layer_swap", "task_expert": str(tmp_path / "gone_t"), "language_expert": str(tmp_path / "gone_l"), "bottom": 1, "top": 1}  # fmt: skip
    (run / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    assert main(["analyze", str(run), "--out", str(out)]) == 0
    md = (out / "report.md").read_text()
    assert md.count("Not in this run") == 5, md  # one per section
    assert list((out / "figures").iterdir()) == []


def test_bad_input_exits_2_and_writes_nothing(tmp_path, capsys, nothing_written):
    out = tmp_path / "rep"
    assert main(["analyze", str(tmp_path / "nope"), "--out", str(out)]) == 2
    assert "run directory does not exist" in capsys.readouterr().err
    run = tmp_path / "run"
    (run / "search").mkdir(parents=True)
    (run / "search" / "trials.parquet").write_bytes(b"PAR1 this is not parquet")
    assert main(["analyze", str(run), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "trials.parquet" in err and "not a readable Parquet file" in err
    nothing_written(out)
    (run / "search" / "trials.parquet").unlink()
    (run / "promotion").mkdir()
    pd.DataFrame({"model": ["base"], "value": [0.1]}).to_parquet(
        run / "promotion" / "results.parquet"
    )
    assert main(["analyze", str(run), "--out", str(out)]) == 2
    assert "results.parquet: missing required column(s) ['task']" in capsys.readouterr().err
    nothing_written(out)
    (run / "promotion" / "results.parquet").unlink()
    (run / "search" / "study.db").write_bytes(b"not sqlite at all" * 100)
    assert main(["analyze", str(run), "--out", str(out)]) == 2
    assert "study.db: not a readable Optuna study database" in capsys.readouterr().err
    nothing_written(out)
    with pytest.raises(SystemExit) as e:
        main(["analyze", str(run), "--resamples", "0"])
    assert e.value.code == 2


@pytest.mark.slow
def test_delta_quantile_reaches_the_report(run_dir, tmp_path):
    out = tmp_path / "q50"
    assert main(["analyze", str(run_dir), "--out", str(out), "--resamples", "50", "--delta-quantile", "0.5"]) == 0  # fmt: skip
    assert "the 0.5 quantile of that expert's row MAVs" in (out / "report.md").read_text()
    delta = json.loads((out / "summary.json").read_text())["sections"]["delta"]
    assert delta["suggested_boundaries"]["quantile"] == 0.5


def test_a_split_that_is_no_layer_swap_is_called_no_warm_start(tmp_path):
    from layerswap.analysis.delta import Boundaries
    from layerswap.analysis.delta_report import ExpertRef, Threshold, _suggested_boundaries
    from layerswap.analysis.sections import Section

    sec = Section("delta", "t")
    refs = [ExpertRef(k, k, tmp_path / k, tmp_path / "base") for k in ("math", "language")]
    b = Boundaries(bottom=5, top=0, dominance=[0.1] * 6)
    _suggested_boundaries(sec, b, *refs, 6, Threshold(), {"math": 1.0, "language": 2.0})
    text = " ".join(x for x in sec.blocks if isinstance(x, str))
    assert "gives the language expert 5 of 6 layers" in text and "no warm start" in text
    entry = sec.data["suggested_boundaries"]
    assert entry["usable_warm_start"] is False and entry["thresholds"] == {"math": 1.0, "language": 2.0}  # fmt: skip


def test_summary_json_holds_no_nan():
    from layerswap.analysis.report import _strict

    raw = {"rho": [float("nan"), 0.5], "inner": {"x": float("inf"), "n": 3}, "t": (1.0, float("-inf"))}  # fmt: skip
    assert _strict(raw) == {"rho": [None, 0.5], "inner": {"x": None, "n": 3}, "t": [1.0, None]}
    json.dumps(_strict(raw), allow_nan=False)  # what analyze_run writes with


def test_help_lists_analyze(capsys):
    with pytest.raises(SystemExit):
        main(["analyze", "--help"])
    text = capsys.readouterr().out
    assert "RUN_DIR" in text and "--out" in text and "report.html" in text
    from layerswap.analysis.delta import DEFAULT_QUANTILE

    # The help states the one default the report uses (the CLI passes none of its own).
    top = f"{100 - 100 * DEFAULT_QUANTILE:g} %"
    assert f"(default: {DEFAULT_QUANTILE:g}, the expert's top {top})" in " ".join(text.split())


@pytest.mark.slow
def test_demo_style_run_maps_the_recipe_experts(tmp_path):
    """A `layerswap demo` folder (recipe.yaml + models/) gets the ΔW section."""
    from layerswap.demo.merge_only import run_merge_demo

    demo = tmp_path / "demo"
    run_merge_demo(demo)
    out = tmp_path / "rep"
    assert main(["analyze", str(demo), "--out", str(out), "--max-experts", "1"]) == 0
    md = (out / "report.md").read_text()
    assert "Suggested warm start: b =" in md
    assert (out / "figures" / "delta_contrast.png").exists()
    assert md.count("Not in this run") == 4
