"""Experts in memory and one live model the search and promotion re-point at recipe after recipe.

`ExpertCache(base)` loads each expert's state dict once per process (LoRA adapters folded into
the base on load); `LiveModel(cache, pool).load(recipe)` makes one transformers model equal to a
recipe's merge, moving only the tensors whose plan op changed since the last recipe and sharing
every tensor taken whole from an expert (no copy).
"""

from __future__ import annotations

from pathlib import Path

import torch

from spaces.recipe import Recipe
from spaces.search_space import ExpertPool
from trainables.merge.compose import compose, memory_mav_oracle
from trainables.merge.engine import all_finite
from trainables.merge.plan import build_plan, recipe_refs
from trainables.merge.terms import Linear


def _load_state(path: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        raise ValueError(f"{path}: no .safetensors files (pickled checkpoints are refused)")
    out: dict[str, torch.Tensor] = {}
    for f in files:
        out.update(load_file(f))
    return out


class ExpertCache:
    """Expert state dicts loaded once per process; LoRA adapters folded into the base on load."""

    def __init__(self, base: str | None):
        self.base = base
        self.states: dict[str, dict[str, torch.Tensor]] = {}
        self.nonfinite: dict[str, set[str]] = {}
        self._mav = None

    def get(self, ref: str) -> dict[str, torch.Tensor]:
        if ref not in self.states:
            from trainables.merge.lora import is_lora_adapter, load_adapter

            if is_lora_adapter(ref):
                if self.base is None:
                    raise ValueError(f"{ref}: a LoRA expert needs `base` to be folded into")
                state = dict(self.get(self.base))
                for module, f in load_adapter(ref).modules.items():
                    w = state[f"{module}.weight"]
                    state[f"{module}.weight"] = (w.float() + f.delta()).to(w.dtype)
            else:
                state = _load_state(ref)
            self.nonfinite[ref] = {n for n, t in state.items() if not all_finite(t)}
            self.states[ref] = state
        return self.states[ref]

    def mav(self):
        """One magnitude oracle per process: its per-terms cache survives across trials."""
        if self._mav is None and self.base is not None:
            self.get(self.base)
            self._mav = memory_mav_oracle(self.states, self.base)
        return self._mav


class LiveModel:
    """One model object whose parameters are swapped in place from the expert cache.

    Tracks, per tensor, the plan op it currently holds, so the next recipe moves only the
    tensors whose op changed (a swap differing by one layer moves that layer's tensors).
    """

    def __init__(self, cache: ExpertCache, pool: ExpertPool):
        self.cache, self.pool = cache, pool
        for ref in [pool.base, *(r.path for r in (*pool.task, *pool.language))]:
            try:  # warm the cache once per process; a broken expert fails only its trials
                if ref is not None:
                    cache.get(ref)
            except Exception:
                pass
        self.model = None
        self.params: dict[str, torch.nn.Parameter] = {}
        self.loaded: dict[str, object] = {}  # tensor name -> plan op currently in the model
        like = next((r.path for r in pool.task if r.kind == "full"), pool.base)
        if like in cache.states:
            self._build(like, cache.states[like])

    def _build(self, like: str, state: dict[str, torch.Tensor]):
        if self.model is None:
            from transformers import AutoConfig, AutoModelForCausalLM

            dtype = next(t.dtype for t in state.values() if t.is_floating_point())
            cfg = AutoConfig.from_pretrained(like)
            self.model = AutoModelForCausalLM.from_config(cfg, dtype=dtype).eval()
            self.params = dict(self.model.named_parameters())
            for p in self.params.values():
                p.requires_grad_(False)
            self.depth = cfg.num_hidden_layers
        return self.model

    def load(self, recipe: Recipe) -> int:
        """Make the live model equal to `recipe`, moving only tensors whose plan op changed.

        Returns:
            the number of tensors swapped in.
        Raises:
            ValueError for non-finite weights (named), RecipeError for recipes that do not fit.
        """
        refs = recipe_refs(recipe)
        sources = {r: self.cache.get(r) for r in refs}
        first = sources[refs[0]]
        like = next((r for r in refs if (Path(r) / "config.json").is_file()), self.pool.base)
        self._build(str(like), first)
        names = list(first)
        unknown = [n for n in names if n not in self.params]
        if unknown:
            raise ValueError(f"tensors not in the model: {unknown[:3]}")
        return self._apply(build_plan(recipe, names, self.depth, self.cache.mav()), sources)

    def load_ref(self, ref: str) -> int:
        """Make the live model equal to one checkpoint (an expert or the base)."""
        state = self.cache.get(ref)
        self._build(ref if (Path(ref) / "config.json").is_file() else self.pool.base, state)
        return self._apply({n: Linear(((ref, 1.0),)) for n in state}, {ref: state})

    def _apply(self, plan: dict, sources: dict) -> int:
        moved = 0
        for name, op in plan.items():
            if self.loaded.get(name) == op:
                continue
            if isinstance(op, Linear) and op.take is not None:
                if name in self.cache.nonfinite[op.take]:
                    raise ValueError(f"non-finite weights in {op.take}: tensor {name}")
                t = sources[op.take][name]  # shared with the cache, no copy
            else:
                t = compose({name: op}, sources)[name]
                if not all_finite(t):
                    raise ValueError(f"non-finite merged tensor {name}")
            self.loaded.pop(name, None)  # stays consistent if the swap below fails
            self.params[name].data = t
            self.loaded[name] = op
            moved += 1
        return moved
