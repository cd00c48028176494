"""The merge engine on disk: a recipe streamed from safetensors checkpoints to a new checkpoint.

Run it as `layerswap merge RECIPE.yaml --out DIR` (trainables.merge.api.merge sends full-weight
recipes here); `merge_to_disk` is the function.
Everything is validated before the first byte is written; output appears atomically.
"""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

import torch
from tqdm.auto import tqdm

from layerswap.spaces.base import is_hub_id
from layerswap.spaces.recipe import Recipe, dump_recipe
from layerswap.trainables.merge.arch import arch_differences, check_model_type, num_layers
from layerswap.trainables.merge.assembly import build_assembly, primary_ref, recipe_refs
from layerswap.trainables.merge.checkpoint import (
    FLOAT_TAGS,
    Checkpoint,
    CheckpointError,
    byte_view,
)
from layerswap.trainables.merge.methods import warn_unused_sides
from layerswap.trainables.merge.modelcard import model_card
from layerswap.trainables.merge.ops import mean_row_mav, op_kind, row_chunks
from layerswap.trainables.merge.shard_writer import OutSpec, ShardWriter
from layerswap.trainables.merge.terms import Assembly, Linear, Op, Terms
from layerswap.trainables.merge.threads import run_in_threads
from layerswap.trainables.merge.tokenizer_match import check_same_tokenizer
from layerswap.trainables.model_files import MODEL_FILES, MODEL_SKIP
from layerswap.trainables.model_ids import content_recipe_id
from layerswap.trainables.outputs import check_output, output_dir
from layerswap.trainables.storage import is_uri, local_copy

CHUNK_ELEMS = 8 * 1024 * 1024  # 32 MiB of float32 per source per step bounds peak memory
DEFAULT_SHARD_BYTES = 5 * 1024**3
MAX_WORKERS = 4  # threads; merging is memory-bandwidth bound beyond a few cores
# Files other than weights that make a checkpoint usable; copied from the primary expert.
SIDE_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
    "vocab.json",
    "merges.txt",
)
RECIPE_FILE = "layerswap_recipe.yaml"


def local_refs(refs: list[str]) -> list[Path]:
    """The recipe references that are local folders (the inputs an output must keep clear of)."""
    return [p for p in (Path(r).expanduser() for r in refs if not is_uri(r)) if p.exists()]


def resolve_ref(ref: str) -> Path:
    """A local checkpoint folder for a recipe reference (a path, a storage URI, or a hub id
    when online); a URI's folder is its local copy (trainables.storage.local_copy)."""
    if is_uri(ref):
        try:
            path = local_copy(ref)
        except OSError as e:  # missing, no credentials: the message names the URI
            raise CheckpointError(str(e)) from None
        if not path.is_dir():
            raise CheckpointError(f"{ref}: expected a checkpoint folder, found a file")
        return path
    path = Path(ref).expanduser()
    if path.is_dir():
        return path
    if path.exists():
        raise CheckpointError(f"{ref}: expected a checkpoint folder, found a file")
    if is_hub_id(ref):
        from huggingface_hub import snapshot_download

        try:
            # prefetch's list: a checkpoint prefetched for an offline merge has what this reads
            return Path(
                snapshot_download(ref, allow_patterns=MODEL_FILES, ignore_patterns=MODEL_SKIP)
            )
        except Exception as e:  # offline, unknown repo, auth: one line naming both places looked
            raise CheckpointError(
                f"{ref}: no checkpoint folder at {path.absolute()}, and not downloadable as a "
                f"Hub repository ({_first_line(e)})"
            ) from None
    # A relative path was first looked for beside the config that names it (spaces.base's path
    # rule); only this fallback, the working folder, is known here.
    where = "" if path.is_absolute() else "; nor beside the config file that names it"
    raise CheckpointError(f"{ref}: checkpoint folder not found (no folder at {path.absolute()}{where})")  # fmt: skip


def _first_line(e: Exception) -> str:
    """`Type: first line` of an exception: huggingface_hub's errors run to several lines of
    advice after a first line that says why (`Got: ConnectError: ...`, offline mode, 404)."""
    text = next((ln.strip() for ln in str(e).splitlines() if ln.strip()), "")
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def open_checkpoints(refs: list[str]) -> dict[str, Checkpoint]:
    """Open and cross-check every checkpoint a recipe names (architecture, tensors, tokenizer).

    Raises:
        CheckpointError / ArchitectureError / TokenizerMismatch naming the folder, field,
        tensor or tokenizer file that disagrees.
    """
    ckpts = {ref: Checkpoint.open(resolve_ref(ref)) for ref in refs}
    first_ref = refs[0]
    first = ckpts[first_ref]
    adapter = "peft_type" in first.config
    if not adapter:
        check_model_type(first.config, str(first.root / "config.json"))
    for _ref, ck in ckpts.items():
        if ck is first:
            continue
        if ("peft_type" in ck.config) != adapter:
            kinds = ("a PEFT adapter", "a full checkpoint")
            raise CheckpointError(
                f"{first.root} is {kinds[not adapter]} but {ck.root} is {kinds[adapter]}; all "
                "checkpoints of a merge must be one kind"
            )
        for field, a, b in arch_differences(first.config, ck.config) if not adapter else ():
            raise CheckpointError(
                f"different architectures: config.json field {field!r} is {a!r} in "
                f"{first.root} but {b!r} in {ck.root}"
            )
        missing = sorted(set(first.tensors) - set(ck.tensors))
        extra = sorted(set(ck.tensors) - set(first.tensors))
        if missing or extra:
            parts = []
            if missing:
                parts.append(f"missing {len(missing)} tensor(s), e.g. {missing[:3]}")
            if extra:
                parts.append(f"has {len(extra)} extra tensor(s), e.g. {extra[:3]}")
            raise CheckpointError(f"{ck.root}: compared with {first.root}, " + "; ".join(parts))
        for name, info in first.tensors.items():
            other = ck.tensors[name]
            if other.shape != info.shape or other.dtype != info.dtype:
                raise CheckpointError(
                    f"tensor {name!r}: {list(info.shape)} {info.dtype} in {first.root} but "
                    f"{list(other.shape)} {other.dtype} in {ck.root}"
                )
    check_same_tokenizer([ck.root for ck in ckpts.values()])
    return ckpts


def all_finite(t: torch.Tensor) -> bool:
    # One vectorised min/max pass: NaN propagates to both, +Inf shows in the max and -Inf in the
    # min. torch.isfinite(t).all() on bf16 has no vectorised CPU kernel and is ~10-50x slower.
    if not t.is_floating_point() or not t.numel():
        return True
    lo, hi = torch.aminmax(t)
    return bool(torch.isfinite(lo)) and bool(torch.isfinite(hi))


def check_finite(t: torch.Tensor, ck: Checkpoint | Path | str, name: str) -> None:
    """The one check of an input's weights (merge inputs, a training base): CheckpointError
    naming the checkpoint (`ck`, or its root) and the tensor when `t` holds a NaN or an Inf."""
    if not all_finite(t):
        where = ck.root if isinstance(ck, Checkpoint) else ck
        raise CheckpointError(f"{where}: tensor {name!r} contains NaN or Inf")


def check_checkpoint_finite(ck: Checkpoint, step: int = 64 << 20) -> None:
    """`check_finite` over every float tensor of `ck`, window by window through the page cache
    (resident memory bounded by `step` bytes): a training base is checked before its run is
    marked, as a merge checks its inputs.

    Raises:
        CheckpointError naming the checkpoint and the first tensor holding a NaN or an Inf.
    """
    for name, info in ck.tensors.items():
        if info.dtype not in FLOAT_TAGS:
            continue
        per = max(1, step // info.itemsize)
        for start in range(0, info.numel, per):
            with ck.mapped(name, start, min(per, info.numel - start)) as t:
                check_finite(t, ck, name)


def copy_checked(src: Checkpoint, name: str, writer: ShardWriter, step: int) -> None:
    """Copy one tensor whole from `src` to `writer`: checked in place, copied in the kernel.

    Each window is checked through a read-only mmap of the page cache (no copy into user
    space) and then copied with copy_file_range; the window is unmapped before the next one,
    so resident memory stays bounded by `step`.
    """
    info = src.tensors[name]
    fd = src.fd(info.path)
    step -= step % info.itemsize
    for off in range(0, info.nbytes, step) or [0]:
        n = min(step, info.nbytes - off)
        if info.dtype in FLOAT_TAGS and n:
            with src.mapped(name, off // info.itemsize, n // info.itemsize) as t:
                check_finite(t, src, name)
        writer.copy_range(name, fd, info.start + off, n)


class _Buffers:
    """Work tensors reused across chunks (fresh MiB-sized tensors are page-faulted each time)."""

    def __init__(self) -> None:
        self._b: dict[object, torch.Tensor] = {}

    def get(self, key: object, n: int, dtype: torch.dtype) -> torch.Tensor:
        b = self._b.get(key)
        if b is None or b.numel() < n or b.dtype != dtype:
            b = self._b[key] = torch.empty(max(n, CHUNK_ELEMS), dtype=dtype)
        return b[:n]


def disk_mav_oracle(ckpts: dict[str, Checkpoint], base: str) -> Callable[[Terms], float]:
    """Mean row-wise MAV of (combination - base) over all 1-D/2-D tensors, streamed by rows."""
    cache: dict[Terms, float] = {}
    shapes = {n: i.shape for n, i in ckpts[base].tensors.items() if i.dtype in FLOAT_TAGS}

    def read(ref: str, name: str, start: int, count: int) -> torch.Tensor:
        t = ckpts[ref].read(name, start, count)
        check_finite(t, ckpts[ref], name)
        return t

    def mav(terms: Terms) -> float:
        if terms not in cache:
            cache[terms] = mean_row_mav(terms, base, shapes, read, CHUNK_ELEMS)
        return cache[terms]

    return mav


def _depth(ckpts: dict[str, Checkpoint]) -> int:
    first = next(iter(ckpts.values()))  # open_checkpoints has checked that all agree
    return num_layers(first.config, str(first.root / "config.json"))


def open_refs_depth(recipe: Recipe) -> tuple[dict[str, Checkpoint], int]:
    """Open (and cross-check) a recipe's checkpoints; returns them with the depth. Caller closes."""
    ckpts = open_checkpoints(recipe_refs(recipe))
    return ckpts, _depth(ckpts)


def assembly_for(recipe: Recipe, ckpts: dict[str, Checkpoint]) -> tuple[Assembly, int]:
    """Build the per-tensor assembly for opened checkpoints. Returns (assembly, num_layers)."""
    first = next(iter(ckpts.values()))
    depth = _depth(ckpts)
    mav = disk_mav_oracle(ckpts, recipe.base) if recipe.base is not None else None
    return build_assembly(recipe, first.tensors, depth, mav), depth


def write_assembly(
    assembly: Assembly,
    ckpts: dict[str, Checkpoint],
    out_dir: Path,
    *,
    max_shard_bytes: int,
    progress: bool = False,
) -> None:
    """Execute an assembly into safetensors shards in `out_dir`, one chunk at a time.

    Every tensor has a fixed offset in the output, so tensors are independent tasks: a few
    threads take them largest first (whole-tensor kernel copies and float32 merges both
    release the GIL), which keeps the cores busy until the end. An interrupt stops them after
    the tensor each is on (`run_in_threads`), before the shard files are closed.
    """
    for op in assembly.values():
        op_kind(op)  # an op the table does not know raises, naming it, before a file exists
    first = next(iter(ckpts.values()))
    order = sorted(assembly, key=lambda n: (str(first.tensors[n].path), first.tensors[n].start))
    specs = [OutSpec(n, first.tensors[n].dtype, first.tensors[n].shape) for n in order]
    local = threading.local()  # per-thread work buffers

    def run(name: str) -> None:  # on a worker thread; `writer` and `bar` exist by then
        op = assembly[name]
        if op.take is not None:
            copy_checked(ckpts[op.take], name, writer, CHUNK_ELEMS * 4)
        else:
            if not hasattr(local, "bufs"):
                local.bufs = _Buffers()
            _write_computed(name, op, ckpts, writer, local.bufs)
        bar.update(first.tensors[name].nbytes)

    workers = max(1, min(MAX_WORKERS, os.cpu_count() or 1))
    largest_first = sorted(order, key=lambda n: -first.tensors[n].nbytes)
    # Files are opened inside the `with`: an interrupt anywhere closes what is open.
    with (
        ShardWriter(out_dir, specs, max_shard_bytes) as writer,
        tqdm(
            total=writer.total_bytes, unit="B", unit_scale=True, desc="merge", disable=not progress
        ) as bar,
    ):
        writer.open()
        run_in_threads(largest_first, run, workers, name="layerswap-merge")
    writer.close()


def _write_computed(
    name: str, op: Op, ckpts: dict[str, Checkpoint], writer: ShardWriter, bufs: _Buffers
) -> None:
    """One merged (not taken) tensor: row chunk by row chunk if its op allows, else whole."""
    info = next(iter(ckpts.values())).tensors[name]
    kind = op_kind(op)
    if not kind.rowwise:
        parts = [_read_checked(ckpts[ref], name) for ref in op.refs]
        out = kind.apply(op, parts, None)
        if not all_finite(out):  # the inputs are finite (checked): the method overflowed
            raise CheckpointError(_overflow(name, op))
        writer.write(name, byte_view(out.contiguous()))
        return
    if info.dtype not in FLOAT_TAGS:
        raise CheckpointError(f"tensor {name!r}: cannot average a {info.dtype} tensor")
    for start, count in row_chunks(info.shape, CHUNK_ELEMS):
        with ExitStack() as stack:
            # Inputs straight from the page cache: no copy into user space before the math.
            parts = [stack.enter_context(ckpts[ref].mapped(name, start, count)) for ref in op.refs]
            out = bufs.get("out", count, info.torch_dtype)
            kind.apply(op, parts, out)
            if not all_finite(out):
                # A positive combination is non-finite iff an input is (or it overflows): name
                # the input, checking the inputs only on this rare path.
                for ref, t in zip(op.refs, parts, strict=True):
                    check_finite(t, ckpts[ref], name)
                raise CheckpointError(_overflow(name, op))
        writer.write(name, byte_view(out))


def _overflow(name: str, op: Op) -> str:
    """Why a merged tensor of finite inputs is not finite: the combination's own numbers."""
    if isinstance(op, Linear):
        how = "weights " + ", ".join(f"{c:g}" for _, c in op.terms)
    else:
        how = f"scale {op.scale:g}, weights " + ", ".join(f"{w:g}" for w in op.weights)
    return (
        f"tensor {name!r}: the merge overflows to a non-finite value ({how}); nothing was "
        "written (use smaller weights or scale)"
    )


def _read_checked(ck: Checkpoint, name: str) -> torch.Tensor:
    t = ck.read(name)
    check_finite(t, ck, name)
    return t


def merge_to_disk(
    recipe: Recipe,
    out: str | Path,
    *,
    overwrite: bool = False,
    max_shard_bytes: int = DEFAULT_SHARD_BYTES,
    progress: bool = False,
    recorded_as: Recipe | None = None,
) -> Path:
    """Apply a recipe to checkpoints on disk and write the merged checkpoint.

    Args:
        recipe: a validated recipe.
        out: output folder; must not exist unless `overwrite`.
        max_shard_bytes: largest safetensors shard to write.
        progress: show a progress bar.
        recorded_as: the recipe the folder's recipe file and model card name: `recipe` with its
            checkpoints where they will be once the folder holding them is renamed into place
            (the merge-only demo builds its family and merge in a hidden sibling); None: `recipe`.
    Returns:
        The output folder, complete: weights (+ index), config, tokenizer, recipe, model card.
    """
    out = Path(out)
    refs = recipe_refs(recipe)
    check_output(out, "merge", overwrite=overwrite, inputs=local_refs(refs))
    ckpts = open_checkpoints(refs)
    try:
        if "peft_type" in next(iter(ckpts.values())).config:
            raise CheckpointError(
                f"{next(iter(ckpts.values())).root}: is a PEFT adapter; use trainables.merge.api.merge (layerswap merge does this for layer_swap recipes)"
            )
        assembly, depth = assembly_for(recipe, ckpts)
        warn_unused_sides(recipe, depth)
        primary = ckpts[primary_ref(recipe)]
        rid = content_recipe_id(recipe)  # after validation: a bad recipe is named first
        with output_dir(out, "merge", overwrite=overwrite, identity=rid) as tmp:
            write_assembly(assembly, ckpts, tmp, max_shard_bytes=max_shard_bytes, progress=progress)
            copy_side_files(primary.root, tmp)
            shown = recipe if recorded_as is None else recorded_as
            (tmp / RECIPE_FILE).write_text(dump_recipe(shown, rid))
            (tmp / "README.md").write_text(model_card(shown, depth, rid))
    finally:
        for ck in ckpts.values():
            ck.close()
    return out


def copy_side_files(src: Path, dst: Path) -> None:
    """Config, generation config and tokenizer files of `src`, as they are."""
    for name in SIDE_FILES:
        if (src / name).is_file():
            shutil.copyfile(src / name, dst / name)
