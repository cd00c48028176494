"""Rows as the trainer reads them (trainables/train/pairs.py, data.py): a null or NaN prompt or
response is an empty side, dropped and counted (`n_empty` in the manifest's data, a dropped-rows
line), for `path:` and `source:` alike (they were trained as the strings "None" / "nan"); a .json
file of JSON lines (what `datasets`' Dataset.to_json writes) is read as `source:` + `data_files`
reads it; a folder or a .csv is refused saying what is accepted; and a row counts as truncated
only when its answer or its end-of-turn token is cut, not the "\\n" a Qwen2.5-style template
puts after it.

Run: .venv/bin/python -m pytest -q tests/trainables/train/test_data_cells.py   (~5 s)
"""

from __future__ import annotations

import json
import math

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from transformers import AutoTokenizer

from layerswap.spaces.train_experiment import DatasetSpec
from layerswap.trainables.train import find_checkpoints, read_manifest, run_training
from layerswap.trainables.train.data import build_data, load_pairs, seq_len_notes
from layerswap.trainables.train.sft_records import adapt_nllb, resolve_language
from layerswap.trainables.train.sources import load_sft
from tests.trainables.train.train_helpers import make_exp

# Qwen2.5's layout on the tiny world's tokens: the end-of-turn token (</s>) is followed by "\n".
QWENISH = (
    "{% for m in messages %}{% if m['role'] == 'user' %}<|user|>\n{{ m['content'] }}</s>\n"
    "{% else %}<|assistant|>\n{{ m['content'] }}</s>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture()
def null_rows(tmp_path):
    """10 Orca rows, one with a null answer and one with a null question."""
    rows = [{"question": f"What is {i}+1?", "answer": f"It is {i + 1}."} for i in range(10)]
    rows[1]["answer"] = None
    rows[4]["question"] = None
    return _jsonl(tmp_path / "orca.jsonl", rows)


def test_null_cells_are_empty_sides_not_the_string_none(null_rows):
    pairs = load_pairs(DatasetSpec(path=str(null_rows)))
    assert len(pairs) == 8 and all("None" not in p + r for p, r in pairs)
    # the `source:` reader, the same file: the same pairs, the same dropped rows
    counts: dict[str, int] = {}
    recs = load_sft("orca_math", data_files=[str(null_rows)], counts=counts)
    assert [(r["prompt"], r["response"]) for r in recs] == pairs and counts == {"empty": 2}
    swh = resolve_language("swh")
    assert adapt_nllb({"translation": {"eng_Latn": "Hello", "swh_Latn": math.nan}}, swh, "nllb") == []  # fmt: skip


def test_null_and_nan_rows_are_dropped_counted_and_said(tiny_world, tmp_path, null_rows):
    nan = tmp_path / "aya.parquet"
    pq.write_table(pa.table({"inputs": [f"Habari {i}?" for i in range(6)], "targets": [math.nan, 1.0, 2.0, 3.0, 4.0, 5.0]}), nan)  # fmt: skip
    exp = make_exp(tiny_world, "mix", datasets=[{"path": str(null_rows)}, {"path": str(nan)}], hyper={"max_steps": 1, "seq_len": 128, "batch_size": 2})  # fmt: skip
    data = build_data(exp, AutoTokenizer.from_pretrained(tiny_world / "base"))
    assert [(d["n_empty"], d["n_train"] + d["n_val"]) for d in data.info] == [(2, 8), (1, 5)]
    tok = AutoTokenizer.from_pretrained(tiny_world / "base")
    trained = [tok.decode([t for t in y if t != -100]) for s in data.streams for _, y in s.examples]
    assert len(trained) == 11 and not any("None" in t or "nan" in t for t in trained)
    said = "rows dropped (a null, NaN or empty prompt or response)"
    assert seq_len_notes(exp, data) == [
        f"layerswap: data: datasets[0] ({null_rows}): 2 of 10 {said}",
        f"layerswap: data: datasets[1] ({nan}): 1 of 6 {said}",
    ]
    run_training(exp, workdir=tmp_path / "run")  # and each checkpoint's manifest records them
    manifest = read_manifest(find_checkpoints(tmp_path / "run")[-1])
    assert [d["n_empty"] for d in manifest["data"]] == [2, 1]


def test_a_json_file_of_json_lines_reads_as_the_source_reader_reads_it(tmp_path):
    # Dataset.to_json's default: one object a line, under a .json name
    f = _jsonl(tmp_path / "orca_export.json", [{"question": "What is 2+2?", "answer": "4"}, {"question": "What is 3+3?", "answer": "6"}])  # fmt: skip
    want = [("What is 2+2?", "4"), ("What is 3+3?", "6")]
    assert load_pairs(DatasetSpec(path=str(f))) == want
    assert load_pairs(DatasetSpec(source="orca_math", data_files=[str(f)])) == want
    arr = tmp_path / "array.json"
    arr.write_text(json.dumps([{"question": "q", "answer": "a"}]))
    assert load_pairs(DatasetSpec(path=str(arr))) == [("q", "a")]


def test_a_folder_or_a_csv_is_refused_saying_what_is_accepted(tmp_path):
    saved = tmp_path / "orca_saved"  # datasets' save_to_disk layout
    saved.mkdir()
    for name in ("dataset_info.json", "state.json", "data-00000-of-00001.arrow"):
        (saved / name).write_text("{}")
    with pytest.raises(ValueError, match=r"orca_saved is a folder, not a data file \(a `datasets` save_to_disk folder: write it with Dataset.to_json or to_parquet\); a `path:` dataset is one .jsonl/.json/.parquet file"):  # fmt: skip
        load_pairs(DatasetSpec(path=str(saved)))
    csv = tmp_path / "qa.csv"
    csv.write_text("question,answer\nq1,a1\n")
    with pytest.raises(ValueError, match=r"qa.csv: extension .csv is not supported; a `path:` dataset is one .jsonl/.json/.parquet file"):  # fmt: skip
        load_pairs(DatasetSpec(path=str(csv)))


def test_a_row_is_truncated_only_when_its_end_of_turn_token_is_cut(tiny_world, tmp_path):
    tok = AutoTokenizer.from_pretrained(tiny_world / "base")
    tok.chat_template = QWENISH
    f = _jsonl(tmp_path / "rows.jsonl", [{"prompt": "Habari?", "response": "Nzuri sana."}] * 4)
    user = [{"role": "user", "content": "Habari?"}]
    n = len(tok.apply_chat_template([*user, {"role": "assistant", "content": "Nzuri sana."}], return_dict=False))  # fmt: skip
    eot = tok.convert_tokens_to_ids("</s>")
    got = {}
    for cut in (1, 2):  # 1: only the trailing "\n" lost; 2: </s> lost too
        exp = make_exp(tiny_world, datasets=[{"path": str(f)}], hyper={"max_steps": 1, "seq_len": n - cut, "batch_size": 2, "val_share": 0.0})  # fmt: skip
        data = build_data(exp, tok)
        _, labels = data.streams[0].examples[0]
        got[cut] = (data.info[0]["n_truncated"], eot in labels, len(seq_len_notes(exp, data)))
    assert got == {1: (0, True, 0), 2: (4, False, 1)}
