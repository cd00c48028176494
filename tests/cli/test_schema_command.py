"""`layerswap schema KIND`: prints the kind's JSON Schema, or writes it atomically with --out,
replacing only a schema of its own and only with --overwrite.

Run: .venv/bin/python -m pytest -q tests/cli/test_schema_command.py
"""

from __future__ import annotations

import json

import pytest

from layerswap.cli import main
from layerswap.spaces.reference import KINDS, json_schema, schema_text


@pytest.mark.parametrize("kind", list(KINDS))
def test_prints_the_schema(kind, capsys):
    assert main(["schema", kind]) == 0
    out = capsys.readouterr().out
    assert json.loads(out) == json_schema(kind) and out == schema_text(kind)


def test_writes_and_replaces_only_with_overwrite(tmp_path, capsys):
    out = tmp_path / "sub" / "recipe.schema.json"
    assert main(["schema", "recipe", "--out", str(out)]) == 0
    assert out.read_text(encoding="utf-8") == schema_text("recipe")
    assert main(["schema", "recipe", "--out", str(out)]) == 2
    assert "already exists; pass --overwrite" in capsys.readouterr().err
    out.write_text("{}")  # not a schema of ours any more: refused even with --overwrite
    assert main(["schema", "study", "--out", str(out), "--overwrite"]) == 2
    out.write_text(schema_text("recipe"))
    assert main(["schema", "study", "--out", str(out), "--overwrite"]) == 0
    assert out.read_text(encoding="utf-8") == schema_text("study")
    assert sorted(p.name for p in out.parent.iterdir()) == ["recipe.schema.json"]  # no temp left
