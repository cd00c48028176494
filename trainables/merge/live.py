"""Experts in memory and one live model the search and promotion re-point at recipe after recipe.

`ExpertCache(base)` loads each expert's state dict once per process (LoRA adapters folded into
the base on load), or takes them from a loader such as the search's per-node store
(search/expert_store.py); `LiveModel(cache, pool, device).load(recipe)` makes one transformers
model on `device` equal to a recipe's merge, moving only the tensors whose assembly op changed since
the last recipe. On the CPU every tensor taken whole from an expert is shared (no copy); on a
GPU it is copied once per change, or once per run when the experts fit on the device.
LoRA experts follow the disk merge's rules (trainables/merge/lora_deltas.py), so a LoRA recipe
loads bit for bit what `merge(recipe, out, fold=True)` writes: the cache keeps each adapter's
factors, magnitude weights come from their exact deltas, and a weighted sum of adapters is the
base plus their float32 deltas, computed on the CPU. Tests: tests/trainables/merge/test_lora_live.py
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import torch

from layerswap.spaces.recipe import LayerSwapRecipe, Recipe
from layerswap.spaces.search_space import ExpertPool
from layerswap.trainables.merge.assembly import build_assembly, primary_ref, recipe_refs
from layerswap.trainables.merge.checkpoint import CheckpointError, find_weights
from layerswap.trainables.merge.compose import compose, memory_mav_oracle
from layerswap.trainables.merge.engine import all_finite
from layerswap.trainables.merge.generation import (
    decoding_source,
    file_dir,
    generation_config,
    is_adapter,
)
from layerswap.trainables.merge.lora import (
    is_lora_adapter,
    load_adapter,
    warn_adapter_base,
)
from layerswap.trainables.merge.lora_deltas import (
    Adapter,
    Factors,
    adapter_mav_oracle,
    fold_target_problem,
    fold_terms,
)
from layerswap.trainables.merge.ops import op_kind
from layerswap.trainables.merge.terms import Linear
from layerswap.trainables.storage import local_copy


def _load_state(path: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    out: dict[str, torch.Tensor] = {}
    for f in find_weights(Path(path)):  # the disk merge's rule for which files hold the weights
        out.update(load_file(f))
    return out


def load_expert(
    ref: str, base_state: Callable[[], dict[str, torch.Tensor]] | None
) -> dict[str, torch.Tensor]:
    """One checkpoint's state dict from disk; a LoRA adapter is folded into `base_state()`.

    Args:
        ref: a full checkpoint folder or a PEFT LoRA adapter folder; a URI is read from its
            local copy (trainables.storage.local_copy).
        base_state: returns the base's state dict (None: no base configured).
    """
    path = str(local_copy(ref))
    if not is_lora_adapter(path):
        return _load_state(path)
    return fold_adapter(ref, load_adapter(path), base_state)


def fold_adapter(
    ref: str, adapter: Adapter, base_state: Callable[[], dict[str, torch.Tensor]] | None
) -> dict[str, torch.Tensor]:
    """The base's state dict with `adapter` folded in (the disk fold's rule, lora_deltas.fold_terms);
    untouched tensors are the base's own.

    Args:
        ref: the adapter's reference (named in the error).
        adapter: its factors.
        base_state: returns the base's state dict (None: no base configured).
    """
    if base_state is None:
        raise ValueError(f"{ref}: a LoRA expert needs `base` to be folded into")
    state = dict(base_state())
    for module, f in adapter.modules.items():
        w = state.get(f"{module}.weight")
        problem = fold_target_problem(module, f.a, f.b, None if w is None else w.shape)
        if problem is not None:  # e.g. a LoRA on lm_head of a tied-embedding base
            raise CheckpointError(f"{ref}: folded into base: {problem}")
        state[f"{module}.weight"] = fold_terms(w, [(f, 1.0)])
    return state


def nonfinite_names(state: dict[str, torch.Tensor]) -> set[str]:
    """Names of the tensors holding a NaN or an Inf."""
    return {n for n, t in state.items() if not all_finite(t)}


# (ref) -> (state dict, names of its non-finite tensors), e.g. the per-node store's client.
Loader = Callable[[str], tuple[dict[str, torch.Tensor], set[str]]]


class ExpertCache:
    """Expert state dicts held once per process; LoRA adapters folded into the base on load.

    Args:
        base: the base checkpoint (LoRA experts fold into it; magnitude weights need it).
        loader: where states come from (default: this process reads the files).
    """

    def __init__(self, base: str | None, loader: Loader | None = None):
        self.base = base
        self.loader = loader
        self.states: dict[str, dict[str, torch.Tensor]] = {}
        self.nonfinite: dict[str, set[str]] = {}
        self.adapters: dict[str, Adapter | None] = {}  # ref -> its LoRA factors (None: full)
        self._mav = None
        self._lora_mav: dict[str, float] = {}  # ref -> lora_deltas.mav_sum, once per process
        self._config_dirs: dict[tuple[str, str], str | None] = {}

    def get(self, ref: str) -> dict[str, torch.Tensor]:
        if ref not in self.states:
            if self.loader is not None:
                state, bad = self.loader(ref)
            else:
                base = (lambda: self.get(self.base)) if self.base is not None else None
                adapter = self.adapter(ref)
                state = fold_adapter(ref, adapter, base) if adapter else load_expert(ref, base)
                bad = nonfinite_names(state)
            self.nonfinite[ref], self.states[ref] = bad, state
        return self.states[ref]

    def adapter(self, ref: str) -> Adapter | None:
        """`ref`'s LoRA adapter, read once per process (rank-r factors: megabytes, even for an
        8B model), or None for a full checkpoint. Read here even when a loader serves the folded
        states: the disk merge computes from the factors, so the live model does too."""
        if ref not in self.adapters:
            # A stat, or adapter_config.json alone (even from a URI): trial processes that a
            # node store serves open none of a full expert's files (generation.is_adapter).
            adapter = load_adapter(local_copy(ref)) if is_adapter(ref) else None
            if adapter is not None:  # folded into the search's base: said if another model
                warn_adapter_base(self.base, adapter)
            self.adapters[ref] = adapter
        return self.adapters[ref]

    def lora_terms(self, name: str, op: object) -> list[tuple[Factors, float]] | None:
        """What `op` adds to the base's tensor `name` when it is a weighted sum (coefficients
        summing to 1) of LoRA adapters only: [(factors, coefficient)] for the adapters that
        adapt it, [] for none; None for any other op (computed from the loaded states)."""
        if not isinstance(op, Linear) or self.base is None:
            return None
        adapters = [self.adapter(r) for r in op.refs]
        if not all(adapters) or abs(sum(c for _, c in op.terms) - 1.0) > 1e-6:
            return None
        module = name.removesuffix(".weight")
        return [
            (a.modules[module], c)
            for a, (_, c) in zip(adapters, op.terms, strict=True)
            if name.endswith(".weight") and module in a.modules
        ]

    def config_dir(self, ref: str | None, name: str = "config.json") -> str | None:
        """A local folder holding `ref`'s file `name` (config.json, generation_config.json; for
        a URI, a copy of that file alone: a trial served by the node store needs no weights
        here), or None if it has none."""
        if ref is None:
            return None
        if (ref, name) not in self._config_dirs:
            self._config_dirs[ref, name] = file_dir(ref, name)
        return self._config_dirs[ref, name]

    def nbytes(self) -> int:
        """Bytes of every state held (tensors shared between states counted once)."""
        seen = {t.data_ptr(): t.numel() * t.element_size() for s in self.states.values() for t in s.values()}  # fmt: skip
        return sum(seen.values())

    def mav(self, recipe: Recipe | None = None):
        """The magnitude oracle for `recipe`, its per-terms cache kept for the process.

        A layer swap of two LoRA adapters (what `merge` sends to merge_lora_to_disk) gets the
        disk merge's oracle over the adapters' exact deltas (lora_deltas.adapter_mav_oracle),
        so its weights are the floats RUN/best is merged with; anything else (full experts,
        soups, a mixed pair) the mean row-wise MAV of the loaded states.
        """
        if isinstance(recipe, LayerSwapRecipe):
            refs = (recipe.task_expert, recipe.language_expert)
            if all(isinstance(r, str) and self.adapter(r) for r in refs):
                return adapter_mav_oracle({r: self.adapter(r) for r in refs}, self._lora_mav)
        if self._mav is None and self.base is not None:
            self.get(self.base)
            self._mav = memory_mav_oracle(self.states, self.base)
        return self._mav


# Share of the trial's GPU memory kept free for activations, the KV cache and the evaluator's
# batches when deciding whether the experts can live on the device too.
EVAL_HEADROOM = 0.3


class LiveModel:
    """One model object whose parameters are swapped in place from the expert cache.

    Tracks, per tensor, the assembly op it currently holds, so the next recipe moves only the
    tensors whose op changed (a swap differing by one layer moves that layer's tensors).

    Args:
        cache: the experts.
        pool: the experts' paths (the cache is warmed with all of them).
        device: where the model lives ("cpu", "cuda", "cuda:1").
        gpu_share: the share of the GPU this process may use (a trial's gpus_per_trial).
    """

    def __init__(
        self, cache: ExpertCache, pool: ExpertPool, device: str = "cpu", gpu_share: float = 1.0
    ):
        self.cache, self.pool = cache, pool
        self.device = torch.device(device)
        self.gpu_share = min(1.0, gpu_share)
        for ref in [pool.base, *(r.path for r in (*pool.task, *pool.language))]:
            try:  # warm the cache once per process; a broken expert fails only its trials
                if ref is not None:
                    cache.get(ref)
            except Exception:
                pass
        self.model = None
        self.params: dict[str, torch.nn.Parameter] = {}
        self.loaded: dict[str, object] = {}  # tensor name -> assembly op currently in the model
        self.resident: dict[tuple, torch.Tensor] = {}  # experts' tensors on the device
        self.keep_on_device = False
        self.placement = "cpu: experts shared with the model, no copies"
        self.t_move_s = 0.0  # seconds copying expert tensors to the device, over all loads
        self._decoding_from: str | None = None  # whose generation_config the model carries
        like = next((r.path for r in pool.task if r.kind == "full"), pool.base)
        if like in cache.states:
            self._build(self._like([like]), cache.states[like])

    def _build(self, like: str, state: dict[str, torch.Tensor]):
        if self.model is None:
            from transformers import AutoConfig, AutoModelForCausalLM

            dtype = next(t.dtype for t in state.values() if t.is_floating_point())
            cfg = AutoConfig.from_pretrained(like)
            with self.device:  # buffers (rotary tables) are made where the model runs
                self.model = AutoModelForCausalLM.from_config(cfg, dtype=dtype).eval()
            self.params = dict(self.model.named_parameters())
            for p in self.params.values():
                p.requires_grad_(False)
            self.depth = cfg.num_hidden_layers
            if self.device.type == "cuda":
                self._place()
        return self.model

    def _decode_as(self, ref: str) -> None:
        """Give the model the generation settings of the folder a disk merge of it would write
        (trainables/merge/generation.py: `ref`'s generation_config.json, a LoRA adapter's base's,
        else those the config.json the merge copies implies). lm-eval's generate and the proxy's
        decoding rules (trainables/evaluate/decoding.py) read them; promotion's kept results
        and a resumed search compare their decoding_digest, of the same rule."""
        src = decoding_source(ref, self.cache.base, adapter=self.cache.adapter(ref) is not None)
        if src == self._decoding_from:
            return
        self.model.generation_config = generation_config(src, self.cache.config_dir, self.model.config)  # fmt: skip
        self._decoding_from = src

    def _like(self, refs: list[str]) -> str:
        """Where the model's config comes from: the first of `refs` with a config.json (its
        local folder), else the base's (a Hub id as written)."""
        found = (self.cache.config_dir(r) for r in [*refs, self.pool.base])
        return next((d for d in found if d), None) or str(self.pool.base)

    def _place(self) -> None:
        """Keep the experts on the GPU when they fit beside the model and the evaluator."""
        _, total = torch.cuda.mem_get_info(self.device)
        budget = total * self.gpu_share * (1 - EVAL_HEADROOM)
        model = sum(p.numel() * p.element_size() for p in self.params.values())
        experts = self.cache.nbytes()
        self.keep_on_device = model + experts <= budget
        gb = 1 << 30
        where = (
            "on the device, copied once"
            if self.keep_on_device
            else "in host memory, changed tensors copied per trial"
        )
        self.placement = (
            f"{self.device}: experts {experts / gb:.1f} GiB {where} (model {model / gb:.1f} GiB, "
            f"budget {budget / gb:.1f} GiB = {self.gpu_share:g} x GPU less {EVAL_HEADROOM:.0%})"
        )

    def tensor(self, ref: str, name: str) -> torch.Tensor:
        """An expert's tensor on the model's device (the cached one itself on the CPU)."""
        t = self.cache.states[ref][name]
        if t.device == self.device:
            return t
        # Keyed by the source tensor: LoRA experts share the base's untouched tensors, which
        # must be on the device once, as `_place` counted them (ExpertCache.nbytes).
        key = (t.data_ptr(), t.dtype, tuple(t.shape))
        hit = self.resident.get(key)
        if hit is not None:
            return hit
        t0 = time.perf_counter()
        out = t.to(self.device)
        self.t_move_s += time.perf_counter() - t0
        if self.keep_on_device:
            self.resident[key] = out
        return out

    def load(self, recipe: Recipe) -> int:
        """Make the live model equal to `recipe`, moving only tensors whose assembly op changed.

        Returns:
            the number of tensors swapped in.
        Raises:
            ValueError for non-finite weights (named), RecipeError for recipes that do not fit.
        """
        refs = recipe_refs(recipe)
        sources = {r: self.cache.get(r) for r in refs}
        first = sources[refs[0]]
        self._build(self._like(refs), first)
        self._decode_as(primary_ref(recipe))
        names = list(first)
        unknown = [n for n in names if n not in self.params]
        if unknown:
            raise ValueError(f"tensors not in the model: {unknown[:3]}")
        return self._apply(build_assembly(recipe, names, self.depth, self.cache.mav(recipe)), refs)

    def load_ref(self, ref: str) -> int:
        """Make the live model equal to one checkpoint (an expert or the base)."""
        state = self.cache.get(ref)
        self._build(self._like([ref]), state)
        self._decode_as(ref)
        return self._apply({n: Linear(((ref, 1.0),)) for n in state}, [ref])

    def _apply(self, assembly: dict, refs: list[str]) -> int:
        # Sources as seen from the device: averaged tensors are computed where the model is.
        sources = {r: _OnDevice(self, r) for r in refs}
        for op in assembly.values():
            op_kind(op)  # an op the table does not know raises, naming it, before any swap
        moved = 0
        for name, op in assembly.items():
            if self.loaded.get(name) == op:
                continue
            if op.take is not None:
                if name in self.cache.nonfinite[op.take]:
                    raise ValueError(f"non-finite weights in {op.take}: tensor {name}")
                t = self.tensor(op.take, name)  # on the CPU: shared with the cache, no copy
            else:
                t = self._computed(name, op, sources)
                if not all_finite(t):
                    raise ValueError(f"non-finite merged tensor {name}")
            self.loaded.pop(name, None)  # stays consistent if the swap below fails
            self.params[name].data = t
            self.loaded[name] = op
            moved += 1
        return moved

    def _computed(self, name: str, op: object, sources: dict) -> torch.Tensor:
        """A tensor an op computes. Over LoRA adapters: base + float32 deltas from the factors
        on the CPU (a GPU's matmul rounds otherwise; the disk fold runs on the CPU), then moved:
        one float32 row chunk of one tensor at a time, never a float32 copy of an expert."""
        terms = self.cache.lora_terms(name, op)
        if terms is None:
            return compose({name: op}, sources)[name]
        if not terms:  # no adapter touches it: the base's own tensor
            return self.tensor(self.cache.base, name)
        return fold_terms(self.cache.get(self.cache.base)[name], terms).to(self.device)


class _OnDevice:
    """One expert's tensors as the live model's device sees them (what `compose` reads)."""

    def __init__(self, live: LiveModel, ref: str):
        self.live, self.ref = live, ref

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.live.tensor(self.ref, name)
