"""Ship a pretrained world base and reuse it: the fallback for bases too costly for `world build`.

`layerswap world export-base WORLD --name NAME` copies a built world's base into
world/bases/NAME and prints the world's variant YAML with a `model: {prebuilt: ...}` entry;
`layerswap world build --config` with it checks the world it builds is the one the base was
pretrained for and copies the base instead of pretraining it (docs/world/index.md).
A base exported as NAME = `preset_base_name(cfg)` (e.g. full-v4-seed0) is the one `world build`
reuses for that preset without any --config (`with_shipped_base`).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from layerswap.spaces.world import FILE_NAME, FIXED, SHIPPED_FILES, PrebuiltBase, WorldConfig
from layerswap.trainables.outputs import output_dir
from layerswap.world.manifest import MANIFEST, sha256_file, verify_world, world_config_of

BASES_DIR = Path(__file__).parent / "bases"
MAX_MB = 25.0  # what the repository takes per shipped base (issue 15)
CONFIG_FILE = "world_config.json"  # in world/bases/NAME: the world the base was pretrained for
MODEL_FILES = tuple(f for f in SHIPPED_FILES if f != CONFIG_FILE)  # copied into the world's base/
ENTRY_FILE = "prebuilt.json"  # in world/bases/NAME: its `model.prebuilt` entry (the sha256s)


def preset_base_name(cfg: WorldConfig) -> str:
    """The folder under world/bases/ that ships the base of `cfg`'s preset, e.g. "full-v4-seed0"."""
    return f"{cfg.size}-v{cfg.version}-seed{cfg.seed}"


def with_shipped_base(cfg: WorldConfig, bases_dir: Path | None = None) -> WorldConfig:
    """`cfg` (a preset) with `model.prebuilt` set when world/bases/ ships its base, else `cfg`.

    Args:
        cfg: a preset from spaces.world.world_config.
        bases_dir: where shipped bases live; None: BASES_DIR (world/bases/).
    Returns:
        the config `world build` builds for that preset.
    Raises:
        ValueError: the shipped entry file is not a valid entry (naming the file).
    """
    path = Path(bases_dir or BASES_DIR) / preset_base_name(cfg) / ENTRY_FILE
    if not path.is_file():
        return cfg
    try:
        entry = PrebuiltBase.model_validate_json(path.read_bytes())
    except ValueError as e:
        raise ValueError(f"{path}: not a shipped base's entry ({e})") from e
    return cfg.model_copy(update={"model": cfg.model.model_copy(update={"prebuilt": entry})})


def _config_json(cfg: WorldConfig) -> dict:
    data = cfg.model_dump(mode="json")
    data["model"].pop("prebuilt", None)  # the entry points at the base, it is not the world
    return data


def config_differences(here: WorldConfig, there: WorldConfig) -> list[str]:
    """The dotted fields whose values differ between two world configs, `model.prebuilt` aside.

    Returns:
        e.g. ["seed: 1 here, 0 in the base", "model.steps: 9 here, 8 in the base"].
    """

    def flat(d: dict, prefix: str = "") -> dict[str, object]:
        out = {}
        for k, v in d.items():
            out |= flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v}
        return out

    a, b = flat(_config_json(here)), flat(_config_json(there))
    return [f"{k}: {a.get(k)!r} here, {b.get(k)!r} in the base" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]  # fmt: skip


def check_prebuilt(cfg: WorldConfig, bases_dir: Path | None = None) -> Path:
    """Before any work: the shipped base `cfg.model.prebuilt` is there, intact, and for `cfg`.

    Args:
        cfg: the world's config, with `model.prebuilt` set.
        bases_dir: where shipped bases live; None: BASES_DIR (world/bases/).
    Returns:
        the base's folder.
    Raises:
        ValueError: the folder or a file is missing, a file's sha256 is not the entry's, or the
            base was pretrained for another world config (the differing fields named).
    """
    pb = cfg.model.prebuilt
    if pb is None:
        raise ValueError("model.prebuilt: not set")
    src = Path(bases_dir or BASES_DIR) / pb.name
    if not src.is_dir():
        raise ValueError(f"model.prebuilt: no shipped base {src}")
    for name, digest in sorted(pb.files.items()):
        if not (src / name).is_file():
            raise ValueError(f"model.prebuilt {pb.name!r}: {src / name} is missing")
        if sha256_file(src / name) != digest:
            raise ValueError(f"model.prebuilt {pb.name!r}: {src / name} does not have the sha256 the entry records")  # fmt: skip
    try:
        there = WorldConfig.model_validate(json.loads((src / CONFIG_FILE).read_bytes()))
    except ValueError as e:
        raise ValueError(f"{src / CONFIG_FILE}: not a world config ({e})") from e
    diff = config_differences(cfg, there)
    if diff:
        raise ValueError(f"model.prebuilt {pb.name!r} was pretrained for another world: {'; '.join(diff[:6])}{' ...' if len(diff) > 6 else ''}")  # fmt: skip
    return src


def reuse_base(cfg: WorldConfig, world_tmp: Path, src: Path) -> float:
    """Copy the checked base (`check_prebuilt`) into `world_tmp`/base; the corpus and the
    tokenizer just made there must be the ones it was pretrained with.

    Args:
        cfg: the world's config, with `model.prebuilt` set.
        world_tmp: the world folder being written: corpus/pretrain.txt, and base/ holding only
            the tokenizer trained now.
        src: the base's folder, from `check_prebuilt`.
    Returns:
        the base's final pretraining loss, as recorded.
    Raises:
        ValueError: naming the corpus, a tokenizer file or a copied file that differs.
    """
    pb = cfg.model.prebuilt
    where = f"model.prebuilt {pb.name!r}"
    if sha256_file(world_tmp / "corpus/pretrain.txt") != pb.corpus_sha256:
        raise ValueError(f"{where}: the corpus generated now differs from the one it was pretrained on (has world/data.py changed?); pretrain and export it again")  # fmt: skip
    base = world_tmp / "base"
    made = {p.name: sha256_file(p) for p in base.iterdir()}
    if made != pb.tokenizer_files:
        names = sorted(n for n in set(made) | set(pb.tokenizer_files) if made.get(n) != pb.tokenizer_files.get(n))  # fmt: skip
        raise ValueError(f"{where}: the tokenizer trained now differs from the base's in {', '.join(names)} (has the tokenizer or its library changed?)")  # fmt: skip
    for name in MODEL_FILES:
        shutil.copyfile(src / name, base / name)
        if sha256_file(base / name) != pb.files[name]:  # what landed, not what was read before
            raise ValueError(f"{where}: {src / name} changed while it was copied")
    return pb.final_pretrain_loss


def _listed_base_files(world: Path, table: dict[str, str]) -> dict[str, str]:
    """base/'s files as the intact world's world.json `table` lists them; an unlisted file is an
    error."""
    listed = {rel.removeprefix("base/"): d for rel, d in table.items() if rel.startswith("base/")}
    extra = sorted(p.name for p in (world / "base").iterdir() if p.name not in listed)
    if extra:
        raise ValueError(f"{world / 'base'}: {', '.join(extra)} not listed in {MANIFEST}; remove it or rebuild the world")  # fmt: skip
    missing = sorted(set(MODEL_FILES) - set(listed))
    if missing:
        raise ValueError(f"{world / MANIFEST}: lists no base/{', base/'.join(missing)}")
    return listed


def check_size(base: Path, names: list[str], max_mb: float = MAX_MB) -> float:
    """Size in MB of the files `names` in `base`.

    Args:
        base: a folder.
        names: the files that would be shipped.
        max_mb: the most a shipped base may take.
    Returns:
        the size in MB.
    Raises:
        ValueError: naming `base` and its size when over `max_mb`.
    """
    mb = sum((Path(base) / n).stat().st_size for n in names) / 1e6
    if mb > max_mb:
        raise ValueError(f"{base}: the base is {mb:.1f} MB, over the {max_mb:g} MB a shipped base may take")  # fmt: skip
    return mb


def export_base(world: Path, name: str, *, bases_dir: Path | None = None, overwrite: bool = False, max_mb: float = MAX_MB, maintainer: bool = False) -> PrebuiltBase:  # fmt: skip
    """Copy the base of the intact built world `world` into `bases_dir`/`name`, atomically.

    Args:
        world: a world folder `world build` wrote (every file as world.json lists it).
        name: the folder name under `bases_dir`.
        bases_dir: where shipped bases live; None: BASES_DIR (world/bases/).
        overwrite: replace an existing base of that name.
        max_mb: refuse a base larger than this.
        maintainer: write into the installed package (world/bases/ ships there); without it
            the output policy refuses such a destination.
    Returns:
        the entry to set as the world config's `model.prebuilt` (`variant_yaml` writes it out).
    Raises:
        ValueError: the world is damaged or not a world (named), the base is too large, or
            the destination holds something else (the output policy).
    """

    if not re.fullmatch(FILE_NAME, name):
        raise ValueError(f"base name {name!r}: expected a plain folder name (letters, digits, . _ -)")  # fmt: skip
    world = Path(world)
    problems = verify_world(world)
    if problems:
        raise ValueError(f"{world}: not an intact world: {'; '.join(problems)}")
    cfg = world_config_of(world)
    manifest = json.loads((world / MANIFEST).read_bytes())  # verified above: it parses
    listed = _listed_base_files(world, manifest["sha256"])
    check_size(world / "base", list(MODEL_FILES), max_mb)
    dest = Path(bases_dir or BASES_DIR) / name
    with output_dir(dest, "base", overwrite=overwrite, inputs=[world], identity=f"seed={cfg.seed} size={cfg.size} version={cfg.version}", maintainer=maintainer) as tmp:  # fmt: skip
        files = {}
        for f in MODEL_FILES:
            shutil.copyfile(world / "base" / f, tmp / f)
            files[f] = sha256_file(tmp / f)  # what landed
            if files[f] != listed[f]:
                raise ValueError(f"{world / 'base' / f} changed while it was copied")
        (tmp / CONFIG_FILE).write_text(json.dumps(_config_json(cfg), indent=2, sort_keys=True) + "\n")  # fmt: skip
        files[CONFIG_FILE] = sha256_file(tmp / CONFIG_FILE)
        entry = PrebuiltBase(
            name=name,
            files=files,
            tokenizer_files={f: d for f, d in listed.items() if f not in MODEL_FILES},
            corpus_sha256=sha256_file(world / "corpus/pretrain.txt"),
            final_pretrain_loss=manifest["final_pretrain_loss"],
        )
        (tmp / ENTRY_FILE).write_text(entry.model_dump_json(indent=2) + "\n")
    return entry


def variant_yaml(cfg: WorldConfig, entry: PrebuiltBase) -> str:
    """A world variant YAML that rebuilds the world of `cfg` reusing the base `entry`.

    Args:
        cfg: the built world's config.
        entry: its exported base (`export_base`).
    Returns:
        every field of `cfg` but seed, size and version (the command line sets them), with
        `model.prebuilt` set to `entry`.
    """
    import yaml

    data = {k: v for k, v in _config_json(cfg).items() if k not in FIXED}
    data["model"]["prebuilt"] = entry.model_dump(mode="json")
    return yaml.safe_dump(data, sort_keys=False)
