"""The shared readers: bad YAML and JSON-lines files are named with their line, never a traceback;
and the config base's finite-number rule (every float field, unless it opts out).

Run: .venv/bin/python -m pytest -q tests/spaces/test_base.py
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import Field

from layerswap.spaces.base import (
    MayBeNonFinite,
    StrictModel,
    load_json,
    load_yaml,
    read_jsonl,
    validate,
)
from layerswap.spaces.reference import config_models

LAYERSWAP = Path(sys.executable).parent / "layerswap"


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


@pytest.mark.parametrize(
    "data, message",
    [
        (b"name: x\nbase: \xff\n", r"x\.yaml: not UTF-8 text \(byte 0xff at offset 14\)"),
        (b"name: x\n  base: y\n", r"x\.yaml:2:7: not valid YAML \(mapping values are not allowed"),
        (b"name: [unclosed", r"x\.yaml:1:16: not valid YAML \(while parsing a flow sequence"),
        (b'name: x\nbase: "a\x07"\n', r"x\.yaml:2: not valid YAML \(.*#x0007\)"),
        (
            b"search:\n  num_samples: 2\n  seed: 0\n  num_samples: 500\n",
            r"x\.yaml:4:3: not valid YAML \(key 'num_samples' given twice \(first on line 2\)\)",
        ),
    ],
)
def test_bad_yaml_names_file_and_line(tmp_path, data, message):
    with pytest.raises(ValueError, match=message):
        load_yaml(_write(tmp_path / "x.yaml", data), "experiment")


def test_yaml_merge_keys_may_still_be_overridden(tmp_path):
    f = _write(tmp_path / "x.yaml", b"a: &d {lr: 1, steps: 2}\nb:\n  <<: *d\n  lr: 5\n")
    assert load_yaml(f, "experiment") == {"a": {"lr": 1, "steps": 2}, "b": {"lr": 5, "steps": 2}}


def test_pipes_and_devices_are_read_safely(tmp_path):
    """From outside, in subprocesses that must end: a FIFO nobody writes hung the command until
    killed and /dev/zero filled its memory; a pipe with a writer (`<(...)`) is read as a file."""
    fifo = tmp_path / "recipe.yaml"
    os.mkfifo(fifo)

    def run(path: str, **kw) -> subprocess.CompletedProcess:
        code = f"from layerswap.spaces.base import load_yaml; print(load_yaml({path!r}, 'recipe'))"
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, **kw)  # fmt: skip

    assert run(str(fifo)).stdout == "None\n"  # nothing written: empty, at once
    assert "/dev/zero: cannot read recipe: not a file (more than 64 MiB" in run("/dev/zero").stderr
    r, w = os.pipe()
    os.write(w, b"name: x\n")
    os.close(w)
    try:
        assert run(f"/dev/fd/{r}", pass_fds=(r,)).stdout == "{'name': 'x'}\n"
    finally:
        os.close(r)


def test_yaml_is_utf8_whatever_the_locale(tmp_path):
    f = _write(tmp_path / "x.yaml", "\ufeffname: Kiswahili — ñ\n".encode())
    assert load_yaml(f, "experiment") == {"name": "Kiswahili — ñ"}


@pytest.mark.parametrize(
    "data, message",
    [
        (b'{"a": 1}\n\n{"a": \n', r"data\.jsonl:3: not valid JSON \(Expecting value at column 7\)"),
        (b'{"a": 1}\n{"a": "\xff"}\n', r"data\.jsonl:2: not UTF-8 text \(byte 0xff at offset 16\)"),
        (b'{"a": 1}\n[1, 2]\n', r"data\.jsonl:2: expected a JSON object, got a JSON array"),
    ],
)
def test_bad_jsonl_names_file_and_line(tmp_path, data, message):
    with pytest.raises(ValueError, match=message):
        read_jsonl(_write(tmp_path / "data.jsonl", data))


def test_jsonl_rows_skip_blank_lines_and_a_bom(tmp_path):
    f = _write(tmp_path / "data.jsonl", '\ufeff{"a": "x\u2028y"}\n\n  \n{"a": 2}'.encode())
    assert read_jsonl(f) == [{"a": "x\u2028y"}, {"a": 2}]
    with pytest.raises(ValueError, match=r"missing\.jsonl: cannot read"):
        read_jsonl(tmp_path / "missing.jsonl")


def test_bad_json_document_names_its_line(tmp_path):
    f = _write(tmp_path / "rows.json", b'[\n {"a": 1},\n {"a": }\n]\n')
    with pytest.raises(ValueError, match=r"rows\.json:3: not valid JSON \(Expecting value"):
        load_json(f, "dataset")


@pytest.mark.parametrize(
    "data, message",
    [
        (b"name: x\nbase: \xff\n", "bad.yaml: not UTF-8 text (byte 0xff at offset 14)"),
        (b"name: x\n  base: y\n", "bad.yaml:2:7: not valid YAML"),
    ],
)
def test_cli_exits_2_naming_the_file(tmp_path, data, message):
    _write(tmp_path / "bad.yaml", data)
    run = subprocess.run(
        [str(LAYERSWAP), "train", "bad.yaml"], cwd=tmp_path, capture_output=True, text=True
    )
    assert run.returncode == 2, run.stderr
    assert "Traceback" not in run.stderr
    assert f"layerswap: error: {message}" in run.stderr


# ---------------------------------------------------------------- finite numbers (issue 41)


class _Sketch(StrictModel):
    rate: float = Field(1.0, gt=0)
    """A float with a range."""
    span: int | float = 0
    """A union with a float member."""
    weights: tuple[float, ...] = ()
    """Floats in a list."""
    limit: MayBeNonFinite = 0.0
    """The opt-out: Inf means no limit."""


@pytest.mark.parametrize(
    "data, line",
    [
        ({"rate": float("nan")}, "  rate: must be a finite number, got nan"),  # before gt=0
        ({"rate": "-inf"}, "  rate: must be a finite number, got '-inf'"),
        (
            {"span": float("inf")},
            "  span: must be a finite number, got inf",
        ),  # once, not per member
        ({"weights": [1.0, float("nan")]}, "  weights.1: must be a finite number, got nan"),
    ],
)
def test_every_float_field_is_finite(data, line):
    with pytest.raises(ValueError) as e:
        validate(_Sketch, data, source="x.yaml", what="sketch")
    assert str(e.value).splitlines()[1:] == [line]


def test_a_field_may_opt_out_of_the_finite_rule():
    assert _Sketch(limit=float("inf")).limit == float("inf")


def test_every_config_model_has_the_finite_rule():
    # A model that set its own config without the rule would be caught here (pydantic merges
    # a subclass's model_config over StrictModel's, so only an explicit True turns it off).
    assert all(m.model_config.get("allow_inf_nan") is False for m in config_models())


@pytest.mark.parametrize(
    "ref, hub",
    [
        ("meta-llama/Llama-3.1-8B", True),
        ("Qwen/Qwen2.5-7B-Instruct", True),
        ("llama", False),  # a bare name is as likely a folder
        ("./org/model", False),
        ("/abs/model", False),
        ("~/org", False),
        ("s3://bucket/model", False),
        ("org/two words", False),  # not a valid repo id
        ("runs/base", False),  # made on disk below: a folder here is that folder
    ],
)
def test_is_hub_id_is_one_rule(ref, hub, tmp_path, monkeypatch):
    from layerswap.spaces.base import is_hub_id

    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs" / "base").mkdir(parents=True)
    assert is_hub_id(ref) is hub


def test_same_model_resolves_local_spellings_only(tmp_path):
    from layerswap.spaces.base import same_model

    (tmp_path / "base").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "base")
    assert same_model(str(tmp_path / "base"), str(tmp_path / "link"))
    assert same_model(str(tmp_path / "base"), str(tmp_path / "x" / ".." / "base"))
    # a bucket's copy of a local base (uploaded under its name) is the same model
    assert same_model("s3://b/base", str(tmp_path / "base"))
    assert not same_model("s3://b/other", str(tmp_path / "base"))
    assert not same_model("s3://b/base", "s3://c/base") and not same_model("s3://b/base", "org/base")  # fmt: skip
    assert same_model("org/m", "org/m") and not same_model("org/m", "org/n")
    # A Hub id and a local copy of it: the HF cache's folder, or a folder named after the repo
    copy = tmp_path / "models" / "Qwen2.5-7B-Instruct"
    cached = tmp_path / "hf" / "models--Qwen--Qwen2.5-7B-Instruct" / "snapshots" / "abc123"
    for folder in (copy, cached):
        folder.mkdir(parents=True)
        assert same_model("Qwen/Qwen2.5-7B-Instruct", str(folder))
        assert same_model(str(folder), "Qwen/Qwen2.5-7B-Instruct")
    assert not same_model("Qwen/Qwen2.5-7B-Instruct", str(tmp_path / "base"))
    assert not same_model("meta-llama/Llama-3.1-8B", str(copy))
