"""What RUN/search holds and whether an experiment may start or resume it: the search's identity
(`search_identity`), the refusals a search checks before Ray starts or anything is written
(`check_search_dir`), the decoding its experts gave its trials (`pool_decoding`,
`check_decoding`, RUN/search/decoding.json) and the experts' contents (`pool_contents`,
`check_contents`, RUN/search/contents.json).
Tests: .venv/bin/python -m pytest -q tests/search/test_preflight_study.py tests/cli/test_bad_input_resume.py
tests/search/test_search_decoding.py tests/search/test_search_contents.py
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

from layerswap.search.preflight_study import study_problem
from layerswap.search.results import PROXY_PREFIX, TrialStore
from layerswap.spaces.search_experiment import SearchExperiment, SearchSettings
from layerswap.spaces.search_space import ExpertPool
from layerswap.trainables.atomic import atomic_write_text
from layerswap.trainables.merge.generation import decoding_digest
from layerswap.trainables.model_ids import model_content_id
from layerswap.trainables.outputs import OutputError, check_output

DECODING = "decoding.json"  # RUN/search/decoding.json: each pool checkpoint's decoding digest
# The digest rule decoding.json's digests were made by (trainables/merge/generation.py): 4 keeps
# contrastive search's top_k and beam sampling's repeated eos ids, which 3 dropped; 3 drops
# sampling-only fields when do_sample is off and repeated eos ids; 2 hashed DECODING_FIELDS only;
# 1 (an earlier layerswap) hashed every setting. Under an older rule equal settings could differ:
# digests of two rules cannot be compared, so a record of another rule is not.
DECODING_FORMAT = 4
# RUN/search/contents.json: each pool checkpoint's content id (trainables/model_ids.py) when the
# search started. 1: model_content_id's "sha256:" ids; a record of another rule is not compared.
CONTENTS = "contents.json"
CONTENTS_FORMAT = 1
# What a --resume may change: the budget and promotion. Everything else is the search's identity.
RESUMABLE = frozenset({"search", "promote"})
SHOWN = 4  # changed fields a refusal names; the rest are counted


def search_identity(exp: SearchExperiment) -> str:
    """A stable id of what a search compares (its budget and promotion may change on resume).

    Default proxies count as the list they resolve to, so a search saved with them spelled out
    (RUN/search/experiment.json) is the same search, and a changed default is a different one.
    """
    text = exp.explicit().model_dump_json(exclude=set(RESUMABLE))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def check_search_dir(
    exp: SearchExperiment, sdir: Path, store: TrialStore, db: Path, resume: bool
) -> None:
    """Refuse to overwrite a search, or to resume it as a changed experiment (reads only).

    Args:
        exp: the experiment to start or resume.
        sdir: RUN/search; store, db: its trials table and Optuna study.
        resume: --resume (or --continue): the saved run must be this experiment, with the same
            seed, objective and fidelity.
    Raises:
        OutputError naming the run, the field and both values.
    """
    if not resume and (store.rows or db.exists()):
        saved = sdir / "experiment.json"
        same = saved.exists() and search_identity(_saved_experiment(saved)) == search_identity(exp)
        raise OutputError(
            f"{sdir}: a search of this experiment exists; pass --resume to continue it (a "
            "finished one is only promoted, keeping every model already evaluated) or --overwrite to start over"
            if same
            else f"{sdir}: a search of a different experiment exists; pass --overwrite to "
            "start over (the old one is kept until the new one finishes) or choose another --out"
        )
    check_output(sdir, "search", allow_existing=True)
    saved = sdir / "experiment.json"
    if resume and saved.exists():
        before = _saved_experiment(saved)
        if search_identity(before) != search_identity(exp):
            # Only the budget and promotion may change on resume: rows must stay comparable.
            raise OutputError(
                f"--resume: the experiment differs from {saved} beyond search/promote: "
                f"{_identity_changes(before, exp)}; resume with the old experiment or start a new "
                "search (--out)"
            )
        _check_same_fidelity(exp, before.search, saved)
    scored = {k[len(PROXY_PREFIX) :] for r in store.rows for k, v in r.items() if k.startswith(PROXY_PREFIX) and v is not None}  # fmt: skip
    if resume and not scored <= {p.task for p in exp.proxy_list}:
        # A search saved before its default proxies changed (its experiment.json left them
        # implicit) would otherwise continue under another objective.
        raise OutputError(
            f"--resume: {store.path} holds trials scored on {sorted(scored)}, this experiment's "
            f"proxies are {[p.task for p in exp.proxy_list]}; start a new search (--out)"
        )
    if resume and (problem := study_problem(db, exp.name, store)) is not None:
        raise OutputError(f"--resume: {problem}")  # after the above: they name the cause


def _check_same_fidelity(exp: SearchExperiment, old_search: SearchSettings, saved: Path) -> None:
    """Refuse a --resume whose objective or fidelity differs from the saved run's, naming each.

    The budget may change on resume, these may not: the seed proposes every trial (a new one
    would make the table neither seed's search), `search.multi_objective` sets the study's
    directions and what a row's objective means (and turns the fidelity off), and the gates rank
    a new trial's rung values against the earlier rows' by rung index, so rows scored on other
    rungs (another policy, screen share or rungs) or ranked by another eta, keep_top or delta
    are not comparable to them.
    """
    pairs = [("search.seed", old_search.seed, exp.search.seed)]
    pairs += [("search.multi_objective", old_search.multi_objective, exp.search.multi_objective)]
    old, new = old_search.fidelity, exp.search.fidelity
    pairs += [(f"search.fidelity.{k}", getattr(old, k), getattr(new, k)) for k in type(new).model_fields]  # fmt: skip
    changed = [f"{name} was {a!r}, is now {b!r}" for name, a, b in pairs if a != b]
    if changed:
        raise OutputError(
            f"--resume: {'; '.join(changed)} ({saved}); a search keeps its seed, objective and "
            "fidelity: resume with the old ones or start a new search (--out)"
        )


def _identity_changes(before: SearchExperiment, after: SearchExperiment) -> str:
    """Each field of the search's identity (`search_identity`'s dump) that differs, as
    "dotted.path was OLD, is now NEW", the first SHOWN of them and a count of the rest."""
    dumps = [e.explicit().model_dump(mode="json", exclude=set(RESUMABLE)) for e in (before, after)]
    changed = _differences(*dumps, "")
    said = [f"{at or 'the experiment'} was {_short(a)}, is now {_short(b)}" for at, a, b in changed]
    if len(said) > SHOWN:
        said = [*said[:SHOWN], f"and {len(said) - SHOWN} more"]
    # Equal dumps with unequal hashes: only a mapping's key order differs.
    return "; ".join(said) or "the order of a mapping's keys differs"


_ABSENT = "(absent)"


def _differences(a: Any, b: Any, at: str) -> list[tuple[str, Any, Any]]:
    """(dotted path, old, new) of each leaf where two JSON dumps differ; a list of another
    length, or a value of another type, differs as a whole."""
    if isinstance(a, dict) and isinstance(b, dict):
        keys = dict.fromkeys([*a, *b])
        return [d for k in keys for d in _differences(a.get(k, _ABSENT), b.get(k, _ABSENT), f"{at}.{k}" if at else k)]  # fmt: skip
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [
            d
            for i, (x, y) in enumerate(zip(a, b, strict=True))
            for d in _differences(x, y, f"{at}[{i}]")
        ]
    return [] if a == b else [(at, a, b)]


def _short(value: Any, limit: int = 80) -> str:
    """A value for the refusal: a string (a path, a name) whole, a list or mapping cut short."""
    text = value if value == _ABSENT else repr(value)
    return text if isinstance(value, str) or len(text) <= limit else text[: limit - 3] + "..."


def _saved_experiment(saved: Path) -> SearchExperiment:
    """The saved run's experiment (RUN/search/experiment.json), its `search` settings as that run
    ran them.

    A run saved before fidelity policies existed has no `policy`: it screened when `screen` was
    set and stopped nothing otherwise, where today's default would read its fidelity as halving.
    """
    data = json.loads(saved.read_text())
    fidelity = data.get("search", {}).get("fidelity")
    if isinstance(fidelity, dict) and "policy" not in fidelity:
        fidelity["policy"] = "screen" if fidelity.get("screen") is not None else "none"
    return SearchExperiment.model_validate(data)


def pool_decoding(pool: ExpertPool) -> dict[str, str | None]:
    """Each checkpoint of the pool (the base, then the task and language experts) -> the digest
    of the generation settings a trial built on it decodes with (trainables/merge/generation.py:
    a recipe decodes as its primary checkpoint, a LoRA adapter as the base).

    A checkpoint whose settings cannot be read gets "unreadable: ..." (its trials fail on their
    own, as a broken expert's do), so a later change is still seen; one whose settings are not
    here yet (a Hub id not in the cache) gets None: not compared.
    """
    out = {}
    for ref in _pool_refs(pool):
        try:
            out[ref] = decoding_digest(ref, pool.base, known_only=True)
        except Exception as e:  # a corrupt generation_config.json: every trial on it fails
            out[ref] = f"unreadable: {type(e).__name__}"
    return out


def check_decoding(sdir: Path, now: dict[str, str | None], resume: bool) -> None:
    """Refuse to resume a search one of whose checkpoints now decodes otherwise (reads only).

    Trials score the live model, which decodes with its recipe's primary checkpoint's generation
    settings: rows scored before and after a changed generation_config.json are not comparable,
    in the trials table nor in the Optuna study, as with a changed experiment. A run folder
    saved without RUN/search/decoding.json (before it was recorded), or with one an earlier digest
    rule wrote (DECODING_FORMAT), is resumed with one line on stderr saying so.

    Args:
        sdir: RUN/search.
        now: `pool_decoding` of the pool the search resumes with.
        resume: --resume (or --continue); a new search checks nothing.
    Raises:
        OutputError naming the checkpoint and both digests.
    """
    saved = sdir / DECODING  # named in the refusal
    if not resume or (before := _recorded(sdir, DECODING, "decoding", DECODING_FORMAT)) is None:
        return
    unknown, changed = _compared(before, now)
    if unknown:  # a Hub id not in the cache when the search started, or now
        print(f"layerswap: the decoding of {', '.join(unknown)} could not be compared with the search's start (its settings were not in the local cache then, or are not now)", file=sys.stderr)  # fmt: skip
    if changed:
        said = "; ".join(f"{ref}: decoding {a} when the search started, {b} now" for ref, a, b in changed)  # fmt: skip
        raise OutputError(
            f"--resume: the generation settings (generation_config.json, else config.json) of "
            f"{said} ({saved}): its earlier trials decoded otherwise; put the old settings back, "
            "or start a new search (--out) or --overwrite"
        )


def write_decoding(sdir: Path, now: dict[str, str | None]) -> None:
    """Record `pool_decoding` in RUN/search/decoding.json (atomically), for a later --resume."""
    _write_record(sdir, DECODING, "decoding", DECODING_FORMAT, now)


def _write_record(sdir: Path, name: str, key: str, rule: int, now: dict[str, str | None]) -> None:
    """RUN/search/NAME: {checkpoint: digest} under `key`, with the digest rule as its `format`
    (what `_recorded` reads back), written atomically."""
    atomic_write_text(sdir / name, json.dumps({"format": rule, key: now}, indent=1, sort_keys=True))  # fmt: skip


def _pool_refs(pool: ExpertPool) -> list[str]:
    """The pool's checkpoints: the base, then the task and language experts, each once."""
    refs = [r for r in (pool.base, *(e.path for e in (*pool.task, *pool.language))) if r]
    return list(dict.fromkeys(refs))


def _recorded(sdir: Path, name: str, key: str, rule: int) -> dict[str, str | None] | None:
    """The {checkpoint: digest} a search recorded when it started (RUN/search/NAME, under
    `key`), or None, said in one line on stderr, where there is nothing to compare with: no
    search to resume, a run folder saved before the record existed, or a record of another
    digest rule (`rule`, its `format`).

    Raises:
        OutputError naming the file, when it cannot be read.
    """
    saved = sdir / name
    what = f"the experts' {key}"
    if not (sdir / "experiment.json").exists():
        return None  # no search started there: a new one
    try:
        record = json.loads(saved.read_text())
        before, written_by = record[key], record.get("format")
        if not isinstance(before, dict):
            raise TypeError(f"{key} is not an object")
    except FileNotFoundError:
        print(f"layerswap: {saved} missing (a search started before it was recorded): {what} could not be compared with its earlier trials'", file=sys.stderr)  # fmt: skip
        return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise OutputError(f"--resume: {saved}: unreadable ({e}); start a new search (--out) or --overwrite") from e  # fmt: skip
    if written_by != rule:
        print(f"layerswap: {saved} was written by an earlier layerswap (digest rule {written_by}, now {rule}): {what} could not be compared with its earlier trials'; it is recorded anew", file=sys.stderr)  # fmt: skip
        return None
    return before


def _compared(
    before: dict[str, str | None], now: dict[str, str | None]
) -> tuple[list[str], list[tuple[str, str | None, str | None]]]:
    """(checkpoints not compared: None then or now; (checkpoint, then, now) of each that
    differs) over the checkpoints both records hold (another pool is another experiment)."""
    both = [ref for ref in now if ref in before]
    unknown = [ref for ref in both if None in (before[ref], now[ref])]
    changed = [(r, before[r], now[r]) for r in both if r not in unknown and before[r] != now[r]]
    return unknown, changed


def pool_contents(pool: ExpertPool) -> dict[str, str | None]:
    """Each checkpoint of the pool -> its content id (trainables.model_ids.model_content_id: the
    sha256 of its weights' and configs' bytes), the id its trials' recipe ids are made of.

    A local folder's files are hashed once per process and not again while unchanged (the same
    cache, and within `saved_digests` the same RUN/search/model_ids.json, as the recipe ids), so
    a resume reads no expert again: the first run hashes what its first trial would have. A
    checkpoint that is not a local folder of weights (a Hub id, a URI) gets None: not compared.
    """
    out = {}
    for ref in _pool_refs(pool):
        cid = model_content_id(ref)
        out[ref] = None if cid == ref else cid  # model_content_id: "stands for itself"
    return out


def check_contents(sdir: Path, now: dict[str, str | None], resume: bool) -> None:
    """Refuse to resume a search one of whose checkpoints' weights or configs changed (reads only).

    The earlier trials scored the old checkpoint under the same expert ids: continuing would mix
    scores of two models in one table and one study, and promotion would rebuild an old row's
    recipe from the new weights. A run folder saved without RUN/search/contents.json is resumed
    with one line on stderr saying its experts could not be compared.

    Args:
        sdir: RUN/search.
        now: `pool_contents` of the pool the search resumes with.
        resume: --resume (or --continue); a new search checks nothing.
    Raises:
        OutputError naming the checkpoint and both content ids.
    """
    if not resume or (before := _recorded(sdir, CONTENTS, "contents", CONTENTS_FORMAT)) is None:
        return
    unknown, changed = _compared(before, now)
    if unknown:  # a Hub id or URI: what it names is not hashed here
        print(f"layerswap: the content of {', '.join(unknown)} could not be compared with the search's start (not a local checkpoint folder then, or not now)", file=sys.stderr)  # fmt: skip
    if changed:
        said = "; ".join(f"{ref}: content {a} when the search started, {b} now" for ref, a, b in changed)  # fmt: skip
        raise OutputError(
            f"--resume: the weights or configs of {said} ({sdir / CONTENTS}): its earlier trials "
            "scored the old checkpoint; put the old checkpoint back, or start a new search "
            "(--out) or --overwrite"
        )


def write_contents(sdir: Path, now: dict[str, str | None]) -> None:
    """Record `pool_contents` in RUN/search/contents.json (atomically), for a later --resume."""
    _write_record(sdir, CONTENTS, "contents", CONTENTS_FORMAT, now)
