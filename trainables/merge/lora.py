"""Layer swapping of PEFT LoRA adapters: swap adapters per module, sum deltas by concatenating ranks.

Run it as `merge_lora_to_disk(recipe, out)` (an adapter) or with `fold=True` (a full checkpoint).
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file
from tqdm.auto import tqdm

from layerswap.spaces.base import is_hub_id, same_model
from layerswap.spaces.recipe import ExpertSoup, LayerSwapRecipe, RecipeError, dump_recipe
from layerswap.spaces.zones import layer_map, reverted
from layerswap.trainables.merge.adapter_kind import CONFIG, is_lora_adapter
from layerswap.trainables.merge.arch import check_model_type, num_layers, param_slot
from layerswap.trainables.merge.assembly import recipe_refs
from layerswap.trainables.merge.checkpoint import Checkpoint, CheckpointError, byte_view
from layerswap.trainables.merge.engine import (
    DEFAULT_SHARD_BYTES,
    RECIPE_FILE,
    check_finite,
    copy_side_files,
    local_refs,
    resolve_ref,
)
from layerswap.trainables.merge.lora_deltas import (
    Adapter,
    Factors,
    adapter_mav_oracle,
    fold_target_problem,
    fold_terms,
    rank_factor,
)
from layerswap.trainables.merge.methods import warn_unused_sides
from layerswap.trainables.merge.modelcard import model_card
from layerswap.trainables.merge.shard_writer import OutSpec, ShardWriter
from layerswap.trainables.merge.terms import transition_weights
from layerswap.trainables.model_ids import content_recipe_id, model_content_id
from layerswap.trainables.outputs import check_output, output_dir
from layerswap.trainables.storage import is_uri, join, read_text

WEIGHTS = "adapter_model.safetensors"
PREFIX = "base_model.model."  # PEFT's key prefix; the rest is the module name in the base model
_TENSOR = re.compile(r"^(?P<module>.+)\.lora_(?P<ab>[AB])\.weight$")
# Config fields that make an adapter more than `W + scaling * B @ A` on plain Linear modules, or
# that train tensors besides A and B: merging those by swapping A/B would silently be wrong.
_UNSUPPORTED = (
    "use_dora use_qalora lora_bias fan_in_fan_out modules_to_save trainable_token_indices "
    "target_parameters layer_replication alora_invocation_tokens velora_config monteclora_config "
    "use_bdlora arrow_config kasa_config megatron_config"
).split()
# Initialisations that rewrite the base weights: such an adapter is a delta from a different base.
_BASE_CHANGING_INITS = ("pissa", "olora", "corda", "loftq", "lora_ga")


def _pattern(patterns: dict | None, module: str, default):
    if not patterns:
        return default
    # PEFT's own matcher (utils/other.py: get_pattern_key), so sources read exactly as PEFT built them.
    from peft.utils.other import get_pattern_key

    return patterns.get(get_pattern_key(list(patterns), module), default)


def _check_config(root: Path, cfg: dict) -> None:
    where = root / CONFIG
    for field in _UNSUPPORTED:
        if cfg.get(field):
            raise CheckpointError(
                f"{where}: {field}={cfg[field]!r} is not supported by LoRA layer swapping "
                f"(only plain LoRA A/B factors can be swapped and rank-concatenated)"
            )
    if cfg.get("bias", "none") != "none":
        raise CheckpointError(f"{where}: bias={cfg['bias']!r} trains base biases; need 'none'")
    init = cfg.get("init_lora_weights", True)
    if isinstance(init, str) and init.lower().startswith(_BASE_CHANGING_INITS):
        raise CheckpointError(
            f"{where}: init_lora_weights={init!r} changes the base weights; save the adapter "
            f"converted to plain LoRA (path_initial_model_for_weight_conversion) first"
        )


def load_adapter(path: str | Path) -> Adapter:
    """Read and check a LoRA adapter folder (adapters are small: all factors are loaded).

    Raises:
        CheckpointError naming the file, field or tensor that is not a plain, finite LoRA.
    """
    root = resolve_ref(str(path))
    if not is_lora_adapter(root):
        raise CheckpointError(
            f"{root}: not a PEFT LoRA adapter (no {CONFIG} with peft_type LORA); a LoRA "
            f"layer swap needs both experts to be adapters"
        )
    cfg = json.loads((root / CONFIG).read_text())
    _check_config(root, cfg)
    rslora = bool(cfg.get("use_rslora", False))
    parts: dict[str, dict[str, torch.Tensor]] = {}
    with Checkpoint.open(root) as ck:
        for name, info in ck.tensors.items():
            m = _TENSOR.match(name)
            if m is None or len(info.shape) != 2:
                hint = (
                    "; PEFT saved a base weight (targeting lm_head/embeddings does so): if the "
                    "vocabulary is unchanged, save with save_embedding_layers=False"
                    if ".base_layer." in name
                    else ""
                )
                raise CheckpointError(
                    f"{info.path}: tensor {name!r} is not a LoRA A/B weight (modules_to_save, "
                    f"DoRA magnitudes, biases and embedding LoRA cannot be layer-swapped){hint}"
                )
            t = ck.read(name)
            check_finite(t, ck, name)
            parts.setdefault(m["module"].removeprefix(PREFIX), {})[m["ab"]] = t
    modules: dict[str, Factors] = {}
    for module, ab in parts.items():
        if set(ab) != {"A", "B"}:
            raise CheckpointError(f"{root / WEIGHTS}: module {module!r} lacks lora_A or lora_B")
        a, b = ab["A"], ab["B"]
        r = _pattern(cfg.get("rank_pattern"), module, cfg.get("r"))
        if a.shape[0] != b.shape[1] or a.shape[0] != r:
            raise CheckpointError(
                f"{root / WEIGHTS}: module {module!r}: lora_A {list(a.shape)}, lora_B "
                f"{list(b.shape)} do not fit rank r={r} of {CONFIG}"
            )
        alpha = _pattern(cfg.get("alpha_pattern"), module, cfg.get("lora_alpha"))
        modules[module] = Factors(a, b, float(alpha), rslora)
    if not modules:
        raise CheckpointError(f"{root / WEIGHTS}: no LoRA tensors")
    return Adapter(root, cfg, modules)


def _one_model(a: str, b: str) -> bool:
    """Whether two model references name one model: `same_model`'s rule (one folder spelled two
    ways; a Hub id or URI and a local copy of that name), or two local folders with one content
    id (a copy of the base under another name)."""
    if same_model(a, b):
        return True
    if (
        is_uri(a)
        or is_uri(b)
        or not (Path(a).expanduser().is_dir() and Path(b).expanduser().is_dir())
    ):
        return False
    # The recipe's base is hashed for the recipe id anyway (once per process), so this costs
    # one hash of the other folder, and only when the names disagree.
    ids = {model_content_id(str(Path(x).expanduser())) for x in (a, b)}
    return len(ids) == 1 and next(iter(ids)).startswith("sha256:")


def _check_pair(task: Adapter, lang: Adapter) -> None:
    a, b = task.config.get("base_model_name_or_path"), lang.config.get("base_model_name_or_path")
    if a != b and not (a and b and _one_model(a, b)):
        raise CheckpointError(
            f"different bases: {CONFIG} field 'base_model_name_or_path' is {a!r} in {task.root} "
            f"but {b!r} in {lang.root}"
        )
    for name in sorted(set(task.modules) & set(lang.modules)):
        ft, fl = task.modules[name], lang.modules[name]
        if ft.a.shape[1] != fl.a.shape[1] or ft.b.shape[0] != fl.b.shape[0]:
            raise CheckpointError(
                f"module {name!r}: [out, in] = {[ft.b.shape[0], ft.a.shape[1]]} in {task.root} "
                f"but {[fl.b.shape[0], fl.a.shape[1]]} in {lang.root}"
            )


def _shown_different(a: str, b: str) -> bool:
    """Whether two model references are known to name two models: two local folders of other
    contents, or two Hub ids / URIs of other names (case aside). Not proof of other weights: a
    mirror, a renamed repo, a 4-bit copy an adapter was trained on (QLoRA) or a re-saved config
    differ the same way; a path this machine lacks (the training node's) is not compared."""
    if _one_model(a, b) or a.casefold() == b.casefold():
        return False
    here = [Path(x).expanduser().is_dir() for x in (a, b)]
    if all(here):  # _one_model compared their contents
        return True
    remote = [is_uri(x) or is_hub_id(x) for x in (a, b)]
    return all(r and not h for r, h in zip(remote, here, strict=True))


def warn_adapter_base(recipe_base: str | None, task: Adapter) -> None:
    """Warn, on stderr, when the `base` the deltas are folded into is shown to be another model
    than the adapters name: with the same shapes nothing else would tell (the weights come out
    silently other), but a mirror, a renamed repo or the full-precision original of a QLoRA
    adapter's 4-bit base differ the same way and are right, so it is not refused. The disk
    merge and the live model (the search, once per adapter) both ask this.

    Args:
        recipe_base: the recipe's (or search's) base reference; None: nothing to check.
        task: an adapter; one that names no `base_model_name_or_path` is not checked.
    """
    trained_on = task.config.get("base_model_name_or_path")
    if recipe_base is None or not trained_on or not _shown_different(recipe_base, trained_on):
        return
    print(
        f"layerswap: warning: base {recipe_base!r} is not the model the adapters name "
        f"({CONFIG} 'base_model_name_or_path' is {trained_on!r} in {task.root}); their deltas are "
        f"added to {recipe_base!r}'s weights, which is right only if it is that model",
        file=sys.stderr,
    )


def _base_config(ref: str) -> dict:
    """config.json of a base model: a local folder, or just that file from the hub."""
    if not ref:
        raise RecipeError("no base: set `base` in the recipe (adapters name no base model)")

    path = Path(ref).expanduser()
    try:
        if is_uri(ref) or path.is_dir():
            return json.loads(read_text(join(ref, "config.json")))
        from huggingface_hub import hf_hub_download

        return json.loads(Path(hf_hub_download(ref, "config.json")).read_text())
    except Exception as e:  # missing, offline, invalid JSON: one clear message
        raise RecipeError(
            f"{ref}: cannot read the base model's config.json to learn its depth ({e}); "
            f"set `base` in the recipe to a local checkpoint folder"
        ) from None


@dataclass
class Merged:
    """An output module: PEFT factors (delta = alpha / f(r) * b @ a) and the weighted sources."""

    a: torch.Tensor  # [r, in]
    b: torch.Tensor  # [out, r]
    alpha: float
    terms: list[tuple[Factors, float]]


def _combine(terms: list[tuple[Factors, float]], rslora: bool) -> Merged:
    (f1, w1), *rest = terms
    if not rest:
        # Taken whole: same tensors; only alpha carries the weight (and any rslora difference).
        same = w1 == 1.0 and f1.rslora == rslora
        alpha = f1.alpha if same else w1 * f1.scaling * rank_factor(rslora, f1.r)
        return Merged(f1.a, f1.b, alpha, terms)
    ((f2, _),) = rest
    r = f1.r + f2.r
    alpha = w1 * f1.scaling * rank_factor(rslora, r)
    scaling = alpha / rank_factor(rslora, r)  # exactly what PEFT will compute from alpha and r
    dtype = torch.promote_types(f1.a.dtype, f2.a.dtype)
    a = torch.cat([f1.a.to(dtype), f2.a.to(dtype)], dim=0)  # [r1 + r2, in]
    bs = []
    for f, w in terms:
        c = w * f.scaling / scaling  # folds weight and scaling relative to the output scaling
        bs.append(f.b.to(dtype) if c == 1.0 else (f.b.float() * c).to(dtype))
    return Merged(a, torch.cat(bs, dim=1), alpha, terms)  # b: [out, r1 + r2]


def _swap(recipe: LayerSwapRecipe, task: Adapter, lang: Adapter, depth: int) -> dict[str, Merged]:
    """Every output module from the zone table; modules that get no delta are left out."""
    by_ref = {recipe.task_expert: task, recipe.language_expert: lang}
    task_terms, lang_terms = ((recipe.task_expert, 1.0),), ((recipe.language_expert, 1.0),)
    w_t, w_l = transition_weights(recipe, task_terms, lang_terms, adapter_mav_oracle(by_ref))
    owner = layer_map(recipe, depth)
    cells, non_layer_reverted = reverted(recipe.revert, depth) if recipe.revert else (set(), False)
    non_layer = {"average": "transition", "language": "language", "task": "task"}[recipe.non_layer]
    weights = {"task": (1.0, 0.0), "language": (0.0, 1.0), "transition": (w_t, w_l)}
    rslora = bool(task.config.get("use_rslora", False))
    out: dict[str, Merged] = {}
    for name in sorted(set(task.modules) | set(lang.modules)):
        slot = param_slot(f"{name}.weight")
        if slot.layer is None:
            source, drop = non_layer, non_layer_reverted
        elif slot.layer >= depth:
            raise RecipeError(f"module {name!r}: layer {slot.layer} but the base has {depth}")
        else:
            source = owner[slot.component][slot.layer]
            drop = (slot.layer, slot.component) in cells
        terms = [
            (ad.modules[name], w)
            for ad, w in zip((task, lang), weights[source], strict=True)
            if w > 0 and name in ad.modules
        ]
        if terms and not drop:
            out[name] = _combine(terms, rslora)
    if not out:
        raise RecipeError("the recipe gives no module a LoRA delta: the output would be empty")
    return out


def _adapter_config(task: Adapter, merged: dict[str, Merged]) -> dict:
    cfg = dict(task.config)
    r0, alpha0 = cfg["r"], cfg["lora_alpha"]
    # Exact module names: PEFT (tuners/tuners_utils.py: check_target_module_exists) targets a
    # module whose name equals or ends with ".<entry>", and matches pattern keys as regexes
    # (utils/other.py: get_pattern_key), so those are escaped.
    keys = {name: re.escape(name) for name in merged}
    cfg.update(
        target_modules=sorted(merged),
        rank_pattern={keys[n]: m.a.shape[0] for n, m in merged.items() if m.a.shape[0] != r0},
        alpha_pattern={keys[n]: m.alpha for n, m in merged.items() if m.alpha != alpha0},
        exclude_modules=None,
        layers_to_transform=None,
        layers_pattern=None,
        modules_to_save=None,
        init_lora_weights=True,
        inference_mode=True,
    )
    return cfg


def _fold(base: Checkpoint, merged: dict[str, Merged], out: Path, progress: bool) -> None:
    """Write base + merged deltas, one base tensor in memory at a time."""
    for name, m in merged.items():
        info = base.tensors.get(f"{name}.weight")
        problem = fold_target_problem(name, m.a, m.b, None if info is None else info.shape)
        if problem is not None:
            raise CheckpointError(f"{base.root}: {problem}")
    order = sorted(base.tensors, key=lambda n: (str(base.tensors[n].path), base.tensors[n].start))
    specs = [OutSpec(n, base.tensors[n].dtype, base.tensors[n].shape) for n in order]
    with ShardWriter(out, specs, DEFAULT_SHARD_BYTES) as writer:  # files closed on any error
        writer.open()
        for name in tqdm(order, desc="fold", disable=not progress):
            w = base.read(name)
            check_finite(w, base, name)
            m = merged.get(name.removesuffix(".weight")) if name.endswith(".weight") else None
            if m is not None:
                # From the sources in float32, not the (maybe low-precision) concatenated factors.
                w = fold_terms(w, m.terms)
            writer.write(name, byte_view(w.contiguous()))
    writer.close()


def merge_lora_to_disk(
    recipe: LayerSwapRecipe,
    out: str | Path,
    *,
    overwrite: bool = False,
    fold: bool = False,
    progress: bool = False,
) -> Path:
    """Layer-swap two LoRA adapters trained from the same base into one adapter (or model).

    Owned modules take their owner's A and B; transition (and averaged non-layer) modules are
    w_t * s_t * B_t @ A_t + w_l * s_l * B_l @ A_l, as A' = [A_t; A_l], B' = [c_t B_t, c_l B_l].
    Magnitude weights are the normalised inverse mean row-wise MAV of each adapter's s * B @ A.

    Args:
        recipe: a layer-swap recipe whose experts are LoRA adapter folders (no soups).
        out: output folder; must not exist unless `overwrite`.
        fold: write a full checkpoint base + merged deltas instead (needs `recipe.base`).
        progress: show a progress bar.
    Returns:
        The output folder: adapter (or model) files, the recipe and a model card.
    """
    out = Path(out)
    check_output(out, "merge", overwrite=overwrite, inputs=local_refs(recipe_refs(recipe)))
    if not isinstance(recipe, LayerSwapRecipe):
        raise RecipeError(f"LoRA adapters can only be layer-swapped, not merged by {recipe.method}")
    for field in ("task_expert", "language_expert"):
        if isinstance(getattr(recipe, field), ExpertSoup):
            raise RecipeError(
                f"recipe.{field}: expert soups of LoRA adapters are not supported (averaging A "
                f"and B separately is not averaging deltas); fold them into full models first"
            )
    if fold and recipe.base is None:
        raise RecipeError("fold=True needs `base` (the full checkpoint the deltas are added to)")
    task, lang = load_adapter(recipe.task_expert), load_adapter(recipe.language_expert)
    _check_pair(task, lang)
    warn_adapter_base(recipe.base, task)
    base_cfg = _base_config(recipe.base or task.config.get("base_model_name_or_path") or "")
    check_model_type(base_cfg, "base config.json")
    depth = num_layers(base_cfg, "base config.json")
    merged = _swap(recipe, task, lang, depth)
    warn_unused_sides(recipe, depth)
    rid = content_recipe_id(recipe)
    card = model_card(recipe, depth, rid)
    with output_dir(out, "merge", overwrite=overwrite, identity=rid) as tmp:
        if fold:
            base_root = resolve_ref(recipe.base)
            with Checkpoint.open(base_root) as base:
                _fold(base, merged, tmp, progress)
            copy_side_files(base_root, tmp)
        else:
            tensors = {}
            for name, m in tqdm(merged.items(), desc="lora", disable=not progress):
                tensors[f"{PREFIX}{name}.lora_A.weight"] = m.a.contiguous()
                tensors[f"{PREFIX}{name}.lora_B.weight"] = m.b.contiguous()
            save_file(tensors, str(tmp / WEIGHTS), metadata={"format": "pt"})
            cfg = _adapter_config(task, merged)
            (tmp / CONFIG).write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
            card = card.replace("library_name: transformers", "library_name: peft", 1)
            card += (
                "\nLoad: `PeftModel.from_pretrained(base_model, DIR)`; concatenated modules have "
                "rank r_task + r_language (see rank_pattern / alpha_pattern).\n"
            )
        (tmp / RECIPE_FILE).write_text(dump_recipe(recipe, rid))
        (tmp / "README.md").write_text(card)
    return out
