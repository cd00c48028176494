"""Training checkpoints without pickle: HF safetensors (or PEFT adapter) + manifest + optimizer.

A checkpoint dir holds the model as HF writes it, `layerswap_train.json` (the manifest) and
`trainer_state/`: one safetensors file of AdamW moments per parameter group, keyed by parameter
name, and `state.json` (step, samples, lr). Written atomically (trainables/atomic.py).

Only a run's newest checkpoint keeps what resuming needs beyond the weights (AdamW state, the
fp32 masters, FSDP's sharded state): resuming starts from the newest, and an expert sweep ranks
weights, not optimizer state. At 8B that state is ~96 GB a checkpoint beside 16 GB of bf16
weights, so a sweep keeping every checkpoint's would store ~7x what it reads.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from safetensors.torch import load_file, save_file

from layerswap.spaces.train_experiment import TrainExperiment, experiment_json
from layerswap.trainables.atomic import atomic_dir
from layerswap.trainables.merge.checkpoint import Checkpoint, read_header
from layerswap.trainables.train.data import stream_passes
from layerswap.trainables.train.precision import dtype_name

if TYPE_CHECKING:  # annotations only: state.py is imported by both
    from layerswap.trainables.train.data import TrainData
    from layerswap.trainables.train.modes import Prepared
    from layerswap.trainables.train.precision import Policy

MANIFEST = "layerswap_train.json"
STATE_DIR = "trainer_state"
MASTER = "master.safetensors"  # fp32 trainable weights when the HF weights are saved coarser
DCP_DIR = "dcp"  # FSDP's sharded trainer state (trainables/train/sharded.py)


def read_manifest(ckpt: str | Path) -> dict:
    """The manifest of a training checkpoint (see trainables/train/__init__.py for the keys)."""
    path = Path(ckpt) / MANIFEST
    try:
        return json.loads(path.read_text())
    except OSError as e:
        raise ValueError(f"{ckpt}: not a layerswap training checkpoint ({e.strerror})") from None


def optimizer_tensors(opt: torch.optim.Optimizer, names: dict[int, str]) -> dict[str, torch.Tensor]:
    """AdamW state as flat tensors `<param name>::<key>` (cpu, contiguous)."""
    out = {}
    for p, st in opt.state.items():
        for key, value in st.items():
            t = value if torch.is_tensor(value) else torch.tensor(float(value))
            out[f"{names[id(p)]}::{key}"] = t.detach().to("cpu").contiguous().clone()
    return out


def load_optimizer(opt: torch.optim.Optimizer, named: list[tuple[str, torch.nn.Parameter]], path: Path) -> None:  # fmt: skip
    """Restore the moments written by optimizer_tensors into a fresh optimizer over `named`.

    Through torch's own `Optimizer.load_state_dict`, which places each value by the optimizer's
    policy: the moments on their parameter's device and dtype, and `step` on the parameter's
    device for a fused (or capturable) AdamW, which is what run_setup._adamw builds on CUDA.
    Written into `opt.state` directly, `step` stayed on the CPU and a resumed GPU run's first
    fused step would fail on the mixed devices (a red-team's finding; pytorch#124133).
    """
    flat = load_file(path)
    by_name = dict(named)
    index = {id(p): i for i, p in enumerate(p for g in opt.param_groups for p in g["params"])}
    sd = opt.state_dict()
    state: dict[int, dict[str, torch.Tensor]] = {}
    for key, t in flat.items():
        name, field = key.rsplit("::", 1)
        if name not in by_name:
            raise ValueError(f"{path}: optimizer state for unknown parameter {name!r}")
        state.setdefault(index[id(by_name[name])], {})[field] = t
    sd["state"] = state
    opt.load_state_dict(sd)


def load_master(model: torch.nn.Module, ckpt: Path) -> None:
    """Copy a checkpoint's master weights (trainer_state/master.safetensors) into `model`'s
    trainable parameters, in place (they keep their own dtype and device)."""
    path = Path(ckpt) / STATE_DIR / MASTER
    if not path.is_file():
        raise ValueError(f"{ckpt}: no {STATE_DIR}/{MASTER}; cannot resume the fp32 master weights")
    flat = load_file(path)
    params = dict(model.named_parameters())
    missing = [n for n, p in params.items() if p.requires_grad and n not in flat]
    if missing:
        raise ValueError(f"{path}: no master weights for {missing[:3]} ({len(missing)} missing)")
    with torch.no_grad():
        for name, t in flat.items():
            if name not in params:
                raise ValueError(f"{path}: master weights for unknown parameter {name!r}")
            params[name].copy_(t)


def _weights(model: torch.nn.Module, policy: Policy | None) -> dict[str, torch.Tensor] | None:
    """The state dict to save in the policy's checkpoint dtype (None: the model's own)."""
    if policy is None:
        return None
    sd = model.state_dict()
    if getattr(model.config, "tie_word_embeddings", False):
        # One tensor under two names: cast apart they no longer share storage, and HF would
        # save lm_head.weight, which the base (and the merge's model) does not have.
        sd.pop("lm_head.weight", None)
    return {k: v.to("cpu", policy.save) if v.is_floating_point() else v for k, v in sd.items()}


def _master(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The trainable parameters as saved tensors (cpu, contiguous)."""
    return {
        n: p.detach().to("cpu").contiguous().clone()
        for n, p in model.named_parameters()
        if p.requires_grad
    }


def _masters_at(policy: Policy, prep: Prepared, sharded: bool) -> str | None:
    """Where a checkpoint keeps the fp32 masters apart from its HF weights (None: they are the
    HF weights, or the LoRA adapter)."""
    if sharded:
        return f"{STATE_DIR}/dcp"  # every weight's master shard, with AdamW's state
    return f"{STATE_DIR}/{MASTER}" if policy.keeps_master and not prep.is_lora else None


def build_manifest(exp: TrainExperiment, prep: Prepared, data: TrainData, step: int, samples: int, world: int, val: list[float], train_loss: float | None, policy: Policy | None = None, sharded: bool = False, fingerprint: dict | None = None) -> dict:  # fmt: skip
    """The manifest (layerswap_train.json) of a checkpoint at `step`: config, data (with the
    dataset files' `fingerprint`, trainables/data_fingerprint.py), losses."""
    n_train = sum(len(s) for s in data.streams)
    return {
        "experiment": experiment_json(exp),
        "name": exp.name,
        "kind": exp.kind,
        "language": exp.language,
        "mode": exp.mode.type,
        "base": exp.base,
        "step": step,
        "samples": samples,
        "epoch": samples / n_train,
        "passes": stream_passes(exp, data, step),  # per dataset: simultaneous streams differ
        "seed": exp.hyper.seed,
        "world_size": world,
        "hparams": exp.hyper.model_dump(mode="json"),
        "data": data.info,
        # what the dataset files held when this run read them: a rerun or resume on other
        # content is refused (data_fingerprint.resume_data_problem)
        "data_fingerprint": fingerprint,
        "val_loss": (sum(val) / len(val)) if val else None,
        "val_losses": val,
        "train_loss": train_loss,
        "is_lora": prep.is_lora,
        "groups": {g: len(v) for g, v in prep.groups.items()},
        # What the saved weights are, and whether the fp32 masters are kept beside them.
        "precision": None
        if policy is None
        else {
            **policy.describe(prep.is_lora),
            "master_weights": _masters_at(policy, prep, sharded),
        },
    }


def save_checkpoint(
    out: Path,
    *,
    model,
    tokenizer,
    optimizers: dict[str, torch.optim.Optimizer],
    names: dict[int, str],
    manifest: dict,
    state: dict,
    policy: Policy | None = None,
) -> Path:
    """Write one checkpoint dir atomically and return it.

    Args:
        out: destination (must not exist).
        model: the unwrapped model (a PeftModel writes its adapter only).
        tokenizer: saved beside the weights so the dir loads on its own.
        optimizers: group name -> AdamW.
        names: id(parameter) -> name used in the optimizer files.
        manifest: written as layerswap_train.json.
        state: loop state for resuming (JSON).
        policy: the precision policy: full weights are saved in `policy.save`, and the fp32
            master weights beside them when that is coarser (None: as the model holds them).
    """
    lora = hasattr(model, "peft_config")  # PEFT writes the adapter in its own (master) dtype
    with atomic_dir(out) as tmp:
        weights = None if lora else _weights(model, policy)
        model.save_pretrained(tmp, state_dict=weights)  # safetensors (HF and PEFT default)
        if weights is not None:
            fix_config_dtype(tmp, policy.save)
        tokenizer.save_pretrained(tmp)
        sd = tmp / STATE_DIR
        sd.mkdir()
        if policy is not None and policy.keeps_master and not lora:
            save_file(_master(model), sd / MASTER)
        for group, opt in optimizers.items():
            save_file(optimizer_tensors(opt, names), sd / f"optimizer__{group}.safetensors")
        write_run_files(tmp, manifest, state)
        bad = sorted(p.name for p in tmp.rglob("*") if p.suffix in (".bin", ".pt", ".pth", ".pkl"))
        if bad:  # never ship a pickle next to the weights
            raise RuntimeError(f"checkpoint would contain pickled files: {bad}")
    return out


def fix_config_dtype(folder: Path, dtype: torch.dtype) -> None:
    """Make config.json declare the dtype the weights were saved in (HF writes the model's)."""
    path = folder / "config.json"
    cfg = json.loads(path.read_text())

    name = dtype_name(dtype)
    if cfg.get("dtype") != name:
        cfg["dtype"] = name
        path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def write_run_files(folder: Path, manifest: dict, state: dict) -> None:
    """trainer_state/state.json (the loop's position) and the manifest, stamped with the time.

    The manifest lists the model's files with their sizes (`files`: everything outside
    trainer_state/, which `resume_state: newest` prunes later): a checkpoint uploaded to a
    store is complete only when they are all there, since Ray uploads a folder's files in no
    fixed order (checkpoint_store.checkpoints).
    """
    (folder / STATE_DIR / "state.json").write_text(json.dumps(state, indent=1, sort_keys=True))
    files = {
        p.relative_to(folder).as_posix(): p.stat().st_size
        for p in folder.rglob("*")
        if p.is_file() and p.name != MANIFEST and p.relative_to(folder).parts[0] != STATE_DIR
    }
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    full = {**manifest, "files": dict(sorted(files.items())), "created_at": stamp}
    (folder / MANIFEST).write_text(json.dumps(full, indent=1, sort_keys=True))


def read_state(ckpt: Path) -> dict:
    """A checkpoint's trainer_state/state.json (step, samples, lr, total_steps, resumable).

    Raises:
        ValueError naming the file when it is missing or not JSON.
    """
    path = Path(ckpt) / STATE_DIR / "state.json"
    try:
        return json.loads(path.read_text())
    except OSError as e:
        raise ValueError(f"{path}: cannot read the trainer state ({e.strerror})") from None
    except ValueError as e:  # not JSON (e.g. cut short)
        raise ValueError(f"{path}: not a readable trainer state ({e})") from None


def resume_problem(ckpt: Path) -> str | None:
    """Why a run cannot continue from `ckpt`, or None: its trainer state unreadable or dropped,
    or a file it resumes from (weights, AdamW moments, fp32 masters) truncated or corrupt. Only
    headers are read (the merge's check, against each file's size): no tensor is loaded.

    Args:
        ckpt: a checkpoint folder.
    Returns:
        one line naming the file, or None when the checkpoint is intact.
    """
    sd = Path(ckpt) / STATE_DIR
    try:
        if not read_state(ckpt).get("resumable", True):
            return f"{ckpt}: its resume state was dropped (only a run's newest checkpoint keeps it)"
        masters = (read_manifest(ckpt).get("precision") or {}).get("master_weights")
    except ValueError as e:
        return str(e)
    if masters == f"{STATE_DIR}/{MASTER}" and not (sd / MASTER).is_file():
        return f"{sd / MASTER}: missing (the manifest says the fp32 master weights are there)"
    if (sd / DCP_DIR).is_dir():  # sharded: torch.distributed.checkpoint checks its own files
        return None
    try:
        Checkpoint.open(ckpt)  # the weights (full modes) or the adapter (LoRA)
        for f in sorted(sd.glob("optimizer__*.safetensors")) + sorted(sd.glob(MASTER)):
            read_header(f)
    except (ValueError, OSError) as e:  # CheckpointError names the file
        return str(e)
    return None


def resume_point(run: Path) -> tuple[Path | None, list[str]]:
    """The newest checkpoint under `run` that a run can continue from, and why each newer one
    cannot (empty when the newest is intact).

    Args:
        run: a run folder (checkpoints anywhere below it).
    Returns:
        (the checkpoint, or None when there is none to continue from; the newer ones' problems).
    """
    skipped = []
    for ckpt in reversed(find_checkpoints(run) if Path(run).is_dir() else []):
        problem = resume_problem(ckpt)
        if problem is None:
            return ckpt, skipped
        skipped.append(problem)
    return None, skipped


def resumable(ckpt: Path) -> bool:
    """False once `drop_resume_state` has stripped the checkpoint to its weights."""
    return read_state(ckpt).get("resumable", True)


def drop_resume_state(ckpt: Path) -> int:
    """Strip a checkpoint that is no longer a run's newest to its weights: delete its AdamW
    state, fp32 masters and sharded trainer state, and mark it not resumable.

    Args:
        ckpt: a checkpoint folder.
    Returns:
        bytes freed.
    """
    sd = Path(ckpt) / STATE_DIR
    doomed = [*sd.glob("optimizer__*.safetensors"), sd / MASTER, sd / DCP_DIR]
    freed = 0
    state = read_state(ckpt)
    # Marked first: a crash halfway leaves a checkpoint that says it cannot be resumed, never
    # one that resumes with half its state.
    state["resumable"] = False
    tmp = sd / ".state.json.tmp"
    tmp.write_text(json.dumps(state, indent=1, sort_keys=True))
    tmp.replace(sd / "state.json")
    for p in doomed:
        if p.is_dir():
            freed += sum(f.stat().st_size for f in p.rglob("*") if f.is_file())
            shutil.rmtree(p)
        elif p.exists():
            freed += p.stat().st_size
            p.unlink()
    return freed


def keep_resume_state_of_newest(paths: list[Path]) -> int:
    """`drop_resume_state` on every checkpoint of `paths` (oldest first) but the last; returns
    bytes freed. Folders already gone (pruned, or uploaded and removed by Ray) are skipped."""
    return sum(drop_resume_state(p) for p in paths[:-1] if p.is_dir() and resumable(p))


def find_checkpoints(root: str | Path) -> list[Path]:
    """Every training checkpoint under `root` (plain-loop or Ray storage), by (step, path)."""
    found = [p.parent for p in Path(root).rglob(MANIFEST) if not p.parent.name.startswith(".")]
    return sorted(found, key=lambda p: (read_manifest(p)["step"], str(p)))


def prune_checkpoints(paths: list[Path], keep: int | None) -> None:
    """Delete the oldest checkpoint dirs of `paths` (oldest first) until `keep` remain."""
    while keep is not None and len(paths) > keep:
        old = paths.pop(0)
        if old.exists():
            shutil.rmtree(old)


def checkpoints_up_to(newest: Path) -> list[Path]:
    """The checkpoint folders beside `newest` (`samples_<digits>`, temporaries left out) at no
    more samples than it, oldest first, ending with `newest`: what keep_checkpoints and
    `resume_state: newest` apply to once `newest` is written whole.

    The folder is scanned, not a list this process kept, so checkpoints a killed process wrote
    before a resume count too (they were left beside the new ones). Folder names, not
    manifests: an FSDP rank's own folder holds its shards without one. Folders at more samples
    belong to a run resumed from an earlier checkpoint; they are left alone (this run
    rewrites each as it reaches its step).

    Args:
        newest: the checkpoint folder just written.
    Returns:
        the folders, by samples.
    """
    cap = samples_of(newest.name)
    found = [
        p
        for p in newest.parent.iterdir()
        if p.is_dir() and (n := samples_of(p.name)) is not None and n <= cap
    ]
    return sorted(found, key=lambda p: samples_of(p.name))


def checkpoint_name(samples: int) -> str:
    """A checkpoint folder's name: `samples_` and the samples seen, 9 digits (`samples_of` reads it)."""
    return f"samples_{samples:09d}"


def samples_of(name: str) -> int | None:
    """The samples count in a checkpoint folder's name `samples_<digits>`, or None."""
    head, _, digits = name.partition("_")
    return int(digits) if head == "samples" and digits.isdigit() else None
