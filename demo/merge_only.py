"""`layerswap demo --merge-only`: one layer swap, end to end, on a tiny model family made here.

Runs on CPU in seconds: generate base + two experts, write a recipe, merge to disk, reload the
merged model with transformers, check every layer's source, generate a few tokens; all of it in a
hidden sibling of --out, renamed into place at the end. Run: layerswap demo --merge-only --out DIR
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from layerswap.spaces.recipe import Recipe, dump_recipe, load_recipe, parse_recipe
from layerswap.spaces.zones import layer_map, paper_default
from layerswap.trainables.atomic import output_path
from layerswap.trainables.merge.checkpoint import Checkpoint
from layerswap.trainables.merge.engine import merge_to_disk
from layerswap.trainables.model_ids import content_recipe_id
from layerswap.trainables.outputs import check_output, output_dir
from layerswap.world.tiny import make_tiny_family

NUM_LAYERS = 12


def _layer_sources(merged: Path, paths: dict[str, Path], num_layers: int) -> list[str]:
    """Which expert each merged layer is bit-identical to (or 'mixed'), read back from disk."""
    cks = {k: Checkpoint.open(p) for k, p in paths.items()}
    out = Checkpoint.open(merged)
    result = []
    for i in range(num_layers):
        names = [n for n in out.tensors if f"layers.{i}." in n]
        same = [
            k
            for k in ("language", "task")
            if all(torch.equal(out.read(n), cks[k].read(n)) for n in names)
        ]
        result.append(same[0] if same else "mixed")
    for ck in (*cks.values(), out):
        ck.close()
    return result


def run_merge_demo(out: Path, *, overwrite: bool = False) -> None:
    """Build the tiny family, merge it, reload and report, all under `out`.

    The demo is one output, built whole in a hidden sibling (`.NAME.tmp-PID-*`) and renamed into
    place once its four stages passed: interrupted, killed or failed at any stage, `out` is as
    it was (an earlier demo it replaces goes only after the rename), and a killed demo's sibling
    is removed by the next writer of `out`, which takes over its stale lock.

    Args:
        out: the demo's folder.
        overwrite: replace an earlier merge-only demo there.
    """
    check_output(out, "merge-demo", overwrite=overwrite)
    # Where it really is (given as a symbolic link: its target): the paths the merged model's
    # recipe and card name once the folder is in place.
    real = output_path(out)
    t0 = time.perf_counter()
    with output_dir(out, "merge-demo", overwrite=overwrite) as tmp:
        _run(tmp, real)
    print(
        f"done in {time.perf_counter() - t0:.1f}s: merged model at {real / 'merged'}, "
        f"recipe at {real / 'recipe.yaml'} (rerun: layerswap merge {real / 'recipe.yaml'} --out DIR)"
    )


def _recipe(models: str) -> Recipe:
    """The demo's recipe, its checkpoints under the folder `models`: the paper's default zones
    (spaces.zones.paper_default, which has no transitions) plus a 1-layer magnitude-weighted
    transition on each side, so the demo shows every kind of layer."""
    zones = paper_default(NUM_LAYERS)
    return parse_recipe(
        {
            "method": "layer_swap",
            "task_expert": f"{models}/task",
            "language_expert": f"{models}/language",
            "base": f"{models}/base",
            **zones.model_dump(),
            "bottom_transition": 1,
            "top_transition": 1,
            "transition_weights": "magnitude",
            "non_layer": "average",
        }
    )


def _run(tmp: Path, real: Path) -> None:
    """The demo's four stages into `tmp`, the hidden folder that becomes `real` at the end."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    print(f"[1/4] generating a tiny Llama family ({NUM_LAYERS} layers) ...")
    make_tiny_family(tmp / "models", num_layers=NUM_LAYERS, dtype=torch.bfloat16)
    # Relative paths: load_recipe resolves them against the recipe's folder, so the recipe stays
    # valid after the folder is renamed into place. No id in this header: the id (by content)
    # is what the merged folder's recipe names.
    (tmp / "recipe.yaml").write_text(dump_recipe(_recipe("models")))
    recipe = load_recipe(tmp / "recipe.yaml")
    paths = {k: tmp / "models" / k for k in ("base", "task", "language")}
    print(
        f"[2/4] merging recipe {content_recipe_id(recipe)} (the paper's default zones scaled "
        f"to depth, b={recipe.bottom} u={recipe.top}, plus 1-layer magnitude transitions) ..."
    )
    # Read in the hidden folder; the merged folder's recipe and card name the experts where
    # they will be once it is in place.
    final = _recipe(str(real / "models"))
    merge_to_disk(recipe, tmp / "merged", progress=True, recorded_as=final)

    print("[3/4] checking each merged layer against the experts ...")
    expected = layer_map(recipe, NUM_LAYERS)["attention"]
    found = _layer_sources(tmp / "merged", paths, NUM_LAYERS)
    for i, (e, f) in enumerate(zip(expected, found, strict=True)):
        want = "mixed" if e == "transition" else e
        mark = "ok" if want == f else "MISMATCH"
        print(f"  layer {i:2d}: recipe says {e:<10} merged layer is {f:<8} {mark}")
        if want != f:
            raise RuntimeError(f"layer {i}: expected {want}, found {f}")

    print("[4/4] loading with AutoModelForCausalLM and generating ...")
    model = AutoModelForCausalLM.from_pretrained(tmp / "merged")
    tok = AutoTokenizer.from_pretrained(tmp / "merged")
    ids = tok("the math expert", return_tensors="pt")
    gen = model.generate(**ids, max_new_tokens=8, do_sample=False, pad_token_id=tok.eos_token_id)
    # The tiny model is random, so the text is noise: the point is that it loads and generates.
    print(f"  generated: {tok.decode(gen[0], skip_special_tokens=True)!r}")
