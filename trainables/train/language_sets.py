"""Per-language SFT sets as the papers built them (appendix A.6 / ICLR A.1), written as JSONL.

`build_language_set("Swahili", size=..., data_files={...})` loads a language's sources
(trainables/train/sources.py), drops math-looking examples and duplicates, mixes them to a
target size with a validation share; `write_jsonl` writes the result atomically, ready to be a
training experiment's `datasets: [{path: ...}]` (see spaces/examples/real_llama31_8b_*_full.yaml).
"""

from __future__ import annotations

import json
import numbers
import random
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from layerswap.trainables.atomic import atomic_write_text
from layerswap.trainables.train.sft_records import (
    RECORD_KEYS,
    DataSourceError,
    Record,
    resolve_language,
)
from layerswap.trainables.train.sources import LANGUAGE_SOURCES, load_sft

# ---------------------------------------------------------------------------------------------
# The math guard. The papers' language sets contain no math, so a math-looking example in a
# language source is dropped rather than allowed to blur which expert learned math.
#
# Heuristic (script-independent, since the prompts are in Bengali/Swahili/Telugu/Japanese; `\d`
# matches every script's digits): an example is math if prompt or response has
#   - an arithmetic expression: digit, then + * x × ÷ ^ =, then digit ("5 + 3", "2×4", "x=7");
#   - a subtraction/division result: "12 - 4 = 8", "9/3 = 3" (a bare "1990-1995" is a range);
#   - LaTeX math (\frac, \sqrt, \times, \cdot, \div, \sum, \int) or "$...digit...$";
#   - an English math phrase that translated data keeps ("solve for", "equation", "calculate").
# It favours precision: a word problem whose text never shows an operation slips through.

_MATH_PATTERNS = [
    re.compile(r"\d\s*[+*×÷^=]\s*\d"),
    re.compile(r"\d\s*[-−/]\s*\d+(?:\.\d+)?\s*="),
    re.compile(r"\d\s*x\s*\d+\s*="),
    re.compile(r"\\(?:frac|sqrt|times|cdot|div|sum|int)\b"),
    re.compile(r"\$[^$\n]*\d[^$\n]*\$"),
    re.compile(r"\b(?:solve for|equations?|calculate|arithmetic)\b", re.IGNORECASE),
]


def looks_like_math(record: Mapping[str, str]) -> bool:
    """True if the record's prompt or response looks like math (heuristic above)."""
    text = f"{record.get('prompt', '')}\n{record.get('response', '')}"
    return any(p.search(text) for p in _MATH_PATTERNS)


# ---------------------------------------------------------------------------------------------
# Mixing and writing.


@dataclass
class Mix:
    """A mixed SFT set: train and validation records, and what was dropped on the way."""

    train: list[Record]
    validation: list[Record]
    dropped_math: int = 0
    dropped_duplicates: int = 0
    per_source: dict[str, int] = field(default_factory=dict)


def _quotas(sizes: Mapping[str, int], weights: Mapping[str, float], total: int) -> dict[str, int]:
    """Records to take per source: proportional to weight, capped by availability, the shortfall
    of small sources handed to the others (deterministic: no randomness here)."""
    quota = dict.fromkeys(sizes, 0)
    open_ = [k for k in sizes if sizes[k] > 0 and weights.get(k, 0) > 0]
    left = min(total, sum(sizes[k] for k in open_))
    while left > 0 and open_:
        wsum = sum(weights[k] for k in open_)
        share = {k: int(left * weights[k] / wsum) for k in open_}
        # Rounding leftovers go to the heaviest sources first (ties by name), one each.
        rest = left - sum(share.values())
        for k in sorted(open_, key=lambda k: (-weights[k], k))[:rest]:
            share[k] += 1
        for k in open_:
            take = min(share[k], sizes[k] - quota[k])
            quota[k] += take
            left -= take
        open_ = [k for k in open_ if quota[k] < sizes[k]]
    return quota


def mix(
    parts: Mapping[str, Sequence[Record]],
    *,
    size: int,
    seed: int,
    val_share: float = 0.025,
    weights: Mapping[str, float] | None = None,
    drop_math: bool = True,
) -> Mix:
    """Sample a fixed-size SFT set from several sources, deterministically by `seed`.

    Exact duplicates (same prompt and response) are dropped first, then math-looking examples
    if `drop_math` (language sets). Defaults follow the follow-up paper: 80k examples, 2k
    (2.5 %) of them held out for validation.

    Args:
        parts: records by source name.
        size: target total (train + validation); fewer if the sources run out.
        seed: sampling and shuffling seed; same inputs and seed give the same output.
        val_share: fraction of the mix held out for validation.
        weights: relative share per source (default: equal). Given, it must name every
            source of `parts` (0 leaves one out), each weight a real number (not bool), finite
            and >= 0, not all 0: a dict naming only some would silently drop the others.
        drop_math: drop records `looks_like_math` flags.

    Returns:
        A `Mix`.
    """
    if size <= 0:
        raise ValueError(f"size must be positive, got {size}")
    if not 0 <= val_share < 1:
        raise ValueError(f"val_share must be in [0, 1), got {val_share}")
    weights = dict(weights) if weights is not None else dict.fromkeys(parts, 1.0)
    unknown = set(weights) - set(parts)
    if unknown:
        raise ValueError(f"weights for sources not in parts: {sorted(unknown)}")
    if missing := sorted(set(parts) - set(weights)):
        raise ValueError(
            f"weights name no weight for sources {missing} (of {sorted(parts)}): give each "
            "source its weight (0 leaves one out)"
        )
    # a real number each (bool is an int to Python, a str would fail in the sums below)
    if bad := {k: w for k, w in weights.items() if isinstance(w, bool) or not isinstance(w, numbers.Real)}:  # fmt: skip
        raise ValueError(f"weights must be numbers, got {bad}")
    if bad := {k: w for k, w in weights.items() if not 0 <= w < float("inf")}:
        raise ValueError(f"weights must be finite and >= 0, got {bad}")
    if weights and not sum(weights.values()) > 0:  # all 0: an empty mix, silently
        raise ValueError(f"weights must not all be 0 (at least one source must be drawn), got {weights}")  # fmt: skip
    rng = random.Random(seed)
    seen: set[tuple[str, str]] = set()
    clean: dict[str, list[Record]] = {}
    dropped_math = dropped_dup = 0
    for name in sorted(parts):  # sorted: the result must not depend on dict order
        keep = []
        for r in parts[name]:
            key = (r["prompt"], r["response"])
            if key in seen:
                dropped_dup += 1
                continue
            seen.add(key)
            if drop_math and looks_like_math(r):
                dropped_math += 1
                continue
            keep.append(r)
        clean[name] = keep
    quota = _quotas({k: len(v) for k, v in clean.items()}, weights, size)
    chosen: list[Record] = []
    for name in sorted(clean):
        chosen += rng.sample(clean[name], quota[name])
    rng.shuffle(chosen)
    n_val = round(len(chosen) * val_share)
    return Mix(
        train=chosen[n_val:],
        validation=chosen[:n_val],
        dropped_math=dropped_math,
        dropped_duplicates=dropped_dup,
        per_source={k: v for k, v in quota.items() if v},
    )


def build_language_set(
    language: str,
    *,
    size: int = 80_000,
    seed: int = 0,
    val_share: float = 0.025,
    data_files: Mapping[str, str | Path | Sequence[str | Path]] | None = None,
    sources: Sequence[str] | None = None,
    weights: Mapping[str, float] | None = None,
) -> Mix:
    """A language's generic (math-free) SFT set from its papers' sources.

    Args:
        language: target language (code, alias or name).
        size, seed, val_share, weights: as for `mix`.
        data_files: local files per source name; a source without an entry is read from the Hub.
        sources: override the papers' source list (`LANGUAGE_SOURCES`).

    Returns:
        A `Mix` with math-looking examples removed.
    """
    lang = resolve_language(language)
    names = list(sources) if sources is not None else list(LANGUAGE_SOURCES.get(lang.code, ()))
    if not names:
        raise DataSourceError(f"no sources registered for {lang.code}; pass sources=")
    files = data_files or {}
    parts = {n: load_sft(n, language=lang.code, data_files=files.get(n)) for n in names}
    return mix(parts, size=size, seed=seed, val_share=val_share, weights=weights, drop_math=True)


def write_jsonl(records: Iterable[Mapping[str, str]], path: str | Path) -> Path:
    """Write records as JSON lines (non-ASCII \\u-escaped), atomically.

    Args:
        records: SFT records; each must have exactly the keys prompt, response, source, language.
        path: output file; its folder is created.

    Returns:
        The path written.
    """
    path = Path(path)
    lines = []
    for i, r in enumerate(records):
        if set(r) != set(RECORD_KEYS) or not all(isinstance(r[k], str) for k in RECORD_KEYS):
            raise ValueError(f"record {i} is not an SFT record {RECORD_KEYS}: {dict(r)!r}")
        # ASCII-escaped: the file then reads the same whatever encoding a consumer assumes.
        lines.append(json.dumps({k: r[k] for k in RECORD_KEYS}, ensure_ascii=True))
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, "".join(line + "\n" for line in lines))
    return path
