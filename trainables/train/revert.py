"""Train-then-revert vs freeze-then-train (follow-up paper §4.5, Table 3.3), from one config.

`freeze_vs_revert(exp, workdir)` takes a `partial` experiment (partition + the side that
trains), runs it as is (freeze-then-train), runs the same config in `full` mode and resets what
the partial run kept frozen to base with the merge engine (train-then-revert), and scores both
checkpoints by validation loss on the experiment's own validation split.
"""

from __future__ import annotations

from pathlib import Path

from layerswap.spaces.recipe import COMPONENTS, LayerSwapRecipe, RevertSpec
from layerswap.spaces.train_experiment import TrainExperiment, with_overrides
from layerswap.spaces.train_modes import PartialMode, partition_spec
from layerswap.trainables.merge.engine import merge_to_disk
from layerswap.trainables.train.data import build_data
from layerswap.trainables.train.loop import run_training
from layerswap.trainables.train.partition import owners
from layerswap.trainables.train.validation import validation_losses


def revert_specs(exp: TrainExperiment, depth: int) -> list[RevertSpec]:
    """What a partial experiment keeps frozen, as merge-recipe revert specs."""
    mode = exp.mode
    if not isinstance(mode, PartialMode):
        raise ValueError(f"mode: train-then-revert needs a partial experiment, got {mode.type!r}")
    spec = partition_spec(mode.partition)
    table = owners(spec, depth)
    specs = []
    for comp in COMPONENTS:
        layers = [i for i, s in enumerate(table[comp]) if s != mode.train]
        if layers:
            specs.append(RevertSpec(layers=layers, components=[comp]))
    if spec.non_layer != mode.train:  # None (frozen) or the other side's
        specs.append(RevertSpec(non_layer=True))
    return specs


def revert_to_base(expert: str | Path, base: str | Path, specs: list[RevertSpec], out: str | Path, *, overwrite: bool = False) -> Path:  # fmt: skip
    """Copy `expert` to `out` with the cells of `specs` reset to `base` (merge engine).

    Written as a layer swap of the expert with itself (every tensor taken whole, bit-exact)
    plus the revert.
    """
    recipe = LayerSwapRecipe(
        method="layer_swap",
        task_expert=str(expert),
        language_expert=str(expert),
        base=str(base),
        bottom=0,
        top=0,
        non_layer="task",
        revert=specs,
    )
    return merge_to_disk(recipe, out, overwrite=overwrite)


def _depth(model_dir: str | Path) -> int:
    import json

    return int(json.loads((Path(model_dir) / "config.json").read_text())["num_hidden_layers"])


def val_loss(model_dir: str | Path, exp: TrainExperiment) -> float:
    """Mean (over datasets) token-weighted validation loss of a checkpoint on exp's split."""
    losses = val_losses(model_dir, exp)
    return sum(losses) / len(losses)


def val_losses(model_dir: str | Path, exp: TrainExperiment) -> list[float]:
    """Per dataset, the token-weighted validation loss of a full checkpoint on exp's split."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype="auto")
    data = build_data(exp, tok)
    return validation_losses(model, data, exp, 0, 1, "cpu", tok.pad_token_id)


def freeze_vs_revert(exp: TrainExperiment, workdir: str | Path, run=None) -> dict:
    """Run both arms of the comparison for a partial experiment.

    Args:
        exp: a `partial` experiment without `lora` (its partition and `train` side define
            both arms).
        workdir: output folder (freeze/, full/, revert/ inside).
        run: training function (default: the plain loop, `run_training`).
    Returns:
        {"freeze": dir, "full": dir, "revert": dir, "val_loss": {"freeze", "revert", "full"}}.
    Raises:
        ValueError: before any training, for a mode other than `partial` or one with `lora`.
    """
    run = run or run_training
    workdir = Path(workdir)
    if not isinstance(exp.mode, PartialMode):  # fail before training anything
        raise ValueError(f"mode: train-then-revert needs a partial experiment, got {exp.mode.type!r}")  # fmt: skip
    if exp.mode.lora is not None:
        # The train arm is a full-weight run; beside a LoRA freeze arm it would compare full
        # SFT at the LoRA learning rate with LoRA, not train-then-revert with freeze-then-train.
        raise ValueError(
            "mode.lora: train-then-revert compares full-weight arms only; drop mode.lora "
            "(a LoRA comparison would need LoRA on every module with the frozen side's "
            "adapters reverted, which is not built)"
        )
    frozen = run(exp, workdir=workdir / "freeze").final_checkpoint
    full_exp = with_overrides(exp, {"mode": {"type": "full"}, "name": f"{exp.name}-full"})
    full = run(full_exp, workdir=workdir / "full").final_checkpoint
    reverted = revert_to_base(full, exp.base, revert_specs(exp, _depth(full)), workdir / "revert")
    return {
        "freeze": frozen,
        "full": full,
        "revert": reverted,
        "val_loss": {
            "freeze": val_loss(frozen, exp),
            "revert": val_loss(reverted, exp),
            "full": val_loss(full, exp),
        },
    }
