"""Schemas of the embedded world's datasets: exactly the real datasets' fields and types.

Run `.venv/bin/python -m pytest -q tests/world/test_world_schemas.py`.
"""

from __future__ import annotations

import json
import re
from collections import Counter

import pytest

LANGS = ("en", "xa", "xb")
MGSM_KEYS = {"question", "answer", "answer_number", "equation_solution"}
BELE_KEYS = {"flores_passage", "question", "correct_answer_num"} | {
    f"mc_answer{i}" for i in range(1, 5)
}


def test_math_sft_is_orca_schema(tiny_world, jsonl):
    rows = jsonl(tiny_world / "data/sft/math_en.jsonl")
    assert len(rows) == 120
    for r in rows:
        assert set(r) == {"question", "answer"}
        assert isinstance(r["question"], str) and isinstance(r["answer"], str)
        assert re.search(r"\d+$", r["answer"]), r["answer"]  # ends with the number


@pytest.mark.parametrize("code", ["xa", "xb"])
def test_lang_sft_is_aya_schema_without_numbers(tiny_world, jsonl, code):
    rows = jsonl(tiny_world / f"data/sft/lang_{code}.jsonl")
    assert len(rows) == 120
    names = {"xa": "Xa", "xb": "Xb"}
    for r in rows:
        assert set(r) == {"inputs", "targets", "language"}
        assert all(isinstance(v, str) and v for v in r.values())
        assert r["language"] == names[code]
        # no math at all: no digits, no arithmetic operators
        assert not re.search(r"[0-9+*/=]", r["inputs"] + r["targets"]), r
    # several task types: the instruction's first word differs across rows
    assert len({r["inputs"].split(":")[0] for r in rows}) >= 5


def test_mgsm_schema_and_splits(tiny_world, jsonl):
    splits = {c: {s: jsonl(tiny_world / f"data/mgsm/{c}/{s}.jsonl") for s in ("train", "dev", "test")} for c in LANGS}  # fmt: skip
    for code in LANGS:
        train, dev, test = (splits[code][s] for s in ("train", "dev", "test"))
        assert len(train) == 8
        for r in train:
            assert set(r) == MGSM_KEYS
            assert isinstance(r["answer"], str) and isinstance(r["equation_solution"], str)
            assert type(r["answer_number"]) is int
            assert r["answer"].rstrip(".").endswith(str(r["answer_number"]))
        for r in dev + test:
            assert set(r) == MGSM_KEYS
            assert r["answer"] is None and r["equation_solution"] is None
            assert type(r["answer_number"]) is int
        qs = [{r["question"] for r in s} for s in (train, dev, test)]
        assert not (qs[0] & qs[1]) and not (qs[0] & qs[2]) and not (qs[1] & qs[2])
        assert len(qs[1]) == len(dev) and len(qs[2]) == len(test)
    # the same problems across languages: same answers, same numbers in the text, other words
    for split in ("train", "dev", "test"):
        en = splits["en"][split]
        for code in ("xa", "xb"):
            other = splits[code][split]
            assert [r["answer_number"] for r in other] == [r["answer_number"] for r in en]
            for a, b in zip(en, other, strict=True):
                assert sorted(re.findall(r"\d+", a["question"])) == sorted(
                    re.findall(r"\d+", b["question"])
                )
                assert a["question"] != b["question"]


def test_mgsm_eval_items_not_in_sft_or_corpus(tiny_world, jsonl):
    sft = {r["question"] for r in jsonl(tiny_world / "data/sft/math_en.jsonl")}
    corpus = (tiny_world / "corpus/pretrain.txt").read_text(encoding="utf-8")
    for split in ("dev", "test"):
        for code in LANGS:
            for r in jsonl(tiny_world / f"data/mgsm/{code}/{split}.jsonl"):
                assert r["question"] not in sft
                assert json.dumps(r["question"], ensure_ascii=False)[1:-1] not in corpus


def test_belebele_schema_balance_and_parallel(tiny_world, jsonl):
    by_lang = {c: {s: jsonl(tiny_world / f"data/belebele/{c}/{s}.jsonl") for s in ("dev", "test")} for c in LANGS}  # fmt: skip
    for code in LANGS:
        dev, test = by_lang[code]["dev"], by_lang[code]["test"]
        assert len(dev) == 20 and len(test) == 20
        for r in dev + test:
            assert set(r) == BELE_KEYS
            assert all(isinstance(v, str) and v for v in r.values())
            assert r["correct_answer_num"] in {"1", "2", "3", "4"}
            assert len({r[f"mc_answer{i}"] for i in range(1, 5)}) == 4
        for rows in (dev, test):
            counts = Counter(r["correct_answer_num"] for r in rows)
            assert max(counts.values()) - min(counts.values()) <= 1, counts
        assert not {r["flores_passage"] + r["question"] for r in dev} & {
            r["flores_passage"] + r["question"] for r in test
        }
    for split in ("dev", "test"):
        en = [r["correct_answer_num"] for r in by_lang["en"][split]]
        assert [r["correct_answer_num"] for r in by_lang["xa"][split]] == en
        assert [r["correct_answer_num"] for r in by_lang["xb"][split]] == en


def test_manifest(tiny_world):
    m = json.loads((tiny_world / "world.json").read_text())
    assert m["seed"] == 0 and m["size"] == "tiny"
    langs = m["languages"]
    assert set(langs) == set(LANGS)
    assert langs["xa"]["corpus_docs_share"] > 3 * langs["xb"]["corpus_docs_share"]
    files = {p.relative_to(tiny_world).as_posix() for p in tiny_world.rglob("*") if p.is_file()}
    assert set(m["sha256"]) == files - {"world.json", ".layerswap.json"}  # marker: not content
    assert m["counts"]["data/mgsm/xa/train.jsonl"] == 8
    assert m["model_config"]["model_type"] == "llama"


@pytest.mark.parametrize("code", ["xa", "xb"])
def test_belebele_eval_items_not_in_lang_sft(tiny_world, jsonl, code):
    sft = "\n".join(r["inputs"] for r in jsonl(tiny_world / f"data/sft/lang_{code}.jsonl"))
    assert "\nA: " in sft  # belebele-layout multiple-choice reading is one of the task types
    for split in ("dev", "test"):
        for r in jsonl(tiny_world / f"data/belebele/{code}/{split}.jsonl"):
            assert f"{r['flores_passage']}\nQ: {r['question']}" not in sft


def test_read_rows_names_file_and_line(tiny_world, tmp_path):
    from layerswap.world.sft import read_rows

    (tmp_path / "data").mkdir()
    good = (tiny_world / "data/mgsm/xa/dev.jsonl").read_bytes()
    (tmp_path / "data/dev.jsonl").write_bytes(good + b'{"question": \n')
    line = good.count(b"\n") + 1
    with pytest.raises(ValueError, match=rf"dev\.jsonl:{line}: not valid JSON \(Expecting value"):
        read_rows(tmp_path, "data/dev.jsonl")
    assert len(read_rows(tiny_world, "data/mgsm/xa/dev.jsonl")) == line - 1
