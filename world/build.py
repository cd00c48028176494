"""Build the embedded world into a folder: datasets, tokenizer, pretrained base, world.json.

Run `layerswap world build --out runs/world [--seed N] [--size full|tiny] [--overwrite]`, or call
`build_world(Path("runs/world"))`.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from layerswap.spaces.world import WorldConfig, WorldSize, world_config
from layerswap.trainables.outputs import OutputError, nothing_to_do, output_dir
from layerswap.world.data import instruction_rows, make_datasets, tagged_corpus, world_languages
from layerswap.world.lang import LANG_NAMES
from layerswap.world.manifest import MANIFEST, sha256_file, verify_world, world_config_of
from layerswap.world.prebuilt import check_prebuilt, reuse_base, with_shipped_base

# resource level per language (the manifest also gives each one's share of pretraining documents)
RESOURCE = {"en": "high", "xa": "mid", "xb": "low"}


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


def _already_built(out: Path, cfg: WorldConfig, overwrite: bool, progress: bool) -> bool:
    """`out` holds this world (its whole config: seed, size, version, variant) intact. The same
    world damaged is an error naming the damage unless `overwrite` (then it is rebuilt); anything
    else is left to the output policy (trainables/outputs.py: replaced only on `overwrite`, and
    only a world)."""
    seed, size = cfg.seed, cfg.size
    try:
        m = json.loads((out / MANIFEST).read_bytes())
    except (OSError, ValueError):
        return False
    try:  # fields added since (v4 candidates) read as their defaults in an older world.json
        found = WorldConfig.model_validate(m["config"])
    except (TypeError, KeyError, ValueError):
        return False
    if found != cfg:
        if not overwrite:  # the output policy would only say "already exists": say which world
            raise OutputError(
                f"{out}: holds another world ({_differs(found, cfg)}); pass --overwrite to "
                "replace it, or choose another --out"
            )
        return False
    problems = verify_world(out)
    if not problems:
        said = f"world: {out} is complete (seed {seed}, size {size}); nothing to do"
        nothing_to_do(out, said if progress else None)
        return True
    if not overwrite:
        raise ValueError(
            f"{out}: the world (seed {seed}, size {size}) is damaged: "
            f"{'; '.join(problems)}; pass --overwrite to rebuild it"
        )
    if progress:
        print(f"world: {out} is damaged ({len(problems)} problems); rebuilding it")
    return False


def _differs(found: WorldConfig, want: WorldConfig) -> str:
    """How the world on disk differs from the one asked for, in words ("seed 0, not 1")."""
    said = [f"{k} {getattr(found, k)}, not {getattr(want, k)}" for k in ("seed", "size", "version") if getattr(found, k) != getattr(want, k)]  # fmt: skip
    if said:
        return "; ".join(said)
    a, b = _leaves(found.model_dump()), _leaves(want.model_dump())
    fields = [f"{k} {a.get(k)!r}, not {b.get(k)!r}" for k in sorted(a.keys() | b.keys()) if a.get(k) != b.get(k)]  # fmt: skip
    more = f" and {len(fields) - 3} more" if len(fields) > 3 else ""
    return "another variant of this seed and size" + (f": {'; '.join(fields[:3])}{more}" if fields else "")  # fmt: skip


def _leaves(data: dict, prefix: str = "") -> dict:
    """{dotted.field: value} of a nested config dump."""
    out = {}
    for k, v in data.items():
        out |= _leaves(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v}
    return out


def build_world(
    out: Path,
    *,
    seed: int = 0,
    size: WorldSize = "full",
    overwrite: bool = False,
    progress: bool = True,
    config: WorldConfig | None = None,
    pretrain: bool = False,
) -> Path:
    """Generate the world (datasets, tokenizer, pretrained base model) into `out`, atomically.

    Idempotent: if `out` already holds a complete world with the same seed, size and version
    (every file present with the sha256 world.json lists), it is returned untouched (even
    without `overwrite`). Files and folders get the modes the umask gives new ones.

    Args:
        out: output folder.
        seed: world seed; the same seed gives the same bytes on the same machine.
        size: "full" (a few CPU minutes) or "tiny" (seconds, for tests).
        overwrite: replace an existing world at `out` that differs or is damaged.
        progress: print progress.
        config: a variant of the (size, seed) preset (spaces.world.load_variant); its seed
            and size must be `seed` and `size`. None: the preset, with the base world/bases/
            ships for it if there is one (world.prebuilt.with_shipped_base).
        pretrain: pretrain the preset's base even where world/bases/ ships one (to rebuild
            what `layerswap world export-base` then ships).
    Returns:
        `out`.
    Raises:
        ValueError: `out` holds this world but damaged (files missing or changed; named), and
            `overwrite` is off.
        OutputError (a ValueError): `out` holds something else and `overwrite` is off, or it
            is not a world layerswap wrote.
    """
    out = Path(out)
    cfg = config or world_config(size, seed)  # an unknown size fails here, before any reading
    if (cfg.seed, cfg.size) != (seed, size):
        raise ValueError(f"config is for seed {cfg.seed} size {cfg.size}, not seed {seed} size {size}")  # fmt: skip
    if config is None and not pretrain:
        cfg = with_shipped_base(cfg)
    if _already_built(out, cfg, overwrite, progress):
        return out
    shipped = None
    if cfg.model.prebuilt is not None:  # a base pretrained on a larger budget, checked up front
        shipped = check_prebuilt(cfg)
    t0 = time.time()
    langs = world_languages(cfg)
    variant = "" if config is None or config == world_config(size, seed) else " variant"
    with output_dir(out, "world", overwrite=overwrite, identity=f"seed={seed} size={size} version={cfg.version}{variant}") as tmp:  # fmt: skip
        datasets = make_datasets(cfg, langs)
        for rel, rows in datasets.items():
            _write_jsonl(tmp / rel, rows)
        tagged = tagged_corpus(cfg, langs)
        docs = [doc for _, doc in tagged]
        (tmp / "corpus").mkdir()
        (tmp / "corpus/pretrain.txt").write_text(
            "".join(json.dumps(d, ensure_ascii=False) + "\n" for d in docs), encoding="utf-8"
        )
        if progress:
            print(f"world: {len(datasets)} datasets, {len(docs)} corpus docs ({time.time() - t0:.1f}s)")  # fmt: skip
        # lazy: tokenizers + torch load only when a world is really built (not for a --help,
        # a verify, or a build that finds the world already there)
        from layerswap.world.model import train_tokenizer

        # the tokenizer also sees generic instructions in the target languages, so instructions
        # do not fall apart into bytes; always the Aya rows, whichever language SFT the world
        # ships (`lang_sft_kinds`), as a real base's tokenizer predates any SFT data
        tok_text = docs + [r["inputs"] + " " + r["targets"] for rows in instruction_rows(cfg, langs) for r in rows]  # fmt: skip
        tok = train_tokenizer(tok_text, cfg.model.vocab_size, cfg.chat_template)
        loss = _make_base(cfg, tok, tagged, tmp, shipped, progress)
        manifest = _manifest(tmp, cfg, datasets, len(docs), loss)
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    if progress:
        print(f"world: built {out} in {time.time() - t0:.1f}s (final pretrain loss {loss:.3f})")
    return out


def _make_base(cfg: WorldConfig, tok, tagged: list[tuple[str, str]], tmp: Path, shipped: Path | None, progress: bool) -> float:  # fmt: skip
    """Write the base into `tmp`/base: pretrained here on the tagged corpus, or the shipped one
    (`shipped`, checked by world.prebuilt.check_prebuilt) after the tokenizer trained here is
    compared with its own. Returns the final pretraining loss."""
    if shipped is not None:
        tok.save_pretrained(tmp / "base")
        loss = reuse_base(cfg, tmp, shipped)
        if progress:
            print(f"world: base {shipped} reused")
        return loss
    from layerswap.world.model import pretrain, save_model  # lazy: torch, as above

    docs, tags = [doc for _, doc in tagged], [t for t, _ in tagged]
    model, loss = pretrain(docs, tok, cfg.model, cfg.seed, progress=progress, tags=tags)
    save_model(model, tok, tmp / "base")
    return loss


def _manifest(tmp: Path, cfg: WorldConfig, datasets: dict[str, list], n_docs: int, loss: float) -> dict:  # fmt: skip
    """world.json's content for the world written in `tmp`: what it is, its counts and config,
    and the sha256 of every file already there."""
    shares = _shares(cfg)
    files = sorted(p for p in tmp.rglob("*") if p.is_file())
    return {
        "seed": cfg.seed,
        "size": cfg.size,
        "version": cfg.version,
        "languages": {
            code: {
                "name": LANG_NAMES[code],
                "resource": RESOURCE[code],
                "corpus_docs_share": shares[code],
            }
            for code in RESOURCE
        },
        "counts": {rel: len(rows) for rel, rows in sorted(datasets.items())}
        | {"corpus/pretrain.txt": n_docs},
        # a grafted base's: its graft stage's, on the target documents and the replay
        "final_pretrain_loss": round(loss, 4),
        "config": cfg.model_dump(mode="json"),
        "model_config": json.loads((tmp / "base/config.json").read_text()),
        "sha256": {str(p.relative_to(tmp)): sha256_file(p) for p in files},
    }


def _shares(cfg) -> dict[str, float]:
    c = cfg.corpus
    n = {
        "en": c.en_math + c.en_text + c.en_belebele,
        "xa": c.xa_text + c.xa_parallel + c.xa_math + c.xa_belebele + c.xa_instructions,
        "xb": c.xb_text + c.xb_parallel + c.xb_math + c.xb_belebele,
    }
    total = sum(n.values()) or 1
    return {k: round(v / total, 4) for k, v in n.items()}


__all__ = ["MANIFEST", "build_world", "sha256_file", "verify_world", "world_config_of"]
