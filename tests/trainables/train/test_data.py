"""The trainer's local dataset reader: a bad file is named with its line, in the library and
from `layerswap train` (exit 2, no traceback).

Run: .venv/bin/python -m pytest -q tests/trainables/train/test_data.py
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from layerswap.spaces.train_experiment import DatasetSpec
from layerswap.trainables.train.data import load_pairs

LAYERSWAP = [sys.executable, "-m", "layerswap.cli"]
ROW = b'{"question": "Tom has 2 apples.", "answer": "2"}\n'


@pytest.mark.parametrize(
    "name, data, message",
    [
        (
            "d.jsonl",
            ROW + ROW + b'{"question": "x" "answer": "y"}\n',
            r"d\.jsonl:3: not valid JSON \(Expecting ',' delimiter at column 18\)",
        ),
        (
            "d.jsonl",
            ROW + b'{"question": "\xfe", "answer": "1"}\n',
            r"d\.jsonl:2: not UTF-8 text \(byte 0xfe at offset 63\)",
        ),
        (
            "d.jsonl",
            ROW + b'"just a string"\n',
            r"d\.jsonl:2: expected a JSON object, got a JSON string",
        ),
        ("d.jsonl", ROW + b'{"q": "x"}\n', r"d\.jsonl:2: row has none of prompt/response"),
        (
            "d.json",
            b'[\n {"question": "a", "answer": "b"},\n {"question": ]\n',
            r"d\.json:3: not valid JSON",
        ),
        ("d.json", b'[{"question": "a", "answer": "b"}, 3]', r"d\.json: row 2 is not an object"),
        ("d.parquet", b"not parquet", r"d\.parquet: not a readable Parquet file"),
    ],
)
def test_bad_local_dataset_is_named_with_its_line(tmp_path, name, data, message):
    (tmp_path / name).write_bytes(data)
    with pytest.raises(ValueError, match=message):
        load_pairs(DatasetSpec(path=str(tmp_path / name)))


def test_good_rows_load_skipping_blank_lines(tmp_path):
    (tmp_path / "d.jsonl").write_bytes(ROW + b"\n" + ROW.replace(b"2", b"3"))
    assert load_pairs(DatasetSpec(path=str(tmp_path / "d.jsonl"))) == [
        ("Tom has 2 apples.", "2"),
        ("Tom has 3 apples.", "3"),
    ]


def test_cli_train_exits_2_naming_file_and_line(tiny_world, tmp_path):
    (tmp_path / "data.jsonl").write_bytes(ROW * 16 + b'{"question": \n')
    exp = {
        "name": "bad_data",
        "base": str(tiny_world / "base"),
        "kind": "math",
        "language": "en",
        "datasets": [{"path": str(tmp_path / "data.jsonl")}],
        "mode": "full",
        "hyper": {"lr": 1e-4, "max_steps": 1, "batch_size": 2, "seq_len": 32},
        "scaling": {"num_workers": 1, "use_gpu": False},
        "storage_path": str(tmp_path / "runs"),
    }
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(exp))
    run = subprocess.run(
        [*LAYERSWAP, "train", "exp.yaml", "--no-ray"], cwd=tmp_path, capture_output=True, text=True
    )
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr
    assert f"layerswap: error: {tmp_path / 'data.jsonl'}:17: not valid JSON" in run.stderr
