"""SFT source adapters and loader, on small fixtures in each source's schema.

Run: .venv/bin/python -m pytest -q tests/trainables/train/test_sources.py (offline; conftest sets it).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from layerswap.trainables.train.sft_records import DataSourceError
from layerswap.trainables.train.sources import (
    LANGUAGE_SOURCES,
    SOURCES,
    get_source,
    load_sft,
)

FIX = Path(__file__).parents[2] / "fixtures" / "datasets"
# The SFT dataset tables of both papers, excerpted verbatim with their citations (ICLR 2025 layer
# swapping, appendix A.1 Table 3; the follow-up, appendix A.6).
PAPER_TABLES = Path(__file__).parents[2] / "fixtures" / "papers" / "sft_datasets.txt"
HUB_URL = re.compile(r"huggingface\.co/datasets/([\w.-]+/[\w.-]+)")

# Hub ids named in the follow-up's appendix A.6 and the ICLR paper's appendix A.1 (SFT data).
PAPER_HUB_IDS = {
    "microsoft/orca-math-word-problems-200k",
    "CohereForAI/aya_dataset",
    "allenai/nllb",
    "ai4bharat/indic-align",
    "lumatic-ai/BongChat-v1-253k",
    "lelapa/Inkuba-instruct",
    "bigscience/xP3mt",
    "izumi-lab/llm-japanese-dataset",
    "p1atdev/ichikara-instruction",  # printed "platdev" in the paper
    "kunishou/databricks-dolly-15k-ja",
}

# (source, language, fixture, expected (prompt, response) of the first record, record count)
CASES = [
    ("orca_math", None, "orca_math.jsonl", ("A farmer has 12 goats", "The farmer had 12"), 3),
    ("aya", "swh", "aya.jsonl", ("Mji mkuu wa Kenya ni upi?", "Mji mkuu wa Kenya"), 3),
    ("aya", "ben", "aya.jsonl", ("বাংলাদেশের রাজধানী কোথায়?", "বাংলাদেশের রাজধানী ঢাকা।"), 1),
    ("nllb", "swh", "nllb_eng_Latn-swh_Latn.jsonl", ("Translate the following English", "Soko"), 4),
    ("telugu_alpaca", None, "telugu_alpaca.csv", ("ఆరోగ్యంగా", "బాగా తినండి"), 2),
    ("telugu_gpteacher", None, "telugu_alpaca.csv", ("ఆరోగ్యంగా", "బాగా తినండి"), 2),
    ("indic_sharellama", "ben", "indic_sharellama.jsonl", ("নদী কী?", "নদী হলো"), 2),
    ("indic_sharellama", "tel", "indic_sharellama.jsonl", ("నది అంటే ఏమిటి?", "నది అనేది"), 2),
    ("bongchat", None, "bongchat.jsonl", ("একটি ছোট কবিতা লেখো।", "আকাশ নীল"), 2),
    ("inkuba_instruct", None, "inkuba_instruct.jsonl", ("Tambua hisia", "chanya"), 2),
    ("xp3mt", "swh", "xp3mt_sw.jsonl", ("Sentensi 1: Paka amelala.", "Ndiyo"), 2),
    ("llm_japanese", None, "llm_japanese.jsonl", ("次の単語の意味", "木の葉の間"), 1),
    ("ichikara", None, "ichikara.jsonl", ("日本の有名な山", "富士山です。"), 1),
    ("dolly_ja", None, "dolly_ja.jsonl", ("俳句とは何ですか?", "五・七・五"), 2),
]


@pytest.mark.parametrize(("source", "language", "fixture", "first", "count"), CASES)
def test_adapter_on_fixture(source, language, fixture, first, count):
    recs = load_sft(source, language=language, data_files=FIX / fixture)
    assert len(recs) == count
    for r in recs:
        assert set(r) == {"prompt", "response", "source", "language"}
        assert r["prompt"] and r["response"] and r["source"] == source
        assert r["language"] in get_source(source).languages
    assert recs[0]["prompt"].startswith(first[0])
    assert recs[0]["response"].startswith(first[1])


def test_every_source_has_a_fixture_case():
    assert {c[0] for c in CASES} == set(SOURCES)


def test_alpaca_input_is_appended_to_instruction():
    recs = load_sft("bongchat", data_files=FIX / "bongchat.jsonl")
    assert recs[0]["prompt"] == "একটি ছোট কবিতা লেখো।"  # empty input: no trailing blank lines
    assert recs[1]["prompt"] == "নিচের বাক্যটির সারাংশ দাও।\n\nআজ সকালে বৃষ্টি হয়েছে এবং রাস্তা ভিজে গেছে।"


def test_nllb_gives_both_directions():
    recs = load_sft("nllb", language="sw", data_files=FIX / "nllb_eng_Latn-swh_Latn.jsonl")
    assert recs[0]["prompt"].endswith("into Swahili.\n\nThe market opens early in the morning.")
    assert recs[0]["response"] == "Soko hufunguliwa asubuhi na mapema."
    assert recs[1]["prompt"].endswith("into English.\n\nSoko hufunguliwa asubuhi na mapema.")
    assert recs[1]["response"] == "The market opens early in the morning."
    assert {r["language"] for r in recs} == {"swh"}


def test_indic_align_takes_first_turn_only():
    recs = load_sft(
        "indic_sharellama", language="bengali", data_files=FIX / "indic_sharellama.jsonl"
    )
    assert [r["response"] for r in recs] == ["নদী হলো প্রাকৃতিক জলধারা।", "রবীন্দ্রনাথ ঠাকুর।"]


def test_xp3mt_skips_flores_files():
    files = [FIX / "xp3mt_sw.jsonl", FIX / "xp3mt_sw_flores.jsonl"]
    recs = load_sft("xp3mt", language="swh", data_files=files)
    assert all("Habari za asubuhi" not in r["prompt"] for r in recs)
    assert len(recs) == 2


def test_parquet_and_limit(tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    pa = pytest.importorskip("pyarrow")
    rows = [json.loads(line) for line in (FIX / "orca_math.jsonl").read_text().splitlines()]
    path = tmp_path / "orca.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    recs = load_sft("microsoft/orca-math-word-problems-200k", data_files=path, limit=2)
    assert [r["prompt"] for r in recs] == [r["question"] for r in rows[:2]]


def test_registry_covers_papers():
    hub_ids = {s.hub_id for s in SOURCES.values()}
    assert hub_ids >= PAPER_HUB_IDS
    for lang, names in LANGUAGE_SOURCES.items():
        for n in names:
            assert lang in SOURCES[n].languages, (lang, n)
    assert all(s.schema.split(":")[0] for s in SOURCES.values())


def test_registry_covers_every_hub_dataset_url_in_the_papers():
    text = PAPER_TABLES.read_text(encoding="utf-8")
    followup = text[text.index("== [2] A.6 SFT Datasets") :]
    assert HUB_URL.findall(followup), "the follow-up's appendix A.6 table is missing"
    aliases = {"platdev/ichikara-instruction": "p1atdev/ichikara-instruction"}
    named = {aliases.get(n, n) for n in HUB_URL.findall(text)}
    assert named == PAPER_HUB_IDS  # the list above is exactly what the two tables name
    hub_ids = {s.hub_id.lower() for s in SOURCES.values()}
    assert {n.lower() for n in named} <= hub_ids


def test_unknown_source_lists_known():
    with pytest.raises(DataSourceError, match=r"unknown source 'alpaca'.*orca_math.*aya"):
        load_sft("alpaca", data_files=FIX / "aya.jsonl")


def test_missing_column_names_column_and_file():
    with pytest.raises(DataSourceError, match=r"column 'question' missing from .*bongchat\.jsonl"):
        load_sft("orca_math", data_files=FIX / "bongchat.jsonl")


def test_language_filter_matching_nothing():
    with pytest.raises(DataSourceError, match=r"jpn \(Japanese\) matched no row.*Swahili \(3\)"):
        load_sft("aya", language="jpn", data_files=FIX / "aya.jsonl")


def test_language_errors():
    with pytest.raises(DataSourceError, match="serves ben, tel, swh, jpn; pass language="):
        load_sft("aya", data_files=FIX / "aya.jsonl")
    with pytest.raises(DataSourceError, match="unknown language 'klingon'"):
        load_sft("aya", language="klingon", data_files=FIX / "aya.jsonl")
    with pytest.raises(DataSourceError, match=r"bongchat: no Swahili \(swh\) data"):
        load_sft("bongchat", language="swh", data_files=FIX / "bongchat.jsonl")


def test_nllb_hub_path_explains_script_problem():
    with pytest.raises(DataSourceError, match="loading script"):
        load_sft("nllb", language="swh")


def test_bad_data_files():
    with pytest.raises(DataSourceError, match="does not exist"):
        load_sft("orca_math", data_files=FIX / "nope.jsonl")
    with pytest.raises(DataSourceError, match="must all be one of"):
        load_sft("orca_math", data_files=[FIX / "orca_math.jsonl", FIX / "telugu_alpaca.csv"])


@pytest.mark.parametrize(
    "name, data, message",
    [
        (
            "orca.jsonl",
            b'{"question": "a", "answer": "b"}\n{"question": \n',
            r"orca\.jsonl:2: not valid JSON \(Expecting value",
        ),
        (
            "orca.jsonl",
            b'{"question": "a", "answer": "b\xff"}\n',
            r"orca\.jsonl:1: not UTF-8 text \(byte 0xff at offset 30\)",
        ),
        (
            "orca.json",
            b'[\n {"question": "a", "answer": "b"},\n {"question": }\n]\n',
            r"orca\.json:3: not valid JSON",
        ),
        (
            "orca.json",
            b'{"question": "a", "answer": "b"}\n{"question": "c" "answer": "d"}\n',
            r"orca\.json:2: not valid JSON",
        ),
    ],
    ids=["jsonl-syntax", "jsonl-not-utf8", "json-array-syntax", "json-lines-syntax"],
)
def test_unreadable_local_file_is_named_with_its_line(tmp_path, name, data, message):
    (tmp_path / name).write_bytes(data)
    with pytest.raises(DataSourceError, match=message + r".*\(source orca_math\)"):
        load_sft("orca_math", data_files=tmp_path / name)


def test_csv_that_is_not_utf8_is_named_with_its_line(tmp_path):
    good = (FIX / "telugu_alpaca.csv").read_bytes()
    (tmp_path / "tel.csv").write_bytes(good + b"a,b,c,\xe9,,x,y,,z\n")
    line = good.count(b"\n") + 1
    with pytest.raises(DataSourceError, match=rf"tel\.csv:{line}: not UTF-8 text \(byte 0xe9"):
        load_sft("telugu_alpaca", data_files=tmp_path / "tel.csv")
