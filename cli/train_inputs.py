"""What `layerswap train` checks before it creates or marks anything (cli/train.py calls
`check_inputs`): the base (a local folder's config and weights, or a Hub id's config.json,
cached or fetched), the datasets (readable, in a known schema, enough rows; a Hub source in the
datasets cache when downloads are off) and a GPU when the experiment asks for one. Every
problem is listed at once, each naming its field.

Tests: .venv/bin/python -m pytest -q tests/cli/test_train.py tests/cli/test_train_hub_sources.py
"""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path

from huggingface_hub import hf_hub_download, try_to_load_from_cache
from huggingface_hub.errors import (
    GatedRepoError,
    LocalEntryNotFoundError,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.utils import HFValidationError, validate_repo_id

from layerswap.spaces.base import is_hub_id
from layerswap.spaces.train_experiment import TrainExperiment
from layerswap.trainables.merge.arch import model_type_problem
from layerswap.trainables.storage import exists, is_uri


def check_inputs(exp: TrainExperiment) -> None:
    """Fail before any work (nothing marked or written) when an input named in the experiment
    is missing or unusable.

    A `base` that looks like a path (starts with /, ., ~ or exists) must be a model folder:
    config.json, and safetensors weights whose headers are intact (the merge's check; pickles
    are refused by name); anything else is taken as a Hub id. Dataset `source` names must be
    registered; local datasets are read as training will (`_data_problems`). Every problem is
    listed, not only the first.
    """
    problems = []
    if exp.scaling.use_gpu and not os.environ.get("RAY_ADDRESS"):
        # A local run trains here: a GPU it cannot use is refused now, not after Ray started.
        # On a cluster (RAY_ADDRESS) the workers' nodes decide; each worker checks its own.
        # lazy: torch, only for a GPU run
        from layerswap.trainables.devices import require_cuda

        try:
            require_cuda("scaling.use_gpu")
        except ValueError as e:  # DeviceUnusable
            problems.append(str(e))
    base = Path(exp.base).expanduser()
    if exp.base.startswith(("/", ".", "~")) or base.exists():
        if not (base / "config.json").is_file():
            problems.append(f"base: {exp.base} is not a model folder (no config.json)")
        else:
            problems += _model_type_problems(base / "config.json")
            problems += [f"base: {p}" for p in _weights_problems(base)]
            problems += _chat_template_problems(exp.base, base / "tokenizer_config.json")
    else:
        problems += _hub_base_problems(exp.base)
    problems += _data_problems(exp)
    if problems:
        raise ValueError("\n  ".join(problems))


def _hub_base_problems(base: str) -> list[str]:
    """A `base` that is no folder here must be a Hub id (owner/name), and one in the Hugging
    Face cache where the Hub is off (HF_HUB_OFFLINE=1): a mistyped relative path
    (runs/world/bsae) failed only after the run folder was marked, with the Hub's "Repo id must
    be in the form ..." and a marked folder that blocked the corrected rerun."""
    if is_uri(base):
        return []
    if not (is_hub_id(base) or _bare_hub_name(base)):
        return [f"base: {base}: no such folder, and not a Hub id (owner/name)"]
    if isinstance(cached := try_to_load_from_cache(base, "config.json"), str):
        # online or not: the family is known here, and the chat template when it is cached
        return _model_type_problems(Path(cached)) + _hub_template_problems(base)
    if os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes", "on"):
        return [
            f"base: {base}: not a folder here, and not in the Hugging Face cache while "
            "HF_HUB_OFFLINE=1 (fetch it with `layerswap prefetch`, or give a local folder)"
        ]
    return _fetched_config_problems(base)


def _fetched_config_problems(base: str) -> list[str]:
    """Fetch an uncached Hub base's config.json (a few KB, into the HF cache the trainer reads)
    and check its family: a gated, missing or unreachable base, or one of a family no merge
    takes, used to fail in the trainer after the run folder was marked."""
    # huggingface_hub retries a failed connection 5 times (~23 s), each with a warning line: one
    # line of ours says why the command waits, and the refusal below says what to do.
    http_log = logging.getLogger("huggingface_hub.utils._http")
    level = http_log.level
    http_log.setLevel(logging.ERROR)
    print(f"layerswap: base {base}: reading its config.json from the Hub", file=sys.stderr)
    try:
        config = hf_hub_download(base, "config.json")
    except GatedRepoError:  # a RepositoryNotFoundError: caught first
        return [
            f"base: {base}: a gated Hub repo this machine may not read (accept its license on "
            "huggingface.co and log in: `hf auth login` or HF_TOKEN)"
        ]
    except (RepositoryNotFoundError, RevisionNotFoundError):
        return [f"base: {base}: no such Hub repo (or a private one this machine may not read)"]
    except RemoteEntryNotFoundError:
        return [f"base: {base}: the Hub repo has no config.json, so it is not a model"]
    except LocalEntryNotFoundError:  # the Hub did not answer and the cache has no copy
        return [
            f"base: {base}: the Hugging Face Hub did not answer and its config.json is not "
            "cached (check the connection; on a machine without internet set HF_HUB_OFFLINE=1 "
            "and fetch the model with `layerswap prefetch` on one online)"
        ]
    finally:
        http_log.setLevel(level)
    return _model_type_problems(Path(config))


def _model_type_problems(config: Path) -> list[str]:
    """A base of a family layerswap does not merge (trainables/merge/arch.py), named before
    any GPU hour is spent on an expert no merge would take. The worker checks again from the
    config it loads (trainables/train/run_setup.py), for a sweep's trials on other nodes."""
    try:
        mtype = json.loads(config.read_text(encoding="utf-8")).get("model_type")
    except (OSError, ValueError, AttributeError) as e:
        return [f"base: {config}: not a readable config ({e})"]
    problem = model_type_problem(mtype)
    return [] if problem is None else [f"base: {config}: {problem}"]


# Where transformers 5 (tokenization_utils_base.from_pretrained) finds a tokenizer's chat
# templates: this file is the template named "default"; each NAME.jinja in the folder is one named
# NAME; and only where there are no such files, tokenizer_config.json's `chat_template` (one
# template, or a list of {name, template}).
TEMPLATE_FILE = "chat_template.jinja"
TEMPLATE_DIR = "additional_chat_templates"


def _has_default_template(folder: Path, config: dict) -> bool:
    """Whether transformers would give this tokenizer a default chat template, the one
    apply_chat_template uses when no template is named (as training calls it): template files,
    where there are any, replace tokenizer_config.json's; among named ones only "default" counts.

    Args:
        folder: the tokenizer's folder (or a Hub cache snapshot's).
        config: its tokenizer_config.json, parsed ({} when there is none).
    """
    named = {"default"} if (folder / TEMPLATE_FILE).is_file() else set()
    if (folder / TEMPLATE_DIR).is_dir():
        named |= {f.name.removesuffix(".jinja") for f in (folder / TEMPLATE_DIR).glob("*.jinja")}
    if named:
        return "default" in named
    template = config.get("chat_template")
    if isinstance(template, list):
        return any(isinstance(t, dict) and t.get("name") == "default" and t.get("template") for t in template)  # fmt: skip
    return isinstance(template, str) and bool(template)


def _chat_template_problems(base: str, tokenizer_config: Path) -> list[str]:
    """A base whose tokenizer has no default chat template: training formats every row with it
    (trainables/train/data.py), and without one it failed after the run folder was marked, with
    transformers' own message (on Ray, inside a worker). The rule is transformers'
    (`_has_default_template`).

    Args:
        base: the experiment's `base`, as written (for the message).
        tokenizer_config: the base's tokenizer_config.json (a folder's, or a cached Hub copy's).
    Returns:
        one line naming the base and what it lacks, or none.
    """
    folder = tokenizer_config.parent
    try:
        config = json.loads(tokenizer_config.read_text(encoding="utf-8"))
    except FileNotFoundError:
        config = {}  # no tokenizer config: templates only from files
    except (OSError, ValueError) as e:
        if (folder / TEMPLATE_FILE).is_file():
            return []  # the template is the file's (the tokenizer itself is another check's)
        return [f"base: {tokenizer_config}: not a readable tokenizer config ({e})"]
    if _has_default_template(folder, config if isinstance(config, dict) else {}):
        return []
    return [
        f"base: {base}: its tokenizer has no default chat template (no {TEMPLATE_FILE}, no "
        f"{TEMPLATE_DIR}/default.jinja, no `chat_template` in tokenizer_config.json); training "
        "formats every row with it: use an Instruct base or add its template "
        "(tokenizer.chat_template = ...; save_pretrained)"
    ]


def _hub_template_problems(base: str) -> list[str]:
    """A cached Hub base's chat template (`_chat_template_problems`, on its cache snapshot),
    checked only when the cache knows: its tokenizer_config.json is there, and chat_template.jinja
    is there or known absent (an uncached base is the trainer's to download; nothing is fetched
    for this). `layerswap prefetch` caches additional_chat_templates/ with it."""
    config = try_to_load_from_cache(base, "tokenizer_config.json")
    jinja = try_to_load_from_cache(base, TEMPLATE_FILE)
    if not isinstance(config, str) or jinja is None:  # not cached, or not known either way
        return []
    return _chat_template_problems(base, Path(config))


def _bare_hub_name(base: str) -> bool:
    """A Hub name without an owner (gpt2, t5-small): valid by huggingface_hub's rule, no `/`.
    spaces.base.is_hub_id leaves those out (a bare name is as likely a folder); with no folder
    of that name here, `from_pretrained` takes it from the Hub, so train must too."""
    if "/" in base:
        return False
    try:
        validate_repo_id(base)
    except HFValidationError:
        return False
    return True


def _weights_problems(folder: Path) -> list[str]:
    """Why a model folder's weights cannot be loaded safely (truncated, corrupt, pickles only)."""
    # lazy: torch (the merge engine's checkpoint reader); --help stays fast
    from layerswap.trainables.merge.checkpoint import Checkpoint
    from layerswap.trainables.merge.engine import check_checkpoint_finite

    try:
        with Checkpoint.open(folder) as ck:  # every shard's header, against its file's size
            # NaN or Inf in the base would train to a non-finite run: found before it is marked
            check_checkpoint_finite(ck)
    except (ValueError, OSError) as e:  # CheckpointError names the file (and the tensor)
        return [str(e)]
    return []


def _data_problems(exp: TrainExperiment) -> list[str]:
    """Every dataset missing, unreadable, in no known schema or too small, named: read here,
    because the trainer reads its data only after the run folder is marked and the base model
    loaded (a problem found then would leave a marked run that blocks the corrected rerun)."""
    # lazy: the trainer's readers (~0.9 s: the sources' table, pyarrow); --help stays fast
    from layerswap.trainables.train.pairs import path_problem

    problems = []
    for i, ds in enumerate(exp.datasets):
        if is_uri(ds.path):  # cloud storage: there or not here; read when training starts
            if not exists(ds.path):
                problems.append(f"datasets[{i}].path: {ds.path} does not exist")
        elif ds.path is not None and (problem := path_problem(ds.path)) is not None:
            problems.append(f"datasets[{i}].path: {problem}")  # a folder, a .csv: what is read
        if ds.source is not None:
            # lazy: the library (torch, Ray, lm-eval) loads when the command runs; --help stays fast
            from layerswap.trainables.train.sources import get_source

            try:
                get_source(ds.source)
            except ValueError as e:  # DataSourceError names the known ones
                problems.append(f"datasets[{i}].source: {e}")
            else:
                problems += _hub_source_problems(i, ds)
        for f in ds.data_files or []:
            if not Path(f).is_file():
                problems.append(f"datasets[{i}].data_files: {f} does not exist")
    if problems or any(is_uri(ds.path) for ds in exp.datasets):
        return problems
    # lazy: torch (the trainer's data module); --help stays fast
    from layerswap.trainables.train.data import check_datasets

    try:
        check_datasets(exp)  # "FILE:LINE: ...", or the rows a dataset has and needs
    except ValueError as e:
        problems.append(str(e))
    return problems


def _hub_source_problems(i: int, ds) -> list[str]:
    """A Hub training source the workers could not read: not in the local datasets cache while
    downloads are off (found only in the Ray workers, a minute in, with datasets' bare
    ConnectionError). Online, nothing is read here: the trainer downloads it.

    Args:
        i: the dataset's index in `datasets`.
        ds: the DatasetSpec (a registered `source`).
    Returns:
        one line naming the field and how to fetch the data, or none.
    """
    # lazy: the trainer's source readers (datasets loads only when one is read); --help stays fast
    from layerswap.trainables.prefetch import datasets_offline, uncached_dataset

    if ds.data_files or not datasets_offline():  # local files: checked above; online: trainer's
        return []
    try:
        why = uncached_dataset(ds.source, ds.language)
    except ValueError as e:  # DataSourceError: a language the source does not serve
        return [f"datasets[{i}].source: {e}"]
    if why is None:
        return []
    return [
        f"datasets[{i}].source: {ds.source} is not in the local Hugging Face datasets cache and "
        f"downloads are off ({why}); download it first with `layerswap prefetch CONFIG` (this "
        "experiment's YAML), or allow downloads with HF_HUB_OFFLINE=0 HF_DATASETS_OFFLINE=0"
    ]
