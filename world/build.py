"""Build the embedded world into a folder: datasets, tokenizer, pretrained base, world.json.

Run `layerswap world build --out runs/world [--seed N] [--size full|tiny] [--overwrite]`, or call
`build_world(Path("runs/world"))`.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

from spaces.world import WorldSize, world_config
from trainables.atomic import atomic_dir
from world.data import make_corpus, make_datasets
from world.lang import LANG_NAMES, make_language

MANIFEST = "world.json"
# resource level per language (the manifest also gives each one's share of pretraining documents)
RESOURCE = {"en": "high", "xa": "mid", "xb": "low"}


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


def _complete(out: Path, seed: int, size: str) -> bool:
    """An existing world with the same seed, size and version, and every listed file present."""
    from spaces.world import WORLD_VERSION

    try:
        m = json.loads((out / MANIFEST).read_text())
    except (OSError, ValueError):
        return False
    if (m.get("seed"), m.get("size"), m.get("version")) != (seed, size, WORLD_VERSION):
        return False
    return all((out / rel).is_file() for rel in m.get("sha256", {}))


def build_world(
    out: Path,
    *,
    seed: int = 0,
    size: WorldSize = "full",
    overwrite: bool = False,
    progress: bool = True,
) -> Path:
    """Generate the world (datasets, tokenizer, pretrained base model) into `out`, atomically.

    Idempotent: if `out` already holds a complete world with the same seed, size and version, it
    is returned untouched (even without `overwrite`).

    Args:
        out: output folder.
        seed: world seed; the same seed gives the same bytes on the same machine.
        size: "full" (a few CPU minutes) or "tiny" (seconds, for tests).
        overwrite: replace an existing, different world at `out`.
        progress: print progress.
    Returns:
        `out`.
    """
    out = Path(out)
    if _complete(out, seed, size):
        if progress:
            print(f"world: {out} is complete (seed {seed}, size {size}); nothing to do")
        return out
    cfg = world_config(size, seed)
    t0 = time.time()
    langs = {"en": None, "xa": make_language("xa", seed), "xb": make_language("xb", seed)}
    with atomic_dir(out, overwrite=overwrite) as tmp:
        datasets = make_datasets(cfg, langs)
        for rel, rows in datasets.items():
            _write_jsonl(tmp / rel, rows)
        docs = make_corpus(cfg, langs)
        (tmp / "corpus").mkdir()
        (tmp / "corpus/pretrain.txt").write_text(
            "".join(json.dumps(d, ensure_ascii=False) + "\n" for d in docs), encoding="utf-8"
        )
        if progress:
            print(f"world: {len(datasets)} datasets, {len(docs)} corpus docs ({time.time() - t0:.1f}s)")  # fmt: skip
        from world.model import pretrain, save_model, train_tokenizer

        # the tokenizer also sees the SFT data so instructions do not fall apart into bytes
        tok_text = docs + [r.get("inputs", "") + " " + r.get("targets", "") for rel, rows in datasets.items() if "lang_" in rel for r in rows]  # fmt: skip
        tok = train_tokenizer(tok_text, cfg.model.vocab_size)
        model, loss = pretrain(docs, tok, cfg.model, seed, progress=progress)
        save_model(model, tok, tmp / "base")
        shares = _shares(cfg)
        files = sorted(p for p in tmp.rglob("*") if p.is_file())
        manifest = {
            "seed": seed,
            "size": size,
            "version": cfg.version,
            "languages": {
                code: {
                    "name": LANG_NAMES[code],
                    "resource": RESOURCE[code],
                    "corpus_docs_share": shares[code],
                }
                for code in langs
            },
            "counts": {rel: len(rows) for rel, rows in sorted(datasets.items())}
            | {"corpus/pretrain.txt": len(docs)},
            "final_pretrain_loss": round(loss, 4),
            "config": cfg.model_dump(mode="json"),
            "model_config": json.loads((tmp / "base/config.json").read_text()),
            "sha256": {str(p.relative_to(tmp)): _sha256(p) for p in files},
        }
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    if progress:
        print(f"world: built {out} in {time.time() - t0:.1f}s (final pretrain loss {loss:.3f})")
    return out


def _shares(cfg) -> dict[str, float]:
    c = cfg.corpus
    n = {
        "en": c.en_math + c.en_text + c.en_belebele,
        "xa": c.xa_text + c.xa_parallel + c.xa_math + c.xa_belebele,
        "xb": c.xb_text + c.xb_parallel + c.xb_math + c.xb_belebele,
    }
    total = sum(n.values()) or 1
    return {k: round(v / total, 4) for k, v in n.items()}
