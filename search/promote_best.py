"""RUN/best/: the promotion's chosen recipe merged to disk, or kept when best/ already holds it.

A resumed promotion (`search --resume`, `demo --resume`) that chooses the recipe an earlier one
merged would otherwise merge and write the whole model again (minutes and the model's size in
writes for an 8B model). best/ is kept only when the merge engine's marker (`.layerswap.json`,
written last, once every file is in place) names it a merge of this very recipe, by the recipe's
content id taken now (an expert retrained in place gives another id), and every file the marker
lists is there, the full model's config and weights among them. Anything else is merged again.
Run its tests: .venv/bin/python -m pytest -q tests/search/test_promote_resume_cost.py
"""

from __future__ import annotations

from pathlib import Path

import yaml

from layerswap.spaces.recipe import Recipe, parse_recipe
from layerswap.trainables.model_ids import content_recipe_id
from layerswap.trainables.outputs import read_marker


def holds_merge(out: Path, rid: str) -> bool:
    """Whether `out` holds the complete merge of the recipe whose content id is `rid`, written
    as promotion writes it (full weights: a LoRA recipe folded, not an adapter).

    Args:
        out: the folder (RUN/best).
        rid: the recipe's content id, taken now (trainables.model_ids.content_recipe_id).
    """
    m = read_marker(out)
    if m is None or m["kind"] != "merge" or m.get("identity") != rid:
        return False
    files = m.get("files")
    # A marker without its file list is not the merge engine's (output_dir lists every file):
    # what it holds cannot be checked, so it is merged again.
    if not isinstance(files, list) or not all(isinstance(f, str) for f in files):
        return False
    has_weights = any(f.endswith(".safetensors") for f in files)
    return has_weights and "config.json" in files and all((out / f).is_file() for f in files)


def write_best(row: dict, out: Path, progress: bool = False) -> Path:
    """Merge the best recipe to disk (weights, recipe YAML, model card) with the merge engine,
    unless `out` already holds that merge complete (`holds_merge`).

    Args:
        row: the recipe's trials.parquet row (its `recipe_yaml`).
        out: RUN/best.
        progress: say whether best/ was kept or merged.
    Returns:
        `out`.
    """
    recipe: Recipe = parse_recipe(yaml.safe_load(row["recipe_yaml"]))
    rid = content_recipe_id(recipe)
    if holds_merge(out, rid):
        if progress:
            print(f"promotion: best/: kept, recipe {rid} already merged ({out})", flush=True)
        return out
    if progress:
        print(f"promotion: best/: merging recipe {rid} into {out}", flush=True)
    from layerswap.trainables.merge.api import merge  # lazy: torch (~3 s), unneeded when kept

    return merge(recipe, out, overwrite=True, fold=True)  # LoRA experts: full weights too
