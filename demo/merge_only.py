"""`layerswap demo --merge-only`: one layer swap, end to end, on a tiny model family made here.

Runs on CPU in seconds: generate base + two experts, write a recipe, merge to disk, reload the
merged model with transformers, check every layer's source, generate a few tokens.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from layerswap.spaces.recipe import dump_recipe, load_recipe, parse_recipe
from layerswap.spaces.zones import layer_map, paper_default
from layerswap.trainables.atomic import output_path, temp_sibling
from layerswap.trainables.locks import writing
from layerswap.trainables.merge.checkpoint import Checkpoint
from layerswap.trainables.merge.engine import merge_to_disk
from layerswap.trainables.model_ids import content_recipe_id
from layerswap.trainables.outputs import check_output, output_dir, replacing
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
    """Build the tiny family, merge it, reload and report. Writes everything under `out`.

    The demo is one output: interrupted or failed at any stage, `out` is removed (an earlier
    demo it replaces comes back), as the CLI's "nothing half-written was kept" says.
    """
    check_output(out, "merge-demo", overwrite=overwrite)
    # Where it really is (given as a symbolic link: its target): the demo is built there and
    # removed by renaming it when it fails, which must move the target, never the user's link.
    real = output_path(out)
    # One writer from the first change to the last stage: setting an earlier demo aside is
    # already a write, stages 2-4 write into `out` after output_dir's own lock is released, and
    # the failure path removes `out`, which must never be another writer's demo.
    with writing(out):
        check_output(out, "merge-demo", overwrite=overwrite)  # again, under the lock
        with replacing([real]), _removed_unless_finished(real):
            _run(real)


@contextmanager
def _removed_unless_finished(out: Path) -> Iterator[None]:
    """Remove `out` when the block fails: hidden first (one rename), then deleted."""
    try:
        yield
    except BaseException:
        if out.exists():
            # temp_sibling's name (it carries this pid): a kill -9 mid-removal leaves a folder
            # the next writer of `out` recognises as a dead writer's and sweeps.
            hidden = temp_sibling(out)
            os.rename(out, hidden)
            # The merge's writer threads may still finish a file for a moment after the
            # interrupt (seen: a folder not empty yet): removed again until it is gone.
            for _ in range(50):
                shutil.rmtree(hidden, ignore_errors=True)
                if not hidden.exists():
                    break
                time.sleep(0.1)
        raise


def _run(out: Path) -> None:
    """The demo's four stages into `out`, which does not exist yet."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    t0 = time.perf_counter()
    with output_dir(out, "merge-demo") as tmp:
        print(f"[1/4] generating a tiny Llama family ({NUM_LAYERS} layers) ...")
        make_tiny_family(tmp / "models", num_layers=NUM_LAYERS, dtype=torch.bfloat16)
        zones = paper_default(NUM_LAYERS)
        # Relative paths: load_recipe resolves them against the recipe's folder, so the
        # recipe stays valid after the temporary folder is renamed into place.
        recipe = parse_recipe(
            {
                "method": "layer_swap",
                "task_expert": "models/task",
                "language_expert": "models/language",
                "base": "models/base",
                **zones.model_dump(),
                "bottom_transition": 1,
                "top_transition": 1,
                "transition_weights": "magnitude",
                "non_layer": "average",
            }
        )
        # No id in this header: the relative paths resolve once the folder is in place, and
        # the id (by content) is what the merged folder's recipe names.
        (tmp / "recipe.yaml").write_text(dump_recipe(recipe))
    recipe = load_recipe(out / "recipe.yaml")
    paths = {k: out / "models" / k for k in ("base", "task", "language")}
    print(
        f"[2/4] merging recipe {content_recipe_id(recipe)} (paper default scaled to depth, "
        f"b={recipe.bottom} u={recipe.top}, 1-layer transitions, magnitude weights) ..."
    )
    merge_to_disk(recipe, out / "merged", overwrite=True, progress=True)

    print("[3/4] checking each merged layer against the experts ...")
    expected = layer_map(recipe, NUM_LAYERS)["attention"]
    found = _layer_sources(out / "merged", paths, NUM_LAYERS)
    for i, (e, f) in enumerate(zip(expected, found, strict=True)):
        want = "mixed" if e == "transition" else e
        mark = "ok" if want == f else "MISMATCH"
        print(f"  layer {i:2d}: recipe says {e:<10} merged layer is {f:<8} {mark}")
        if want != f:
            raise RuntimeError(f"layer {i}: expected {want}, found {f}")

    print("[4/4] loading with AutoModelForCausalLM and generating ...")
    model = AutoModelForCausalLM.from_pretrained(out / "merged")
    tok = AutoTokenizer.from_pretrained(out / "merged")
    ids = tok("the math expert", return_tensors="pt")
    gen = model.generate(**ids, max_new_tokens=8, do_sample=False, pad_token_id=tok.eos_token_id)
    # The tiny model is random, so the text is noise: the point is that it loads and generates.
    print(f"  generated: {tok.decode(gen[0], skip_special_tokens=True)!r}")
    print(
        f"done in {time.perf_counter() - t0:.1f}s: merged model at {out / 'merged'}, "
        f"recipe at {out / 'recipe.yaml'} (rerun: layerswap merge {out / 'recipe.yaml'} --out DIR)"
    )
