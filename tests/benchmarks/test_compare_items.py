"""benchmarks/compare_items.py on hand-made lm-eval result files: answers, texts, item scores.

Run `.venv/bin/python -m pytest tests/benchmarks/test_compare_items.py -q`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import compare_items

from layerswap.cli import main
from layerswap.trainables.evaluate.harness import predictions


def _mgsm(doc: int, text: str, answer: str, right: bool) -> list[dict]:
    """One MGSM item as lm-eval logs it: once per filter."""
    return [
        {
            "doc_id": doc,
            "target": "4",
            "filter": f,
            "resps": [[text]],
            "filtered_resps": [answer if f == "flexible-extract" else text],
            "exact_match": float(right),
        }
        for f in ("flexible-extract", "remove_whitespace")
    ]


def _bele(doc: int, lls: list[float], gold: int, probs: list[float]) -> dict:
    """One Brier-scored Belebele item: [log-likelihood, is_greedy] per option; Brier as numpy text."""
    return {"doc_id": doc, "target": gold, "filter": "none", "resps": [[[x, False]] for x in lls],
            "filtered_resps": [[x, False] for x in lls], "acc": float(lls.index(max(lls)) == gold),
            "brier_score": [gold, "[" + " ".join(f"{p:.8f}" for p in probs) + "]"]}  # fmt: skip


def _result(mgsm: list[list[dict]], bele: list[dict]) -> dict:
    em = sum(s[0]["exact_match"] for s in mgsm) / len(mgsm)
    return {
        "configs": {
            "m": {
                "output_type": "generate_until",
                "metric_list": [{"metric": "exact_match"}],
                "filter_list": [{"name": "remove_whitespace"}, {"name": "flexible-extract"}],
            },
            "b": {
                "output_type": "multiple_choice",
                "metric_list": [{"metric": "brier_score"}, {"metric": "acc"}],
            },
        },
        "results": {
            "m": {"exact_match,flexible-extract": em, "exact_match,remove_whitespace": 0.0},
            "b": {"brier_score,none": 0.1, "acc,none": 0.5},
        },
        "samples": {"m": [s for item in mgsm for s in item], "b": bele},
    }


def test_counts_answers_texts_and_item_scores():
    a = _result(
        [_mgsm(0, "2 + 2 = 4.", "4", True), _mgsm(1, "3 + 3 = 7.", "7", False)],
        [_bele(0, [-1.0, -0.5, -3.0, -4.0], 1, [0.2, 0.7, 0.05, 0.05])],
    )
    b = _result(
        [_mgsm(0, "2 + 2 = 4. And", "4", True), _mgsm(1, "3 + 3 = 6.", "6", True)],
        [_bele(0, [-1.1, -0.4, -3.0, -4.0], 1, [0.2, 0.7, 0.05, 0.05])],
    )
    rows, notes = compare_items.compare(a, b)
    got = {(r["task"], r["metric"]): r for r in rows}
    flex = got["m", "exact_match,flexible-extract"]
    assert (flex["items"], flex["same_answer"], flex["same_text"], flex["same_score"]) == (2, 1, 0, 1)  # fmt: skip
    assert flex["max_abs"] == 1.0
    brier = got["b", "brier_score,none"]
    # the same option chosen (index 1) although the log-likelihoods differ; Brier from the probs
    assert (brier["same_answer"], brier["same_text"], brier["same_score"]) == (1, None, 1)
    assert predictions(b, "b")[0]["score"] == pytest.approx(0.2**2 + 0.3**2 + 2 * 0.05**2)  # fmt: skip
    assert notes == []


def test_what_only_one_file_holds_is_reported_not_dropped():
    a = _result([_mgsm(0, "x", "1", True), _mgsm(1, "y", "2", False)], [_bele(0, [-1.0, -2.0], 0, [0.7, 0.3])])  # fmt: skip
    b = _result([_mgsm(0, "x", "1", True)], [_bele(0, [-1.0, -2.0], 0, [0.7, 0.3])])
    del b["samples"]["b"], b["results"]["b"]["acc,none"]
    rows, notes = compare_items.compare(a, b, ("A.json", "B.json"))
    assert {r["task"] for r in rows} == {"m"}
    assert "task b only in A.json" in notes
    assert any("1 items only in A.json" in n for n in notes)


def test_bad_files_are_named(tmp_path, capsys):
    good = tmp_path / "good.json"
    good.write_text(json.dumps(_result([_mgsm(0, "x", "1", True)], [])))
    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps({"results": {}}))
    for bad, why in ((plain, "no results with per-item samples"), (tmp_path / "missing.json", "not a readable lm-eval JSON")):  # fmt: skip
        with pytest.raises(SystemExit) as e:
            compare_items.main([str(good), str(bad)])
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert bad.name in err and why in err
    with pytest.raises(SystemExit):
        compare_items.main([str(good)])  # pairs only
    assert "files come in pairs" in capsys.readouterr().err


def test_a_real_lm_eval_file_compares_as_a_user_runs_it(tiny_world, tmp_path, run_bench):
    # lm-eval's own JSON (`layerswap eval --out`), not the hand-made files above: the script
    # must read what lm-eval writes today; compared with itself, every item is the same
    out = tmp_path / "eval.json"
    tasks = "world_mgsm_direct_xa_dev,world_belebele_brier_xa_dev"
    # in this process: a `layerswap eval` of its own re-imported torch and lm-eval to write it
    argv = ["eval", str(tiny_world / "base"), "--world", str(tiny_world), "--tasks", tasks, "--limit", "4", "--max-gen-toks", "8", "--device", "cpu", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    run = run_bench("compare_items.py", "a.json", "b.json", links={"a.json": out, "b.json": out})
    rows = [line.split("|")[1:-1] for line in run.stdout.splitlines()[2:] if line.startswith("| a.json")]  # fmt: skip
    assert {r[2].strip() for r in rows} == set(tasks.split(",")), run.tail()
    for r in rows:  # items, same answer, same item score: all 4; largest item difference 0
        assert [r[i].strip() for i in (6, 7, 9, 10)] == ["4", "4", "4", "0.00e+00"], r


def test_a_pair_with_no_task_in_common_exits_1(tmp_path, run_bench):
    a = _result([_mgsm(0, "x", "1", True)], [_bele(0, [-1.0, -2.0], 0, [0.7, 0.3])])
    b = json.loads(json.dumps(a))
    b["samples"] = {"other": b["samples"]["m"]}
    for name, data in (("a.json", a), ("b.json", b)):
        (tmp_path / name).write_text(json.dumps(data))
    run = run_bench("compare_items.py", "a.json", "b.json", expect=1, links={n: tmp_path / n for n in ("a.json", "b.json")})  # fmt: skip
    assert "nothing compared" in run.stderr
