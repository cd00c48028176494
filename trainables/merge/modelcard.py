"""Model cards (README.md) for merged models: what was merged, how, and how to rebuild it.

`model_card(recipe, num_layers, rid)` -> Markdown with Hugging Face front matter. Tests:
.venv/bin/python -m pytest -q tests/trainables/merge/test_modelcard_base.py
"""

from __future__ import annotations

import yaml

from layerswap.spaces.base import is_hub_id
from layerswap.spaces.recipe import ExpertSoup, LayerSwapRecipe, Recipe, recipe_dict
from layerswap.spaces.zones import layer_map


def _ref(ref) -> str:
    return ref if isinstance(ref, str) else " + ".join(ref.soup) + f" (soup, {ref.weights})"


def model_card(recipe: Recipe, num_layers: int, rid: str) -> str:
    """A Hugging Face model card with YAML front matter and the recipe.

    Args:
        recipe: the recipe the model was built from.
        num_layers: depth, for the layer-by-layer source table of a layer swap.
        rid: the recipe's content id (trainables.model_ids.content_recipe_id).
    Returns:
        Markdown text.
    """
    front = {"library_name": "transformers", "tags": ["merge", "layerswap", recipe.method]}
    if recipe.base is not None and is_hub_id(recipe.base):
        front["base_model"] = recipe.base
    lines = ["---", yaml.safe_dump(front, sort_keys=False).strip(), "---", ""]
    lines += [f"# layerswap merge `{rid}`", "", f"Method: `{recipe.method}`.", ""]
    if recipe.base is not None:  # a local base is named here only (see is_hub_id)
        lines += [f"- base: `{recipe.base}`"]
    if isinstance(recipe, LayerSwapRecipe):
        lines += [
            f"- task expert: `{_ref(recipe.task_expert)}`",
            f"- language expert: `{_ref(recipe.language_expert)}`",
            f"- non-layer tensors: {recipe.non_layer}; transition weights: "
            f"{recipe.transition_weights if isinstance(recipe.transition_weights, str) else recipe.transition_weights.model_dump()}",
            "",
            "| layer | attention | mlp |",
            "|---|---|---|",
        ]
        owner = layer_map(recipe, num_layers)
        lines += [
            f"| {i} | {owner['attention'][i]} | {owner['mlp'][i]} |" for i in range(num_layers)
        ]
        lines.append("")
    elif not isinstance(recipe, ExpertSoup):
        lines += [f"- models: {', '.join(f'`{m}`' for m in recipe.models)}", ""]
    if recipe.revert:
        lines += ["Reverted to base after merging: see `revert` in the recipe.", ""]
    lines += [
        "## Recipe",
        "",
        "```yaml",
        yaml.safe_dump(recipe_dict(recipe), sort_keys=False).strip(),
        "```",
        "",
        "Rebuild: `layerswap merge layerswap_recipe.yaml --out DIR`.",
        "",
    ]
    return "\n".join(lines)
