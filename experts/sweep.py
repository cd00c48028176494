"""Expert sweeps: a Ray Tune search over training hyperparameters, checkpoints scored on indicators.

`run_sweep(load_train_experiment("exp.yaml"), Path("runs/r1"))` (what `layerswap train` runs for an
experiment with a `sweep:` block); rows land in RUN/experts/registry.parquet as trials finish.
"""

from __future__ import annotations

import json
import sys
import time
import zlib
from pathlib import Path
from typing import Any

from layerswap.experts.registry import expert_id, expert_row, read_rows, registry_path, top_k
from layerswap.experts.scoring import score_reserved, trial_resources
from layerswap.experts.sweep_setup import SweepResult, SweepSetup  # also their old home's names
from layerswap.experts.sweep_tuner import (
    METRIC,
    ROWS_KEY,
    check_resumed,
    drop_untracked_rows,
    make_tuner,
    saved_trials,
)

# _Space lived here until the Tune side moved to sweep_tuner.py: a sweep's tuner.pkl and Optuna
# searcher state pickle it by reference as layerswap.experts.sweep._Space, so a sweep cut before
# the move resumes only while that name still finds it (tests/experts/test_sweep_tuner.py pins
# the names Tune pickles).
from layerswap.experts.sweep_tuner import _Space as _Space
from layerswap.spaces.local_inputs import train_inputs
from layerswap.spaces.train_experiment import (
    TrainExperiment,
    absolute_local_paths,
    experiment_json,
    with_overrides,
    world_dir,
)
from layerswap.trainables.devices import DeviceUnusable
from layerswap.trainables.evaluate.finite_outputs import NonFiniteOutputs
from layerswap.trainables.evaluate.indicators import IndicatorScorer, load_tokenizer
from layerswap.trainables.evaluate.tasks import write_world_tasks
from layerswap.trainables.node_paths import (
    NodePathError,
    check_here,
    described,
    run_lock,
    start_checked,
)
from layerswap.trainables.ray_session import tune_output
from layerswap.trainables.storage import absolute
from layerswap.trainables.train import find_checkpoints, read_manifest, run_training
from layerswap.trainables.train.finite import NonFiniteTraining
from layerswap.trainables.train.ray_capacity import check_capacity
from layerswap.trainables.train.run import continue_from, last_checkpoint

# A trial that ends for a reason a retry would meet again (training turned non-finite, no
# checkpoint scorable) reports this key with the reason and returns: Tune retries only a raise.
FAILED_KEY = "failed_without_retry"
# ...and this key too when the reason is an input (or RUN) its node does not see: the sweep then
# ends in that one line (run_sweep), as when the driver's own check finds it.
NODE_PATHS_KEY = "node_paths"


def set_up_sweep(experiment: TrainExperiment, run_dir: Path) -> SweepSetup:
    """Resolve the sweep's tasks, int parameters, executor and storage; writes world task YAMLs.

    Raises:
        ValueError: no `sweep:` block, or a parameter/indicator that does not fit.
    """
    if experiment.sweep is None:
        raise ValueError(f"experiment {experiment.name!r} has no sweep: block")
    experiment = absolute_local_paths(experiment)  # trials run in Tune's own folders
    sweep = experiment.sweep
    data = experiment_json(experiment)
    int_params = sweep.int_params(data)
    world = world_dir(experiment)
    include = None
    if world is not None:
        tasks_dir = Path(run_dir) / "experts" / "tasks"
        write_world_tasks(world, tasks_dir)
        include = str(tasks_dir.resolve())
    kind, lang = experiment.kind, experiment.language
    tasks = sweep.tasks_for(kind, lang, world=world is not None)
    executor = sweep.executor
    if executor == "auto":
        sc = experiment.scaling
        executor = "in_trial" if sc.num_workers == 1 and not sc.use_gpu else "ray_train"
    return SweepSetup(
        experiment=data,
        sweep=sweep,
        tasks=tasks,
        metric_task=sweep.metric_for(kind, lang, world=world is not None),
        include_path=include,
        int_params=int_params,
        executor=executor,
        storage=str((Path(run_dir) / "train").resolve()),
        registry=str(registry_path(Path(run_dir).resolve())),
        # trials read the world, RUN/experts and write RUN/train/<name>: the sweep's lock there
        node_inputs=described(_node_inputs(experiment, run_dir)),
    )


def _node_inputs(experiment: TrainExperiment, run_dir: Path) -> list[tuple[str, str]]:
    """What every node a trial runs on must see as the driver does: the inputs, and RUN."""
    sweep_dir = Path(run_dir).resolve() / "train" / experiment.name
    return [*train_inputs(absolute_local_paths(experiment)), run_lock(sweep_dir)]


def trial_seed(base_seed: int, params: dict[str, Any]) -> int:
    """A trial's data seed: the experiment's seed plus a hash of its sampled parameters.

    Each run samples its data with its own seed (the paper's practice); the same parameters
    give the same seed, so a trial is reproducible from its registry row alone.
    """
    if "hyper.seed" in params:
        return int(params["hyper.seed"])
    text = json.dumps(params, sort_keys=True, default=str)
    return base_seed + zlib.crc32(text.encode()) % 1_000_000


def _flat_params(config: dict) -> dict[str, Any]:
    """Tune configs may nest dotted keys ("hyper.lr" -> {"hyper": {"lr": ...}}): flatten back."""
    out: dict[str, Any] = {}
    for k, v in config.items():
        if isinstance(v, dict):
            out.update({f"{k}.{kk}": vv for kk, vv in _flat_params(v).items()})
        else:
            out[k] = v
    return out


_SCORERS: dict[tuple, Any] = {}  # per worker process: reused actors keep their cached prompts


def _scorer(setup: SweepSetup, base: str):

    sw = setup.sweep
    key = (tuple(setup.tasks), setup.include_path, base, sw.limit, sw.num_fewshot, sw.max_gen_toks,
           sw.backend, sw.device, sw.batch_size)  # fmt: skip
    if key not in _SCORERS:
        _SCORERS[key] = IndicatorScorer(
            setup.tasks,
            load_tokenizer(base),
            include_path=setup.include_path,
            limit=sw.limit,
            num_fewshot=sw.num_fewshot,
            max_gen_toks=sw.max_gen_toks,
            backend=sw.backend,
            device=_indicator_device(sw.device),
            batch_size=sw.batch_size,
        )
    return _SCORERS[key]


def _indicator_device(setting: str) -> str:
    """The device a sweep trial scores on: "auto" is the GPU only where Ray assigned one.

    Ray leaves CUDA_VISIBLE_DEVICES alone for a trial that reserves no GPU, so every such
    trial would see all GPUs and score on cuda:0 at once, unaccounted; such trials score on
    the CPU unless `device: cuda` asks for exactly that.
    """
    import ray

    if setting == "auto" and ray.is_initialized() and not ray.get_gpu_ids():
        return "cpu"
    return setting


def trial_retries(setup: SweepSetup) -> int:
    """Tune's max_failures for a trial: one level retries. in_trial: `failure.max_failures` (a
    restarted trial resumes, see _train). ray_train: 0, since the nested TorchTrainer restarts
    from its last checkpoint as often itself; Tune around it made (1 + n)^2 attempts of a failure
    that recurs (OOM, a 401, data missing offline), 16 at the shipped 3. A trial whose driving
    process dies then fails without a retry.

    Args:
        setup: the resolved sweep.
    Returns:
        Tune's FailureConfig.max_failures.
    """
    return 0 if setup.executor == "ray_train" else int(setup.experiment["failure"]["max_failures"])


def _train(variant: TrainExperiment, workdir: Path, executor: str) -> list[Path]:
    """Train one variant into `workdir`; returns its checkpoint folders in step order.

    A workdir whose last checkpoint is the final step's (a trial that finished training before
    its sweep was cut, then resumed with `train --continue`) is not trained again. in_trial: the
    plain loop in this process; a retried or resumed trial continues from its newest checkpoint
    whose resume state is intact (data order is a function of seed and step, so no step is lost
    or repeated). ray_train: a nested TorchTrainer (storage workdir/, FailureConfig from the
    experiment), which resumes from the newest checkpoint in workdir itself, and whose reports
    reach Tune through TuneReportCallback.
    """
    if last_checkpoint(workdir)[1]:
        return find_checkpoints(workdir)
    if executor == "in_trial":
        run_training(variant, workdir=workdir, resume_from=continue_from(workdir))
    else:
        # lazy: Ray Train only for the per-trial Ray executor
        import ray.train

        # lazy: imports ray, as above
        from layerswap.trainables.train.ray_train import raise_own_error, trainer_for

        trainer = trainer_for(
            variant, storage_path=str(workdir.parent), name=workdir.name, callbacks=[_tune_report()]
        )
        try:
            result = trainer.fit()
        except ray.train.TrainingFailedError as e:
            raise_own_error(e)  # NonFiniteTraining as itself, for sweep_trial to end without retry
            raise
        if result.error is not None:
            raise RuntimeError(f"{variant.name}: nested TorchTrainer failed: {result.error!r}")
    return find_checkpoints(workdir)


def _tune_report():
    from ray.tune.integration.ray_train import TuneReportCallback

    class TrainToTune(TuneReportCallback):
        """Forwards training metrics to Tune with a placeholder indicator (-1: not scored yet);
        Tune requires the search metric in every result, and indicators lie in [0, 1]."""

        def after_report(self, run_context, metrics, checkpoint):
            metrics = [{**m, METRIC: -1.0} for m in metrics]
            super().after_report(run_context, metrics, checkpoint)

    return TrainToTune()


def score_rows(
    setup: SweepSetup, checkpoints: list[Path], trial_id: str, params: dict
) -> list[dict]:
    """Score checkpoints on the setup's indicators; one registry row each (the trial's last
    checkpoint only when `checkpoints: last`).

    A checkpoint whose outputs are NaN or Inf (finite weights can still overflow, e.g. in bf16)
    gets no row, and says so in one line: a score from its logits would mean nothing, and the
    trial's other checkpoints still count.
    """
    exp = setup.experiment
    chosen = checkpoints[-1:] if setup.sweep.checkpoints == "last" else checkpoints
    scorer = _scorer(setup, exp["base"])
    rows = []
    for ck in chosen:
        try:
            scores = scorer.score_checkpoint(
                ck, base=exp["base"], trust_remote_code=exp.get("trust_remote_code", False)
            )
        except NonFiniteOutputs as e:
            print(f"layerswap: sweep trial {trial_id}: {ck} left unscored: {e}", file=sys.stderr)
            continue
        extra = {k: v for k, v in params.items() if not k.startswith("hyper.")}
        rows.append(expert_row(exp, ck, read_manifest(ck), trial_id, scores.columns(), extra))
    return rows


def sweep_trial(config: dict, setup: SweepSetup) -> None:
    """The Tune function trainable: train one sampled variant, score its checkpoints, report.

    Reports once per scored checkpoint (step order): `indicator` = the best score so far on the
    metric task (a trial is worth its best checkpoint), plus that checkpoint's registry row.
    """
    import torch
    from ray import tune

    torch.set_num_threads(max(1, int(setup.sweep.cpus_per_trial)))
    ctx = tune.get_context()
    trial_id = ctx.get_trial_id()
    params = _flat_params(config)
    exp = TrainExperiment.model_validate(setup.experiment)
    overrides = dict(params)
    overrides["hyper.seed"] = trial_seed(exp.hyper.seed, params)
    variant = with_overrides(exp, overrides)
    # Not Tune's trial dir: that is a local staging folder in Ray's session dir. RUN must be
    # shared storage on a multi-node cluster (the registry records these paths).
    workdir = Path(setup.storage) / exp.name / trial_id
    try:
        check_here(setup.node_inputs)  # a node started after the driver's check: before loading
        checkpoints = _train(variant, workdir, setup.executor)
    except (NonFiniteTraining, DeviceUnusable) as e:  # a retry meets them again (same data,
        _fail_without_retry(trial_id, str(e))  # same learning rate; the node's torch or driver)
        return
    except NodePathError as e:  # nor does a missing path come back (also a nested worker's)
        _fail_without_retry(trial_id, str(e), **{NODE_PATHS_KEY: str(e)})
        return
    if not checkpoints:
        raise RuntimeError(f"trial {trial_id}: training wrote no checkpoint under {workdir}")
    best, scored = float("-inf"), 0
    col = f"ind__{setup.metric_task}"
    chosen = checkpoints[-1:] if setup.sweep.checkpoints == "last" else checkpoints
    known = _scored_rows(setup, exp.name, trial_id)
    for ck in chosen:  # on a GPU Ray reserves, when the experiment trains on GPUs
        # A resumed trial's checkpoints scored before the cut keep their rows (not scored again)
        rows = known.get(absolute(ck)) or score_reserved(score_rows, setup, [ck], trial_id, params)
        for row in rows:  # none: its outputs are not finite
            best, scored = max(best, row[col]), scored + 1
            tune.report({METRIC: best, col: row[col], "step": row["step"], ROWS_KEY: json.dumps([row])})  # fmt: skip
    if not scored:
        _fail_without_retry(
            trial_id,
            f"no checkpoint under {workdir} could be scored (their outputs are NaN or Inf)",
        )


def _scored_rows(setup: SweepSetup, name: str, trial_id: str) -> dict[str, list[dict]]:
    """The registry rows this trial wrote before its sweep was cut, by checkpoint path: those of
    its checkpoints still there under the same expert id (experiment, trial, step)."""
    if not setup.registry:
        return {}
    rows = [r for r in read_rows(setup.registry) if r["trial_id"] == trial_id]
    return {
        r["path"]: [r]
        for r in rows
        if r["expert_id"] == expert_id(name, trial_id, r["step"]) and Path(r["path"]).is_dir()
    }


def _fail_without_retry(trial_id: str, why: str, **extra: str) -> None:
    """End a sweep trial as failed without raising (Tune would retry it and meet `why` again):
    one line, and a result the searcher ranks below every indicator (-1; they lie in [0, 1])."""
    from ray import tune  # lazy: inside a Tune trial only

    print(f"layerswap: sweep trial {trial_id} failed (not retried): {why}", file=sys.stderr)
    tune.report({METRIC: -1.0, FAILED_KEY: why, **extra})


def start_sweep_ray(experiment: TrainExperiment, verbose: int = 0, run_dir: Path | None = None) -> None:  # fmt: skip
    """Start (or join, RAY_ADDRESS) Ray unless this process has, then refuse local inputs some
    node does not see as this one does (trainables/node_paths.py; free on one node), and, given
    `run_dir`, RUN (the sweep's lock there, once this command holds it).

    Raises:
        NodePathError (a ValueError): one line per node and input that differs.
    """
    # Ray's INFO log ("Started a local Ray instance", Tune's "Wrote the latest version of all
    # result files") too only when verbose: Ray's logger then has no handler of its own.
    loud = verbose > 0
    inputs = train_inputs(absolute_local_paths(experiment)) if run_dir is None else _node_inputs(experiment, run_dir)  # fmt: skip
    start_checked(inputs, verbose=loud, ignore_reinit_error=True, include_dashboard=False, log_to_driver=loud, configure_logging=loud)  # fmt: skip


def run_sweep(experiment: TrainExperiment, run_dir: str | Path, *, verbose: int = 0, resume: bool = False) -> SweepResult:  # fmt: skip
    """Run the experiment's expert sweep; every scored checkpoint becomes a registry row.

    Starts a local Ray instance unless one is already initialised (tests pass their own).

    Args:
        experiment: a validated experiment with a `sweep:` block.
        run_dir: RUN; trials train under RUN/train/<name>/<trial_id>/, rows go to
            RUN/experts/registry.parquet.
        verbose: Tune's verbosity (RunConfig.verbose); above 0 also Ray's and Tune's own
            notices and the trials' forwarded logs (see ray_session.tune_output).
        resume: restore the interrupted sweep in RUN/train/<name>/ (sweep_tuner.make_tuner)
            instead of starting one: finished trials are kept, the rest run to num_samples.
    Returns:
        SweepResult with this sweep's rows (old and resumed trials) and its top_k experts on
        the metric task.
    Raises:
        SweepStateError: `resume` and the sweep's Tune state cannot be restored.
        RunFailed: `resume`, and Tune did not get back every trial its saved state named
            (it started the sweep over); no registry row is taken out.
    """
    from ray import tune

    t0 = time.perf_counter()
    run_dir = Path(run_dir)
    if experiment.sweep is None:
        raise ValueError(f"experiment {experiment.name!r} has no sweep: block")
    start_sweep_ray(experiment, verbose, run_dir)  # before set_up_sweep writes the task YAMLs
    setup = set_up_sweep(experiment, run_dir)
    if setup.executor == "ray_train":  # each trial's nested run: said now if no node holds it
        check_capacity(experiment.scaling)
    reg = registry_path(run_dir)
    with tune_output(verbose > 0):  # an Optuna searcher creates its study in make_tuner
        # A trial that nests a TorchTrainer only drives it: its workers reserve their own.
        trainable = tune.with_resources(
            tune.with_parameters(sweep_trial, setup=setup), trial_resources(setup)
        )
        tuner = make_tuner(setup, trainable, experiment.name, reg, max_failures=trial_retries(setup), verbose=verbose, resume=resume)  # fmt: skip
        folder = Path(setup.storage) / experiment.name
        named = saved_trials(folder) if resume else set()  # make_tuner read it already
        grid = tuner.fit()
    if lines := sorted({ln for r in grid for ln in (r.metrics.get(NODE_PATHS_KEY) or "").split("\n  ") if ln}):  # fmt: skip
        raise NodePathError("\n  ".join(lines))  # the sweep's other trials keep their rows
    statuses = {r.metrics.get("trial_id", "?"): ("error" if r.error or r.metrics.get(FAILED_KEY) else "ok") for r in grid}  # fmt: skip
    ids = set(statuses)
    if resume:
        check_resumed(folder, named, ids)  # before any row is taken out
        drop_untracked_rows(reg, folder, ids)
    rows = [r for r in read_rows(reg) if r["trial_id"] in ids and r["kind"] == experiment.kind]
    best = top_k(rows, experiment.kind, experiment.language, setup.metric_task, setup.sweep.top_k)
    return SweepResult(reg, rows, best, setup.metric_task, time.perf_counter() - t0, statuses)
