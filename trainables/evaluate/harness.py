"""Evaluation with lm-eval: world task YAMLs over lm-eval's own configs, runs, per-sample scores.

Run `layerswap eval MODEL_DIR --tasks world_mgsm_direct_xa --world WORLD_DIR --limit 20`.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Literal

from layerswap.trainables.atomic import atomic_write_text
from layerswap.trainables.devices import check_cpu_size, config_params, resolve_device
from layerswap.trainables.evaluate.lm_eval_api import (
    lm_eval_output,
    offline_defaults,
    offline_hint,
    request_bars_off,
    task_manager,
)
from layerswap.trainables.evaluate.scoring import score_key
from layerswap.trainables.evaluate.tasks import (
    lm_eval_tasks_dir,
    write_world_tasks,
)

__all__ = [
    "check_batch_size",
    "eval_target",
    "evaluate",
    "lm_eval_tasks_dir",
    "metrics_table",
    "predictions",
    "resolve_device",
    "task_manager",
    "write_world_tasks",
]

DEFAULT_MAX_GEN_TOKS = 256  # lm-eval's own default, made explicit (HFLM ignores its argument)

ADAPTER_CONFIG = "adapter_config.json"  # what marks a PEFT adapter folder
_HUB_ID = re.compile(r"[\w.-]+(/[\w.-]+)?")  # a hub repo id: "name" or "org/name"

BatchSize = int | Literal["auto"]


def check_batch_size(value: Any) -> BatchSize:
    """A batch size as lm-eval's HFLM takes it: a positive int, or "auto" (lm-eval's own search
    for the largest batch that fits, halving on out-of-memory).

    Args:
        value: an int, "auto", or an int's text (what a command line gives).
    Returns:
        the int, or "auto".
    Raises:
        ValueError naming `value` for anything else.
    """
    if value == "auto":
        return "auto"
    if isinstance(value, bool):  # an int subclass, never a batch size
        raise ValueError(f"batch size {value!r}: expected a positive int or 'auto'")
    try:
        n = int(value) if isinstance(value, (int, str)) else None
    except ValueError:
        n = None
    if n is None or n < 1:
        raise ValueError(f"batch size {value!r}: expected a positive int or 'auto'")
    return n


def check_model_dir(path: Path) -> None:
    """Refuse, with the file named, what HFLM would fail on late or load unsafely (pickles)."""
    # lazy: torch (~3 s); `layerswap eval` checks its inputs with this module before loading it
    from layerswap.trainables.merge.checkpoint import Checkpoint

    if not path.is_dir():
        raise ValueError(f"model folder {path} does not exist")
    if not (path / "config.json").is_file():
        raise ValueError(
            f"{path}/config.json missing: not a Hugging Face checkpoint folder "
            f"(nor a PEFT adapter folder: no {ADAPTER_CONFIG})"
        )
    # CheckpointError (a ValueError) for pickle-only or weightless folders, and for truncated or
    # corrupt shards (every header checked against its file's size, as the merge does)
    Checkpoint.open(path)


def eval_target(path: Path, base: str | Path | None = None) -> tuple[str, str | None]:
    """What HFLM loads for a folder: the folder itself, or an adapter's base plus the adapter.

    A PEFT adapter folder (adapter_config.json; what layerswap's LoRA training writes) is
    evaluated as lm-eval does with `--model_args pretrained=BASE,peft=ADAPTER`: its base model
    with the adapter applied. Checked here, before lm-eval is imported.

    Args:
        path: a checkpoint folder or an adapter folder.
        base: the adapter's base model, overriding adapter_config.json's base_model_name_or_path.
    Returns:
        (pretrained, peft): HFLM's `pretrained` (a folder or a hub id in the local cache) and
        the adapter folder, or None for a full checkpoint.
    Raises:
        ValueError naming the file, field and value: an unreadable adapter config, no base, a
        base that is neither a local checkpoint folder nor resolvable offline, pickled weights.
    """
    path = Path(path)
    cfg_file = path / ADAPTER_CONFIG
    if not cfg_file.is_file():
        if base is not None:
            raise ValueError(
                f"--base {base}: {path} is not an adapter folder (no {ADAPTER_CONFIG})"
            )
        check_model_dir(path)
        return str(path), None
    try:
        cfg = json.loads(cfg_file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ValueError(f"{cfg_file}: not a readable adapter config ({e})") from None
    if not isinstance(cfg, dict):
        raise ValueError(f"{cfg_file}: not a JSON object")
    # lazy: torch (~3 s); `layerswap eval` checks its inputs with this module before loading it
    from layerswap.trainables.merge.checkpoint import Checkpoint

    # adapter_model.safetensors with an intact header, or a clear refusal of adapter_model.bin
    Checkpoint.open(path)
    if base is None:
        base = cfg.get("base_model_name_or_path")
        if not isinstance(base, str) or not base.strip():
            raise ValueError(
                f"{cfg_file}: field base_model_name_or_path is {base!r}; it must name the "
                f"adapter's base model (or give the base with --base DIR)"
            )
        where = f"{cfg_file}: field base_model_name_or_path {base!r}"
    else:
        where = f"--base {base}"
    return _resolve_base(str(base), where), str(path.resolve())


def _resolve_base(base: str, where: str) -> str:
    """An adapter's base as HFLM's `pretrained`: a local checkpoint folder, or a hub id already
    in the Hugging Face cache (downloads only where the user set HF_HUB_OFFLINE=0)."""
    import os

    local = Path(base).expanduser()
    if local.is_dir():
        try:
            check_model_dir(local)
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None
        return str(local.resolve())
    if not _HUB_ID.fullmatch(base):
        raise ValueError(f"{where}: no such folder (give the base with --base DIR)")
    offline_defaults()
    if os.environ.get("HF_HUB_OFFLINE") == "0":
        return base  # the user allowed downloads: HFLM fetches it
    from huggingface_hub import try_to_load_from_cache

    if isinstance(try_to_load_from_cache(base, "config.json"), str):
        return base
    raise ValueError(
        f"{where}: not a local folder, and not in the Hugging Face cache (offline); give the base "
        f"with --base DIR, or allow the download with HF_HUB_OFFLINE=0"
    )


def _jsonable(raw: dict) -> dict:
    """lm-eval's result dict as plain JSON types (tuples, numpy scalars, sets, dtypes)."""
    from lm_eval.utils import handle_non_serializable

    return json.loads(json.dumps(raw, default=handle_non_serializable, ensure_ascii=False))


def _hflm(
    model: Any, peft: str | None, tokenizer: Any, device: str, batch_size: BatchSize, verbose: bool,
    max_length: int | None = None,
):  # fmt: skip
    """lm-eval's HFLM over a checkpoint folder (loaded on `device`; with `peft`, that adapter
    applied to it, unmerged, by HFLM itself) or a model object (moved there: HFLM takes the
    object's own device as its device); request bars off unless verbose."""
    from lm_eval.models.huggingface import HFLM

    if isinstance(model, (str, Path)):
        if tokenizer is None and peft is not None and _has_tokenizer(Path(peft)):
            tokenizer = peft  # the adapter's own tokenizer (training saves it), as load_tokenizer
        lm = HFLM(pretrained=str(model), peft=peft, tokenizer=tokenizer, device=device, batch_size=batch_size, trust_remote_code=False, max_length=max_length)  # fmt: skip
    else:
        model.to(device)
        lm = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=batch_size, max_length=max_length)  # fmt: skip
    if not verbose:
        request_bars_off(lm)
    return lm


def _has_tokenizer(folder: Path) -> bool:
    return (folder / "tokenizer_config.json").is_file() or (folder / "tokenizer.json").is_file()


def evaluate(
    model: Any,
    tasks: list[str],
    *,
    base: str | Path | None = None,
    tokenizer: Any = None,
    include_path: str | Path | list | None = None,
    limit: int | float | None = None,
    batch_size: BatchSize = 1,
    num_fewshot: int | None = None,
    device: str = "auto",
    max_gen_toks: int = DEFAULT_MAX_GEN_TOKS,
    out: Path | None = None,
    verbose: bool = True,
    max_length: int | None = None,
) -> dict:
    """Run lm-eval's `simple_evaluate` on a checkpoint folder or an in-memory model.

    No request cache is used (lm-eval keys it by prompt, not by model, so merge candidates
    would share answers). Samples are always logged so `predictions` can read them.

    Args:
        model: a checkpoint folder (str/Path; safetensors only), a PEFT adapter folder
            (evaluated on its base, see `eval_target`), or a transformers model object. An
            object is MOVED to the resolved device in place (`model.to(device)`; HFLM itself
            runs a given object wherever it is), so the caller's model lives there afterwards.
        tasks: lm-eval task or tag names, e.g. world_mgsm_direct_xa, belebele_swh_Latn.
        base: an adapter's base model, instead of its adapter_config.json's.
        tokenizer: required for an in-memory model; optional override for a folder.
        include_path: folder(s) of extra task YAMLs (e.g. from `write_world_tasks`).
        limit: first N docs per task (or a fraction if < 1); None for all.
        batch_size: an int, or "auto" (lm-eval's own search; see `check_batch_size`).
        num_fewshot: few-shot examples (None: each task's default).
        device: "auto" (cuda when there is one, else cpu) or a torch device; see
            `resolve_device`. The device used is recorded in the result's config.device.
        max_gen_toks: generation budget of generate_until tasks.
        out: if given, the raw result JSON is written there atomically.
        verbose: lm-eval's progress bars and INFO log, as its own CLI shows them; False: only
            its errors (see `lm_eval_api.lm_eval_output`, `request_bars_off`).
        max_length: HFLM's max_length (None: the model's); bounds lm-eval's "auto" batch probe
            (trainables/evaluate/fit.eval_batch).
    Returns:
        lm-eval's raw result dict (results, configs, n-samples, samples, ...) as JSON types.
        For an adapter, config.model is its base, config.peft the adapter folder and
        config.model_args lm-eval's own "pretrained=BASE,peft=ADAPTER".
    """
    model, peft, batch_size, device = _checked_inputs(model, tasks, base, tokenizer, batch_size, device)  # fmt: skip
    _check_size(model, device)
    lm_eval_output(verbose)  # before lm-eval logs: task indexing, HFLM's constructor
    tm = task_manager(list(tasks), include_path)
    lm = _hflm(model, peft, tokenizer, device, batch_size, verbose, max_length)
    run = dict(num_fewshot=num_fewshot, batch_size=batch_size, device=device, limit=limit, max_gen_toks=max_gen_toks)  # fmt: skip
    raw = _simple_evaluate(lm, model, tasks, tm, **run)
    return _recorded(raw, model, peft, out)


def _checked_inputs(model, tasks, base, tokenizer, batch_size, device) -> tuple:
    """The cheap checks, before task indexing and model loading take seconds.

    Returns:
        (model: HFLM's `pretrained` for a folder or the object, peft: the adapter folder or
        None, batch_size: checked, device: resolved).
    """
    if not tasks:
        raise ValueError("no tasks given")
    offline_defaults()
    batch_size = check_batch_size(batch_size)
    device = resolve_device(device)
    peft = None
    if isinstance(model, (str, Path)):
        model, peft = eval_target(Path(model), base)
    elif tokenizer is None:
        raise ValueError("an in-memory model needs its tokenizer (tokenizer=...)")
    return model, peft, batch_size, device


def _simple_evaluate(lm, model, tasks, tm, *, num_fewshot, batch_size, device, limit, max_gen_toks) -> dict:  # fmt: skip
    """lm-eval's simple_evaluate on `lm`, no request cache, samples logged, every forward's
    logits watched (NonFiniteOutputs naming `model` when one is not finite).

    Returns:
        the raw result dict (lm-eval's types).
    """
    from lm_eval import simple_evaluate

    # lazy: torch, loaded with lm-eval when an evaluation runs
    from layerswap.trainables.evaluate.finite_outputs import watch_logits

    with watch_logits(lm.model) as logits, offline_hint(tasks):
        raw = simple_evaluate(
            model=lm,
            tasks=list(tasks),
            num_fewshot=num_fewshot,
            batch_size=batch_size,
            device=device,
            limit=limit,
            use_cache=None,
            cache_requests=False,
            log_samples=True,
            gen_kwargs={"max_gen_toks": int(max_gen_toks)},
            task_manager=tm,
        )
    logits.check(str(model) if isinstance(model, (str, Path)) else type(model).__name__)
    if raw is None:  # only non-zero ranks of a distributed run get None
        raise ValueError("lm-eval returned no results (not rank 0?)")
    return raw


def _recorded(raw: dict, model, peft: str | None, out: Path | None) -> dict:
    """The result as JSON types, an adapter's base and folder recorded as lm-eval's CLI does,
    written to `out` atomically when given."""
    raw = _jsonable(dict(raw))
    if peft is not None:  # which base and adapter, as lm-eval's CLI records `--model_args`
        raw["config"].update(model=model, peft=peft, model_args=f"pretrained={model},peft={peft}")
    if out is not None:
        out = Path(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(out, json.dumps(raw, ensure_ascii=False, indent=1))
    return raw


def _check_size(model, device: str) -> None:
    """A large model on the CPU only with the opt-in (trainables/devices.py); a Hub id is
    counted from its config only when that is in the local cache."""
    if not str(device).startswith("cpu"):
        return
    if isinstance(model, (str, Path)):
        if not (Path(model) / "config.json").is_file():
            return  # a Hub id: counted once HFLM has it (not before: no network here)
        from transformers import AutoConfig

        n = config_params(AutoConfig.from_pretrained(str(model)))
    else:
        n = sum(p.numel() for p in model.parameters())
    check_cpu_size(n, device, f"evaluation of {model if isinstance(model, (str, Path)) else type(model).__name__}")  # fmt: skip


# ---------------------------------------------------------------- reading results


def _item_score(sample: dict, metric: str) -> float:
    """One sample's value of `metric`; lm-eval logs a Brier item as [gold index, "[p0 p1 ...]"]
    (numpy's text of the option probabilities), which lm-eval's own aggregation scores."""
    value = sample[metric]
    if metric != "brier_score":
        return float(value)
    from lm_eval.api.metrics import brier_score

    gold, probs = value
    p = [float(x) for x in str(probs).strip("[]").split()]
    return float(brier_score([(int(gold), p)]))


def predictions(raw: dict, task: str) -> list[dict]:
    """Per-doc records of one task from the logged samples, in doc order.

    Args:
        raw: a result dict from `evaluate` (or its JSON file, loaded).
        task: the task name.
    Returns:
        [{"doc_id", "prediction", "response", "target", "score", "correct"}]: prediction is
        the filtered response (generate_until) or the argmax choice index (multiple_choice);
        response is the generated text (None for multiple choice); score is the sample's value
        of the task's metric (see `score_key`; a Brier item's own Brier score); correct is
        score == 1, for a lower-is-better Brier task the argmax being the gold option.
    """
    metric, filt = score_key(raw, task)
    samples = (raw.get("samples") or {}).get(task)
    if samples is None:
        raise ValueError(f"task {task!r}: no logged samples (run with log_samples=True)")
    output_type = raw["configs"][task].get("output_type")
    rows = []
    for s in sorted((s for s in samples if s["filter"] == filt), key=lambda s: s["doc_id"]):
        response = None
        if output_type == "multiple_choice":
            lls = [float(r[0]) for r in s["filtered_resps"]]
            pred: Any = max(range(len(lls)), key=lambda i: (lls[i], -i))  # first max, as np
        else:
            pred = s["filtered_resps"][0]
            response = s["resps"][0][0] if s.get("resps") else None
        try:
            score = _item_score(s, metric)
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"task {task!r} doc {s['doc_id']}: cannot read its {metric} ({e!r})") from None  # fmt: skip
        correct = pred == s["target"] if metric == "brier_score" else score == 1.0
        rows.append({"doc_id": int(s["doc_id"]), "prediction": pred, "response": response,
                     "target": s["target"], "score": score, "correct": correct})  # fmt: skip
    return rows


def metrics_table(raw: dict) -> str:
    """A small text table: task, metric, filter, value, stderr, n, the reported score first."""
    lines = [f"{'task':<32} {'metric':<12} {'filter':<18} {'value':>7} {'stderr':>7} {'n':>5}"]
    for task in sorted(raw.get("results", {})):
        if task not in raw.get("configs", {}):
            continue  # a group/tag aggregate row
        res = raw["results"][task]
        n = (raw.get("n-samples") or {}).get(task, {}).get("effective", "")
        main = "{},{}".format(*score_key(raw, task))
        keys = [main, *sorted(k for k in res if "," in k and "_stderr" not in k and k != main)]
        for key in keys:
            metric, filt = key.split(",", 1)
            value = res[key]
            err = res.get(f"{metric}_stderr,{filt}")
            err_s = f"{err:7.4f}" if isinstance(err, (int, float)) else f"{'':>7}"
            lines.append(f"{task:<32} {metric:<12} {filt:<18} {float(value):7.4f} {err_s} {n!s:>5}")
            task, n = "", ""
    return "\n".join(lines)
