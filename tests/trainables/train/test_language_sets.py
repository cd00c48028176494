"""The math guard, mixing and writing of per-language SFT sets, on small fixtures.

Run: .venv/bin/python -m pytest -q tests/trainables/train/test_language_sets.py (offline).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from layerswap.trainables.train.language_sets import (
    build_language_set,
    looks_like_math,
    mix,
    write_jsonl,
)
from layerswap.trainables.train.sources import load_sft

FIX = Path(__file__).parents[2] / "fixtures" / "datasets"


@pytest.mark.parametrize(
    ("prompt", "response", "math"),
    [
        ("Hesabu: 7 + 5 ni ngapi?", "12", True),
        ("x", "১২ × ৩ = ৩৬", True),  # Bengali digits
        ("Jumla?", "20 - 4 = 16", True),
        ("Evaluate", r"\frac{1}{2}", True),
        ("Solve for x.", "It is seven.", True),
        ("Vita vilidumu 1914-1918.", "Ndiyo, miaka minne.", False),  # a date range
        ("Mji mkuu wa Kenya ni upi?", "Nairobi.", False),
        ("Simu yangu ni 0712 345 678.", "Asante.", False),
    ],
)
def test_looks_like_math(prompt, response, math):
    assert looks_like_math({"prompt": prompt, "response": response}) is math


def _parts():
    return {
        "aya": load_sft("aya", language="swh", data_files=FIX / "aya.jsonl"),
        "nllb": load_sft("nllb", language="swh", data_files=FIX / "nllb_eng_Latn-swh_Latn.jsonl"),
        "inkuba_instruct": load_sft("inkuba_instruct", data_files=FIX / "inkuba_instruct.jsonl"),
        "xp3mt": load_sft("xp3mt", language="swh", data_files=FIX / "xp3mt_sw.jsonl"),
    }


def test_mix_drops_math_and_is_deterministic():
    parts = _parts()
    a = mix(parts, size=8, seed=3, val_share=0.25)
    b = mix(dict(reversed(list(parts.items()))), size=8, seed=3, val_share=0.25)
    assert (a.train, a.validation) == (b.train, b.validation)
    assert a.dropped_math == 1
    assert len(a.train) == 6 and len(a.validation) == 2
    assert not any(looks_like_math(r) for r in a.train + a.validation)
    assert sum(a.per_source.values()) == 8
    others = [mix(parts, size=8, seed=s, val_share=0.25).train for s in range(4, 10)]
    assert any(o != a.train for o in others)


def test_mix_quotas_and_shortfall():
    parts = {"big": [_rec(f"b{i}") for i in range(50)], "small": [_rec(f"s{i}") for i in range(3)]}
    m = mix(parts, size=20, seed=0, val_share=0.0)
    assert m.per_source == {"big": 17, "small": 3}  # small's shortfall goes to big
    m = mix(parts, size=100, seed=0, val_share=0.1)
    assert len(m.train) + len(m.validation) == 53 and len(m.validation) == 5
    m = mix(parts, size=10, seed=0, weights={"big": 3, "small": 1})
    assert m.per_source == {"big": 8, "small": 2}


def test_weights_that_leave_a_source_out_are_refused_naming_it():
    # {"aya": 2.0} meant "double aya's share"; it dropped every other source without a word
    parts = {s: [_rec(f"{s}{i}") for i in range(20)] for s in ("aya", "nllb", "xp3mt")}
    with pytest.raises(ValueError, match=r"no weight for sources \['nllb', 'xp3mt'\]"):
        mix(parts, size=20, seed=0, weights={"aya": 2.0})
    with pytest.raises(ValueError, match=r"finite and >= 0, got \{'nllb': -1\}"):
        mix(parts, size=20, seed=0, weights={"aya": 2.0, "nllb": -1, "xp3mt": 1})
    m = mix(parts, size=20, seed=0, val_share=0.0, weights={"aya": 2.0, "nllb": 1, "xp3mt": 0})
    assert m.per_source == {"aya": 14, "nllb": 6}  # 0 leaves a source out, said so


@pytest.mark.parametrize(
    ("weights", "said"),
    [
        ({"aya": 0.0, "xp3mt": 0}, r"not all be 0.*'aya': 0.0"),  # an empty mix, silently
        ({"aya": "2", "xp3mt": 1}, r"must be numbers, got \{'aya': '2'\}"),  # a TypeError
        ({"aya": True, "xp3mt": 1}, r"must be numbers, got \{'aya': True\}"),  # weighed as 1
    ],
)
def test_weights_that_are_all_zero_or_not_numbers_are_refused_naming_them(weights, said):
    parts = {s: [_rec(f"{s}{i}") for i in range(10)] for s in ("aya", "xp3mt")}
    with pytest.raises(ValueError, match=said):
        mix(parts, size=10, seed=0, val_share=0.0, weights=weights)


def test_mix_drops_duplicates_and_keeps_math_when_asked():
    parts = {"a": [_rec("same"), _rec("2 + 2 = 4")], "b": [_rec("same")]}
    m = mix(parts, size=10, seed=0, val_share=0.0, drop_math=False)
    assert m.dropped_duplicates == 1 and m.dropped_math == 0 and len(m.train) == 2


def _rec(prompt: str) -> dict[str, str]:
    return {"prompt": prompt, "response": "r", "source": "t", "language": "swh"}


def test_write_jsonl_roundtrip(tmp_path):
    recs = load_sft("aya", language="ben", data_files=FIX / "aya.jsonl")
    out = write_jsonl(recs, tmp_path / "sub" / "ben.jsonl")
    back = [json.loads(line) for line in out.read_text().splitlines()]
    assert back == recs
    assert not list(out.parent.glob(".*tmp*"))
    with pytest.raises(ValueError, match="record 0 is not an SFT record"):
        write_jsonl([{"prompt": "p"}], tmp_path / "bad.jsonl")
    assert not (tmp_path / "bad.jsonl").exists()


def test_build_language_set_from_local_files():

    files = {
        "aya": FIX / "aya.jsonl",
        "nllb": FIX / "nllb_eng_Latn-swh_Latn.jsonl",
        "inkuba_instruct": FIX / "inkuba_instruct.jsonl",
        "xp3mt": [FIX / "xp3mt_sw.jsonl", FIX / "xp3mt_sw_flores.jsonl"],
    }
    m = build_language_set("Swahili", size=10, seed=1, val_share=0.2, data_files=files)
    assert m.dropped_math == 1 and len(m.train) == 8 and len(m.validation) == 2
    assert {r["language"] for r in m.train + m.validation} == {"swh"}
    assert set(m.per_source) == set(files)


def test_build_language_set_names_a_bad_file_and_line(tmp_path):
    bad = tmp_path / "inkuba.jsonl"
    bad.write_bytes((FIX / "inkuba_instruct.jsonl").read_bytes() + b"{oops}\n")
    line = bad.read_bytes().count(b"\n")
    files = {"aya": FIX / "aya.jsonl", "inkuba_instruct": bad}
    with pytest.raises(ValueError, match=rf"inkuba\.jsonl:{line}: not valid JSON"):
        build_language_set("Swahili", size=4, seed=1, sources=list(files), data_files=files)
