"""The merge-search benchmark's search spaces (--space) and every recipe a space can produce.

Used by benchmarks/bench_search.py (and search_replay.py, gpu_check/trials.py through it); not
run on its own.
"""

from __future__ import annotations

# Heavy imports (torch, optuna, Ray, lm-eval, the project) sit inside the functions: the
# script's --help and its argument checks stay instant.


def _wide_space(depth: int) -> dict:
    """The benchmark's own grid: swaps from none to half the depth, 0/1-layer transitions and
    every non-layer choice (~1100 recipes at depth 24)."""
    return {
        "bottom": {"low": 0, "high": max(1, depth // 2)},
        "top": {"low": 0, "high": max(1, depth // 4)},
        "bottom_transition": {"low": 0, "high": 1},
        "top_transition": {"low": 0, "high": 1},
        "non_layer": ["average", "language", "task"],
    }


# --space: name -> the search space (spaces.search_space.SearchSpace fields) at a depth
SPACES = {"wide": _wide_space, "demo": lambda depth: {}}  # demo: the search's defaults


def enumerate_space(space, depth, pool) -> list[dict]:
    """Every params dict the define-by-run space can produce (DFS over its suggest calls).

    Args:
        space: the search space (spaces.search_space.SearchSpace).
        depth, pool: the model's depth and the expert pool the recipes decode with.
    Returns:
        one params dict per distinct recipe, in DFS order.
    """
    from layerswap.spaces.search_space import suggest

    class Path_:
        def __init__(self, prefix):
            self.prefix, self.i, self.params, self.branches = prefix, 0, {}, []

        def _pick(self, name, options):
            if self.i < len(self.prefix):
                v = self.prefix[self.i]
            else:
                v = options[0]
                self.branches.append((self.i, options))
            self.i += 1
            self.params[name] = v
            return v

        def suggest_int(self, name, low, high):
            return self._pick(name, list(range(low, high + 1)))

        def suggest_categorical(self, name, choices):
            return self._pick(name, list(choices))

        def suggest_float(self, name, low, high):
            return self._pick(name, [(low + high) / 2])

    out, stack = [], [[]]
    while stack:
        prefix = stack.pop()
        t = Path_(prefix)
        suggest(t, space, depth, pool)
        if any(len(o) > 1 for _, o in t.branches):
            i, options = next((i, o) for i, o in t.branches if len(o) > 1)
            taken = [t.params[k] for k in list(t.params)[:i]]
            stack += [[*taken, v] for v in options]
        else:
            out.append(t.params)
    return out
