"""Ship a pretrained world base and reuse it: the fallback for bases too costly for `world build`.

`layerswap world export-base WORLD --name NAME` copies a built world's base into
world/bases/NAME and prints the `model: {prebuilt: ...}` entry for the world's config;
`layerswap world build` with that entry checks the world it builds is the one the base was
pretrained for and copies the base instead of pretraining it (DESIGN.md §3).
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from pathlib import Path

from spaces.world import BASE_NAME, PrebuiltBase, WorldConfig
from world.build import sha256_file

BASES_DIR = Path(__file__).parent / "bases"
MAX_MB = 25.0  # what the repository takes per shipped base (issue 15)
# the files `world build` writes into base/; the tokenizer's are rebuilt and compared, not copied
MODEL_FILES = ("config.json", "generation_config.json", "model.safetensors")


def config_sha256(cfg: WorldConfig) -> str:
    """sha256 of `cfg` as canonical JSON with `model.prebuilt` left out: the world a base is for.

    Args:
        cfg: a world config (seed, size and version included).
    Returns:
        64 hex digits; equal for a world pretrained here and the same world reusing a base.
    """
    data = cfg.model_dump(mode="json")
    data["model"].pop("prebuilt", None)
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def base_entry(world: Path, cfg: WorldConfig, name: str, loss: float) -> PrebuiltBase:
    """The prebuilt entry for the base in the built world `world` (checked intact beforehand).

    Args:
        world: a world folder holding base/ and corpus/pretrain.txt.
        cfg: its config (world.build.world_config_of).
        name: the folder name the base gets under world/bases/.
        loss: the world's final pretraining loss (world.json).
    Returns:
        the validated PrebuiltBase.
    """
    base = Path(world) / "base"
    files = {p.name: sha256_file(p) for p in sorted(base.iterdir()) if p.is_file()}
    return PrebuiltBase(
        name=name,
        config_sha256=config_sha256(cfg),
        corpus_sha256=sha256_file(Path(world) / "corpus/pretrain.txt"),
        final_pretrain_loss=loss,
        files=files,
    )


def check_size(base: Path, max_mb: float = MAX_MB) -> float:
    """Size of the base folder's files in MB; a ValueError naming it when over `max_mb`."""
    mb = sum(p.stat().st_size for p in Path(base).iterdir() if p.is_file()) / 1e6
    if mb > max_mb:
        raise ValueError(f"{base}: the base is {mb:.1f} MB, over the {max_mb:g} MB a shipped base may take")  # fmt: skip
    return mb


def reuse_base(cfg: WorldConfig, world_tmp: Path, bases_dir: Path | None = None) -> float:
    """Put the shipped base `cfg.model.prebuilt` into `world_tmp`/base after checking it fits.

    The world being built must be the one the base was pretrained for: the same config (by
    sha256, `prebuilt` aside), the same corpus bytes (so the generator has not drifted), and the
    same tokenizer (the caller saved the freshly trained one into `world_tmp`/base already);
    every shipped file must have its recorded sha256.

    Args:
        cfg: the world's config, with `model.prebuilt` set.
        world_tmp: the world folder being written (corpus/pretrain.txt and base/ tokenizer in it).
        bases_dir: where shipped bases live; None: BASES_DIR (world/bases/).
    Returns:
        the base's final pretraining loss, as recorded.
    Raises:
        ValueError: naming the first mismatch (config, corpus, tokenizer or a shipped file).
    """
    pb = cfg.model.prebuilt
    assert pb is not None, "reuse_base needs cfg.model.prebuilt"
    src, where = Path(bases_dir or BASES_DIR) / pb.name, f"model.prebuilt {pb.name!r}"
    if config_sha256(cfg) != pb.config_sha256:
        raise ValueError(f"{where} was pretrained for another world config (seed, size, version or a field differs); pretrain this one with `layerswap world build` and export it again")  # fmt: skip
    if sha256_file(world_tmp / "corpus/pretrain.txt") != pb.corpus_sha256:
        raise ValueError(f"{where}: the corpus generated now differs from the one it was pretrained on (has world/data.py changed?); pretrain and export it again")  # fmt: skip
    missing = sorted(set(MODEL_FILES) - set(pb.files))
    if missing:
        raise ValueError(f"{where}: files lists no {', '.join(missing)}")
    for name, digest in sorted(pb.files.items()):
        made = world_tmp / "base" / name
        if name not in MODEL_FILES:  # a tokenizer file: the one trained here must be the same
            if not made.is_file() or sha256_file(made) != digest:
                raise ValueError(f"{where}: {name} trained now differs from the shipped one (has the tokenizer or its library changed?)")  # fmt: skip
            continue
        shipped = src / name
        if not shipped.is_file():
            raise ValueError(f"{where}: {shipped} is missing")
        if sha256_file(shipped) != digest:
            raise ValueError(f"{where}: {shipped} does not have the sha256 the config records")
        shutil.copyfile(shipped, made)
    return pb.final_pretrain_loss


def export_base(world: Path, name: str, *, bases_dir: Path | None = None, overwrite: bool = False, max_mb: float = MAX_MB) -> PrebuiltBase:  # fmt: skip
    """Copy the base of the intact built world `world` into `bases_dir`/`name`, atomically.

    Args:
        world: a world folder `world build` wrote (every file as world.json lists it).
        name: the folder name under `bases_dir`.
        bases_dir: where shipped bases live; None: BASES_DIR (world/bases/).
        overwrite: replace an existing base of that name.
        max_mb: refuse a base larger than this.
    Returns:
        the entry to set as the world config's `model.prebuilt` (`variant_yaml` writes it out).
    Raises:
        ValueError: the world is damaged or not a world (named), the base is too large, or
            the destination holds something else (the output policy).
    """
    from trainables.outputs import output_dir
    from world.build import MANIFEST, verify_world, world_config_of

    if not re.fullmatch(BASE_NAME, name):
        raise ValueError(f"base name {name!r}: expected a plain folder name (letters, digits, . _ -)")  # fmt: skip
    world = Path(world)
    problems = verify_world(world)
    if problems:
        raise ValueError(f"{world}: not an intact world: {'; '.join(problems)}")
    cfg = world_config_of(world)
    loss = json.loads((world / MANIFEST).read_bytes())["final_pretrain_loss"]
    check_size(world / "base", max_mb)
    entry = base_entry(world, cfg, name, loss)
    with output_dir(Path(bases_dir or BASES_DIR) / name, "base", overwrite=overwrite, identity=f"seed={cfg.seed} size={cfg.size} version={cfg.version} config={entry.config_sha256[:12]}") as tmp:  # fmt: skip
        for file in entry.files:
            shutil.copyfile(world / "base" / file, tmp / file)
    return entry


def variant_yaml(cfg: WorldConfig, entry: PrebuiltBase) -> str:
    """A world variant YAML that rebuilds the world of `cfg` reusing the base `entry`: every
    field of `cfg` (seed, size and version aside: the command line sets them) and
    `model.prebuilt`."""
    import yaml

    from spaces.world import FIXED

    data = {k: v for k, v in cfg.model_dump(mode="json").items() if k not in FIXED}
    data["model"]["prebuilt"] = entry.model_dump(mode="json")
    return yaml.safe_dump(data, sort_keys=False)
