"""In-memory composition: loaded expert state dicts -> merged state dict, sharing what it can.

Every tensor taken whole from one checkpoint is the *same* tensor object (no copy); only
averaged/merged tensors are new. This is what a search trial calls instead of writing to disk.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from layerswap.spaces.recipe import Recipe, RecipeError
from layerswap.trainables.merge.assembly import build_assembly, recipe_refs
from layerswap.trainables.merge.ops import mean_row_mav, op_kind
from layerswap.trainables.merge.terms import Assembly, Terms

StateDict = Mapping[str, torch.Tensor]


def untied(state: StateDict) -> StateDict:
    """`state` without a second name for one tensor: `model.state_dict()` of a tied-embedding
    model holds `lm_head.weight` as the embedding itself, which the model's files (and so the disk
    merge) leave out. A name whose tensor is the same view of the same storage as an earlier
    name's is dropped (transformers lists the embedding first), so such a state dict merges as
    its files do. Returns `state` itself when nothing is shared.
    """
    seen: set[tuple] = set()
    drop = []
    for name, t in state.items():
        key = (
            t.untyped_storage().data_ptr(),
            t.storage_offset(),
            tuple(t.shape),
            t.stride(),
            t.dtype,
        )
        if t.numel() and key in seen:
            drop.append(name)
        seen.add(key)
    return {n: t for n, t in state.items() if n not in drop} if drop else state


def memory_mav_oracle(sources: Mapping[str, StateDict], base: str, chunk_elems: int = 1 << 23):
    """Mean row-wise MAV of (combination - base) over all 1-D/2-D float tensors."""
    cache: dict[Terms, float] = {}
    shapes = {n: tuple(t.shape) for n, t in untied(sources[base]).items() if t.is_floating_point()}

    def read(ref: str, name: str, start: int, count: int) -> torch.Tensor:
        return sources[ref][name].reshape(-1)[start : start + count]

    def mav(terms: Terms) -> float:
        if terms not in cache:
            cache[terms] = mean_row_mav(terms, base, shapes, read, chunk_elems)
        return cache[terms]

    return mav


def compose(assembly: Assembly, sources: Mapping[str, StateDict]) -> dict[str, torch.Tensor]:
    """Execute an assembly on loaded tensors.

    Args:
        assembly: {tensor name: op} from `build_assembly`.
        sources: {checkpoint ref: state dict} for every ref the assembly names.
    Returns:
        {tensor name: tensor}; taken tensors are the source tensors themselves.
    Raises:
        ValueError for an op that trainables.merge.ops.OPS does not know.
    """
    out: dict[str, torch.Tensor] = {}
    for name, op in assembly.items():
        kind = op_kind(op)  # an op it does not know raises here, before a tensor is missing
        if op.take is not None:
            out[name] = sources[op.take][name]
        else:
            out[name] = kind.apply(op, [sources[r][name] for r in op.refs], None)
    return out


def compose_recipe(
    recipe: Recipe, sources: Mapping[str, StateDict], num_layers: int
) -> dict[str, torch.Tensor]:
    """Assemble and compose a recipe from loaded state dicts keyed by the recipe's checkpoint refs.

    Args:
        recipe: a validated recipe.
        sources: {ref: state dict}, one per checkpoint the recipe names (a tied model's
            `model.state_dict()` is fine: its `lm_head.weight` alias is left out, see `untied`).
        num_layers: the models' depth.
    Returns:
        The merged state dict (sharing storage with `sources` where a tensor is taken whole).
    """
    refs = recipe_refs(recipe)
    missing = [r for r in refs if r not in sources]
    if missing:
        raise RecipeError(f"compose: no state dict loaded for {missing}")
    sources = {r: untied(sources[r]) for r in refs}
    names = list(sources[refs[0]])
    for ref in refs[1:]:
        if set(sources[ref]) != set(names):
            diff = sorted(set(sources[ref]).symmetric_difference(names))
            raise RecipeError(f"compose: {ref} has different tensors, e.g. {diff[:3]}")
    mav = memory_mav_oracle(sources, recipe.base) if recipe.base is not None else None
    assembly = build_assembly(recipe, names, num_layers, mav)
    return compose(assembly, sources)
