"""Translate a layer_swap recipe into an equivalent mergekit 0.1.5 `linear` slices config.

Use: `mergekit_yaml(recipe, num_layers)` > merge.yml, then `mergekit-yaml merge.yml OUT_DIR`.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from layerswap.spaces.recipe import ExpertSoup, LayerSwapRecipe, RecipeError, SideWeights
from layerswap.spaces.zones import LayerSource, check_fits, layer_source
from layerswap.trainables.merge.terms import MagnitudeOracle

# mergekit matches a conditional parameter's `filter` as a plain substring of the tensor name
# (mergekit/config.py:evaluate_setting). Every per-layer tensor of the supported families is
# `model.layers.{i}.…`, and no non-layer tensor contains this, whereas a filter such as "norm"
# would also catch every layer's input_layernorm/post_attention_layernorm.
LAYER_FILTER = "layers."


def _reject_unsupported(recipe: LayerSwapRecipe) -> tuple[str, str]:
    """The two expert paths, or RecipeError naming the first feature mergekit cannot express."""
    for field in ("task_expert", "language_expert"):
        if isinstance(getattr(recipe, field), ExpertSoup):
            raise RecipeError(
                f"mergekit export: {field} is a soup; only plain checkpoint paths are supported"
            )
    for comp in ("attention", "mlp"):
        if getattr(recipe, comp) is not None:
            raise RecipeError(
                f"mergekit export: per-component override `{comp}` (partitions) is not supported; "
                "mergekit slices swap whole layers"
            )
    if recipe.revert:
        raise RecipeError("mergekit export: `revert` is not supported")
    task, lang = recipe.task_expert, recipe.language_expert
    if task == lang:
        # A slice may not list one model twice (mergekit/merge_methods/base.py:validate_ids).
        raise RecipeError(
            f"mergekit export: task_expert and language_expert are the same checkpoint {task!r}"
        )
    return task, lang


def _side_weights(
    recipe: LayerSwapRecipe, task: str, lang: str, mav: MagnitudeOracle | None
) -> tuple[float, float]:
    """Unnormalised (w_task, w_language); mergekit's linear divides by their sum."""
    tw = recipe.transition_weights
    if isinstance(tw, SideWeights):
        return tw.task, tw.language
    if mav is None:
        raise RecipeError(
            "mergekit export: transition_weights 'magnitude' needs numbers; pass `mav` "
            "(or give explicit transition_weights {task, language})"
        )
    m_task, m_lang = mav(((task, 1.0),)), mav(((lang, 1.0),))
    if m_task <= 0 or m_lang <= 0:
        raise RecipeError(
            f"mergekit export: magnitude weights undefined (MAV task={m_task}, language={m_lang})"
        )
    return 1.0 / m_task, 1.0 / m_lang


def _model_ref(path: str) -> str | dict:
    # mergekit parses "a+b" as model a with LoRA b and "a@r" as revision r
    # (mergekit/common.py:ModelReference/ModelPath.validate_string); the mapping form is literal.
    if "+" in path or "@" in path:
        return {"model": {"path": path}}
    return path


def _source_dtype(paths: tuple[str, str]) -> str | None:
    """The experts' common `dtype` from their config.json, or None if unknown or mixed."""
    found = set()
    for p in paths:
        try:
            cfg = json.loads((Path(p) / "config.json").read_text())
        except (OSError, ValueError):
            return None
        found.add(cfg.get("dtype") or cfg.get("torch_dtype"))
    return found.pop() if len(found) == 1 and None not in found else None


def _runs(recipe: LayerSwapRecipe, num_layers: int) -> list[tuple[LayerSource, int, int]]:
    """Maximal runs (source, start, end) of consecutive layers with the same source."""
    runs: list[tuple[LayerSource, int, int]] = []
    for i in range(num_layers):
        src = layer_source(recipe.zones, num_layers, i)
        if runs and runs[-1][0] == src:
            runs[-1] = (src, runs[-1][1], i + 1)
        else:
            runs.append((src, i, i + 1))
    return runs


def _sides(src: LayerSource, edge: bool, task: str, lang: str) -> list[tuple[str, int]]:
    """The (expert path, side index: 0 task, 1 language) pairs one slice lists, in order."""
    # mergekit takes pre-layer tensors (embed_tokens) from the first slice's sources and
    # post-layer ones (model.norm, lm_head) from the last slice's, with those slices'
    # parameters (mergekit/plan.py:MergePlanner.plan_module). So both edge slices list both
    # experts, in the same order: plan_module sizes the post-weight inputs by the *first*
    # slice's source count. Inner whole-expert runs read one checkpoint only.
    if edge or src == "transition":
        return [(task, 0), (lang, 1)]
    return [(task, 0)] if src == "task" else [(lang, 1)]


def _source(path: str, start: int, end: int, w_zone: float, w_non_layer: float, edge: bool) -> dict:
    """One slice source: layers [start, end) of `path` at w_zone.

    On an edge slice the source also supplies non-layer tensors, which get w_non_layer.
    """
    weight: float | list[dict] = w_zone
    if edge and w_non_layer != w_zone:
        # First matching condition wins; the catch-all then covers the non-layer tensors.
        weight = [{"filter": LAYER_FILTER, "value": w_zone}, {"value": w_non_layer}]
    return {
        "model": _model_ref(path),
        "layer_range": [start, end],
        "parameters": {"weight": weight},
    }


def _slices(
    recipe: LayerSwapRecipe,
    num_layers: int,
    task: str,
    lang: str,
    transition: tuple[float, float],
) -> list[dict]:
    """One `linear` slice per run of layers with the same zone source.

    `transition` is the unnormalised (w_task, w_language) pair of transition layers, which
    non_layer 'average' also uses.
    """
    zone_weights = {"language": (0.0, 1.0), "task": (1.0, 0.0), "transition": transition}
    non_layer = {"average": transition, "language": (0.0, 1.0), "task": (1.0, 0.0)}[
        recipe.non_layer
    ]

    runs = _runs(recipe, num_layers)
    slices = []
    for k, (src, start, end) in enumerate(runs):
        edge = k == 0 or k == len(runs) - 1
        sources = [
            _source(path, start, end, zone_weights[src][j], non_layer[j], edge)
            for path, j in _sides(src, edge, task, lang)
        ]
        slices.append({"sources": sources})
    return slices


def to_mergekit(
    recipe: LayerSwapRecipe,
    num_layers: int,
    *,
    mav: MagnitudeOracle | None = None,
    dtype: str | None = None,
) -> dict:
    """The mergekit config (as a dict) that builds the same model as a layer_swap recipe.

    One `linear` slice per run of layers with the same zone source. Weights are plain scalars,
    never gradient lists, so the slice position `t` cannot change them.

    Args:
        recipe: a layer_swap recipe with plain expert paths, no attention/mlp overrides, no revert.
        num_layers: the experts' num_hidden_layers.
        mav: magnitude oracle (as in trainables.merge.terms); needed only for transition_weights
            'magnitude', whose weights are then 1/MAV of each expert.
        dtype: mergekit's `dtype` (load and output dtype); default: the experts' config.json
            dtype when both agree, else left out (mergekit then uses the stored dtypes,
            promoting mixed ones).
    Returns:
        A dict that `mergekit.config.MergeConfiguration.model_validate` accepts.
    Raises:
        RecipeError for features mergekit cannot express or zones that do not fit the depth.
    """
    if not isinstance(recipe, LayerSwapRecipe):
        raise RecipeError(f"mergekit export: only layer_swap recipes, got {recipe.method!r}")
    if num_layers < 1:
        raise RecipeError(f"mergekit export: num_layers must be >= 1, got {num_layers}")
    task, lang = _reject_unsupported(recipe)
    check_fits(recipe.zones, num_layers)
    w_task, w_lang = _side_weights(recipe, task, lang, mav)

    config: dict = {
        "merge_method": "linear",
        "slices": _slices(recipe, num_layers, task, lang, (w_task, w_lang)),
        # linear ignores base_model when merging (its input contract has BasePolicy.IGNORED);
        # it only fixes which expert's config.json (and tokenizer) mergekit copies, which would
        # otherwise be whichever comes first out of a set (MergeConfiguration.referenced_models).
        "base_model": _model_ref(lang),
        # Explicit although it is linear's default: the transition weights are not normalised.
        "parameters": {"normalize": True},
    }
    dtype = dtype or _source_dtype((task, lang))
    if dtype is not None:
        config["dtype"] = dtype
    return config


def mergekit_yaml(
    recipe: LayerSwapRecipe,
    num_layers: int,
    *,
    mav: MagnitudeOracle | None = None,
    dtype: str | None = None,
) -> str:
    """`to_mergekit` as YAML text for `mergekit-yaml`.

    Args:
        recipe, num_layers, mav, dtype: as for `to_mergekit`.
    Returns:
        The YAML document.
    """
    config = to_mergekit(recipe, num_layers, mav=mav, dtype=dtype)
    return yaml.safe_dump(config, sort_keys=False)
