"""The JSON Schemas: the committed copies in docs/schemas/ equal what the models generate, every
shipped example names the schema of its kind on its first line and passes both that kind's
loader and the schema, and the schemas accept the loaders' shorthands and refuse typos.

Run: .venv/bin/python -m pytest -q tests/spaces/test_config_schemas.py
"""

from __future__ import annotations

import re
from pathlib import Path

import jsonschema
import pytest
import yaml

from layerswap.spaces.reference import KINDS, json_schema, schema_text

ROOT = Path(__file__).resolve().parents[2]
SCHEMAS = ROOT / "docs" / "schemas"
EXAMPLES = [*sorted((ROOT / "spaces" / "examples").glob("*.yaml")), ROOT / "spaces" / "throughput.yaml"]  # fmt: skip
MODELINE = re.compile(r"# yaml-language-server: \$schema=(\S+)/(\w+)\.schema\.json")
REGENERATE = "make schemas (or: layerswap schema {kind} --out {path} --overwrite)"


class Yaml12(yaml.SafeLoader):
    """YAML as editors read it (1.2): `3.96e14` is a number, not the string PyYAML makes it."""


Yaml12.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:\d+\.\d*|\.\d+|\d+)[eE][-+]?\d+$"),
    list("-+.0123456789"),
)


@pytest.mark.parametrize("kind", list(KINDS))
def test_committed_schema_is_what_the_models_generate(kind):
    path = SCHEMAS / f"{kind}.schema.json"
    rel = path.relative_to(ROOT)
    assert path.exists(), f"{rel} missing; write it with " + REGENERATE.format(kind=kind, path=rel)
    assert path.read_text(encoding="utf-8") == schema_text(kind), (
        f"{rel} is stale (the models changed); regenerate it with "
        + REGENERATE.format(kind=kind, path=rel)
    )


def test_no_schema_file_without_a_kind():
    assert sorted(p.name for p in SCHEMAS.glob("*.json")) == sorted(
        f"{k}.schema.json" for k in KINDS
    )


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_names_its_schema_and_passes_it(path):
    first, _, rest = path.read_text(encoding="utf-8").partition("\n")
    m = MODELINE.fullmatch(first)
    assert m, f"{path.name}: first line must be '# yaml-language-server: $schema=.../KIND.schema.json'"  # fmt: skip
    kind = m.group(2)
    assert (path.parent / m.group(1)).resolve() == SCHEMAS, f"{path.name}: {first} is not docs/schemas/"  # fmt: skip
    assert kind in KINDS and (SCHEMAS / f"{kind}.schema.json").exists()
    accepted = []
    for k in KINDS.values():  # the kind is the one whose loader takes the file, and only it
        try:
            k.load(path)
            accepted.append(k.name)
        except ValueError:
            pass
    assert accepted == [kind], f"{path.name} names {kind}, loaded by {accepted}"
    assert yaml.safe_load(rest) == yaml.safe_load(first + "\n" + rest)  # the comment is only that
    errors = jsonschema.Draft202012Validator(json_schema(kind)).iter_errors(yaml.load(rest, Yaml12))
    assert not [f"{'/'.join(map(str, e.path))}: {e.message}" for e in errors]


def _valid(kind: str, data: dict) -> bool:
    return jsonschema.Draft202012Validator(json_schema(kind)).is_valid(data)


TRAIN = {
    "name": "t",
    "base": "b",
    "kind": "math",
    "language": "en",
    "datasets": [{"path": "d.jsonl"}],
    "mode": "full",
    "hyper": {"lr": 1e-4, "max_steps": 2},
}


def test_schemas_refuse_what_the_loaders_refuse():
    assert _valid("train", TRAIN)
    assert not _valid("train", TRAIN | {"hyperr": {}})  # a typo is an error, as extra="forbid"
    assert not _valid("train", TRAIN | {"kind": "maths"})
    assert not _valid("train", TRAIN | {"name": "no spaces"})
    assert not _valid("train", {k: v for k, v in TRAIN.items() if k != "hyper"})
    assert not _valid("world", {"seed": 3})  # the command line sets it, a variant cannot
    assert _valid("world", {"model": {"steps": 2000}, "digit_words": True})


def test_schemas_accept_the_loaders_shorthands():
    assert _valid("train", TRAIN | {"mode": "lora", "precision": "bf16-mixed"})
    assert _valid("train", TRAIN | {"mode": {"type": "partial", "partition": "C", "train": "task"}})
    assert not _valid("train", TRAIN | {"mode": "partial"})  # needs a partition: no shorthand
    assert not _valid("train", TRAIN | {"precision": "fp16"})
    swap = {"method": "layer_swap", "task_expert": "m", "language_expert": "l"}
    assert _valid("recipe", swap | {"partition": "A"})
    assert _valid("recipe", swap | {"bottom": 2, "top": 1})
    assert not _valid("recipe", swap)  # neither zones nor a partition
    assert not _valid("recipe", swap | {"partition": "D"})
    assert not _valid("recipe", {"method": "ties", "models": ["m"]})  # ties needs base
