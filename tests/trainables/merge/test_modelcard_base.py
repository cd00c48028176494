"""The merged model's card names its base as `base_model` in the Hugging Face front matter only
when the base is a Hub model id (`owner/name`, not a local folder): the Hub rejects a card whose
base_model is not a model id (https://huggingface.co/docs/hub/model-cards#specifying-a-base-model),
so a local base (`/work/main/runs/demo/world/base`) is said in the card's body instead.

Run: .venv/bin/python -m pytest -q tests/trainables/merge/test_modelcard_base.py
"""

from __future__ import annotations

import pytest
import yaml

from layerswap.spaces.recipe import parse_recipe
from layerswap.trainables.merge.modelcard import model_card


def _card(base: str) -> tuple[dict, str]:
    """(front matter, body) of the card of a layer swap over `base`."""
    swap = {"method": "layer_swap", "task_expert": "org/math", "language_expert": "org/lang"}
    recipe = parse_recipe({**swap, "base": base, "bottom": 1, "top": 1})
    _, front, body = model_card(recipe, 4, "abc123").split("---\n", 2)
    return yaml.safe_load(front), body


def test_a_hub_id_is_the_base_model():
    front, body = _card("meta-llama/Llama-3.1-8B-Instruct")
    assert front["base_model"] == "meta-llama/Llama-3.1-8B-Instruct"
    assert "`meta-llama/Llama-3.1-8B-Instruct`" in body


@pytest.mark.parametrize(
    "base",
    [
        "/work/main/runs/demo/world/base",  # absolute
        "runs/demo/world/base",  # relative
        "./org/model",
        "../org/model",
        "~/models/base",
        "s3://bucket/base",  # a URI
        "file:///work/base",
        "base",  # a bare name: a folder here as likely as a legacy Hub id
        "org/na me",  # not a valid repo id
    ],
)
def test_a_base_that_is_not_a_hub_id_is_said_in_the_body(base):
    front, body = _card(base)
    assert "base_model" not in front
    assert f"- base: `{base}`" in body
    assert yaml.safe_load(yaml.safe_dump(front)) == front  # the front matter still parses


def test_an_existing_local_folder_shaped_like_a_hub_id_is_not_one(tmp_path, monkeypatch):
    (tmp_path / "org" / "model").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    front, body = _card("org/model")
    assert "base_model" not in front
    assert "- base: `org/model`" in body
