"""Expert training as plain torch (no ray): data, modes, schedules, the loop, checkpoints.

Run one process: `run_training(load_train_experiment("exp.yaml"), workdir=Path("out"))`; under
torch.distributed (gloo/nccl, DDP) every rank calls the same function. Ray Train wraps it in
trainables/train/ray_train.py; the CLI is `layerswap train EXPERIMENT.yaml` (cli/train.py).

API (stable; the expert-sweep helper builds on it)
--------------------------------------------------
Config: `layerswap.spaces.train_experiment.TrainExperiment` (pydantic, frozen, extra="forbid"), loaded with
`layerswap.spaces.train_experiment.load_train_experiment(path)` (ValueError naming file + field) or
`parse_train_experiment(dict, source)`. Derive variants with `exp.model_copy(update=...)` or
`with_overrides(exp, {"hyper.lr": 1e-4, "hyper.seed": 3})` (dotted paths, re-validated).
Fields: name, base, kind ("math"|"language"), language (e.g. "en", "xa", "swh"),
datasets: [DatasetSpec{path | source(+language, data_files), limit}], mode (one of
FullMode | LoraMode | PartialMode | SimultaneousMode | MixMode, discriminated by `type`;
`mode: full` shorthand), hyper (Hyper: lr, schedule linear|wsd|constant_with_warmup,
warmup_steps, wsd_decay_frac, beta1, beta2, eps, weight_decay, grad_clip, batch_size = GLOBAL
samples per optimizer step (split evenly over workers), max_steps | epochs, seq_len, seed,
val_share, log_every, gradient_checkpointing, micro_batch_size = samples per worker per
forward pass, accumulated to the worker's share), checkpoint_every_samples, keep_checkpoints,
scaling (num_workers, use_gpu, strategy ddp|fsdp, cpus_per_worker, cpu_offload (fsdp),
accelerator_type), precision (policy auto|bf16-mixed|fp32|bf16-pure, checkpoint_dtype
base|fp32; trainables/train/precision.py), storage_path, failure (max_failures),
sweep: SweepConfig | None (num_samples, params {dotted.path: {low, high, log} | {choices}},
top_k, indicators, max_concurrent, seed) — the sweep owns its semantics.
`debug.fail_at_step` + `debug.fail_marker`: raise once at that step (fault-injection tests);
with `debug.kill_rank` that rank's process SIGKILLs itself instead.

Training:
  from layerswap.trainables.train import run_training, TrainResult
  result = run_training(exp, workdir=Path, resume_from=None | checkpoint_dir, report=None)
    - rank / world size come from torch.distributed when it is initialised, else 0 / 1.
    - report(metrics: dict, checkpoint: Path | None) is called on EVERY rank at each log step
      (every `hyper.log_every` steps) and at each checkpoint; checkpoint is a finished dir on
      rank 0 (None elsewhere; under fsdp, ranks with work folders of their own get the folder
      of their own shards). metrics keys: step, samples, epoch, loss, lr, grad_norm,
      active (simultaneous: which dataset/side), stream, tokens, elapsed_s, time, checkpoint
      (bool, True on every rank at a checkpoint step), and at checkpoints
      val_loss (+ val_loss__<dataset_index>).
    - returns TrainResult(final_checkpoint: Path | None (rank 0), step, samples, losses:
      list[float] (this rank's per-step train loss), checkpoints: list[Path]).
  Checkpoints (rank 0) go to workdir/checkpoints/samples_<9 digits>/ every
  `checkpoint_every_samples` samples and at the end:
    model.safetensors + config.json + tokenizer files (full/partial/simultaneous/mix), or
    adapter_model.safetensors + adapter_config.json (lora, partial+lora; loads with
    PeftModel.from_pretrained(base, dir)),
    trainer_state/master.safetensors (fp32 trainable weights, when the HF weights are saved in
    a coarser dtype), or under fsdp trainer_state/dcp/ (every rank's shard of weights and AdamW
    state, torch.distributed.checkpoint) instead of the optimizer files below,
    layerswap_train.json   manifest (see MANIFEST keys below),
    trainer_state/optimizer__<group>.safetensors (AdamW moments keyed by parameter name) and
    trainer_state/state.json (step, samples, lr, total_steps) — no pickle.
  read_manifest(checkpoint_dir) -> dict with keys: experiment (full config as JSON), name,
    kind, language, mode, base, step, samples, epoch, seed, world_size, hparams (Hyper as
    dict), data ([{spec, n_train, n_val, n_empty, n_dropped, n_truncated}]), val_loss (mean), val_losses (per
    dataset), train_loss, is_lora, groups, files (each model file outside trainer_state/ and
    its size: a store's checkpoint is complete only with all of them), created_at.
  find_checkpoints(root) -> [dirs with a manifest under root], sorted by step (works for the
    plain loop's workdir and for Ray storage: storage_path/name/samples_<9 digits>/).
  Data order is a pure function of (seed, step): resuming from any checkpoint repeats and
  loses no step; dropout RNG is re-seeded per (seed, step, rank).

Modes: `layerswap.trainables.train.modes.MODES: dict[str, TrainingMode]`; `mode_of(name)` looks
one up (an unknown name is a ValueError). An entry's prepare(model, exp, depth) returns
Prepared(model, groups {group_name: [(param_name, param)]}, frozen names, is_lora);
`Prepared.active(step)` -> (stream, stream's own step, group) says which group steps
(simultaneous alternates the datasets' sides every k steps; other modes: one group).
Every trainable group has its own AdamW, only the active one steps, so a frozen group's moments
are untouched; requires_grad is set once before DDP wrapping and never toggled. Its
trainable(exp, shape) says the same on parameter names alone, for the memory plan.
Partitions: `layerswap.trainables.train.partition.param_sides(names, spec, depth)` -> {name: side|None}.

Strategies: `layerswap.trainables.train.strategies.STRATEGIES` (ddp, fsdp): wrap, no_sync, grad_norm;
FSDP checkpoints in trainables/train/sharded.py (save_sharded / load_sharded, collective).

Ray: `layerswap.trainables.train.ray_train.train_with_ray(exp, storage_path=None, name=None)` ->
RayTrainResult(checkpoint, metrics, path, error); `trainer_for(exp, ..., callbacks=[...])` gives
the unfitted TorchTrainer (e.g. with a Tune report callback for a nested sweep). Checkpoints land
in storage_path/name/samples_<9 digits>/. Metric-only reports are forwarded to Ray at most every
`min_report_interval_s` (2 s: Ray V2 drains reports on a ~2 s poll, so a report per step would
block); checkpoint reports always. Fault injection: `debug.fail_at_step` (0-based update index)
+ `debug.fail_marker`; `debug.step_log` (JSON lines {step, start, group, time, tokens}, rank 0).

Train-then-revert (trainables/train/revert.py): `revert_specs(partial_exp, depth)` -> the
RevertSpecs of what a partial run keeps frozen; `revert_to_base(expert, base, specs, out)` applies
them with the merge engine; `freeze_vs_revert(partial_exp, workdir)` runs both arms and returns
{freeze, full, revert, val_loss: {freeze, revert, full}}; `val_losses(model_dir, exp)`.
"""

from layerswap.trainables.train.loop import TrainResult, read_manifest, run_training
from layerswap.trainables.train.run import train_expert
from layerswap.trainables.train.state import find_checkpoints

__all__ = ["TrainResult", "find_checkpoints", "read_manifest", "run_training", "train_expert"]
