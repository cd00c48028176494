"""World variants (spaces/world.py): overrides of a preset, validated at the edge.

Run `.venv/bin/python -m pytest -q tests/spaces/test_world_config.py`.
"""

from __future__ import annotations

import pytest

from layerswap.spaces.world import load_variant, with_overrides, world_config


def test_nested_override_keeps_the_rest():
    preset = world_config("full", 3)
    v = with_overrides(preset, {"model": {"steps": 2000}, "digit_words": True}, "v.yaml")
    assert v.model.steps == 2000 and v.digit_words
    assert v.model.hidden_size == preset.model.hidden_size and v.corpus == preset.corpus
    assert (v.seed, v.size, v.version) == (3, "full", preset.version)


@pytest.mark.parametrize(
    ("over", "message"),
    [
        ({"model": {"stepz": 1}}, "model.stepz: Extra inputs are not permitted"),
        ({"model": {"steps": 0}}, "model.steps"),
        ({"xa_word_order": "OSV"}, "xa_word_order"),
        ({"seed": 2}, "seed cannot be overridden"),
        ({"version": "9", "size": "tiny"}, "size, version cannot be overridden"),
    ],
)
def test_bad_override_names_the_field(over, message):
    with pytest.raises(ValueError, match=r"v\.yaml") as e:
        with_overrides(world_config("tiny", 0), over, "v.yaml")
    assert message in str(e.value)


def test_load_variant_names_the_file(tmp_path):
    f = tmp_path / "variant.yaml"
    f.write_text("- a list\n")
    with pytest.raises(ValueError, match=f"{f}: expected a mapping"):
        load_variant(f, "tiny", 0)
    f.write_text("count_sentences: true\n")
    assert load_variant(f, "tiny", 0) == with_overrides(world_config("tiny", 0), {"count_sentences": True}, "x")  # fmt: skip
