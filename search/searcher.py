"""The merge search's searcher: OptunaSearch that records rows, serves repeats, tells Optuna the truth.

`LayerswapSearch` (via search/optuna_tune.py) writes each trial's row to the trial store before
telling Optuna its outcome (COMPLETE, PRUNED after screening, FAIL), a reproducible batch's rows
in one write, so search/reconcile.py can finish an interrupted study from the table on --resume.
A trial Ray lost (its actor or node died, Tune's retries spent) is a `lost` row, not a failed
one: `requeue_lost` (search/reconcile.py) runs its recipe again on --resume.
`make_sampler` (search/sampler.py) is the seeded TPE sampler.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from datetime import datetime, timezone
from functools import partial

import optuna

from layerswap.search.fidelity import gates, rung_values
from layerswap.search.optuna_tune import OptunaTuneSearch, trial_error
from layerswap.search.progress import TrialProgress
from layerswap.search.results import (
    LOST,
    MAX_LOSSES,
    PROXY_PREFIX,
    TWIN_LOST,
    TrialStore,
)
from layerswap.search.sampler import make_sampler  # noqa: F401 (the benchmarks import it here)
from layerswap.search.trial import combine
from layerswap.search.tune_trial import META, TWIN, served_result
from layerswap.spaces.recipe import dump_recipe
from layerswap.spaces.search_experiment import Proxy, SearchExperiment
from layerswap.spaces.search_space import ExpertPool, decode, expert_id, recipe_fields, suggest
from layerswap.trainables.model_ids import content_recipe_id

STATES = optuna.trial.TrialState


class LayerswapSearch(OptunaTuneSearch):
    """OptunaSearch that writes each trial's row, serves repeated recipes and tells Optuna the truth.

    - one report per trial: a screened-out trial is told PRUNED (its low-fidelity value only as an
      intermediate value), a failed one FAIL, never a low-fidelity value as COMPLETE;
    - a recipe already evaluated is served from the table (status "duplicate"); one proposed
      while an identical one is running waits for it;
    - the parquet row is written before Optuna is told, so a crash in between is reconciled on
      --resume from the row.
    """

    def __init__(
        self,
        *,
        exp: SearchExperiment,
        pool: ExpertPool,
        depth: int,
        store: TrialStore,
        progress: bool,
        **kw,
    ):
        self.exp, self.pool, self.depth, self.store, self.progress = (
            exp,
            pool,
            depth,
            store,
            progress,
        )
        self.pending: dict[str, str] = {}  # recipe id -> running trial id
        self.waiting: tuple | None = None  # async: a proposal held back while its twin runs
        self.batch: Batch | None = None  # reproducible: set by `plan_batches`
        self.meta: dict[str, dict] = {}
        self.errors: dict[str, BaseException | None] = {}  # trial id -> what Tune gave up on
        # One line per finished trial; a resumed run counts (and ranks) its earlier rows too.
        self.lines = None
        if progress:
            best = store.best(1)
            self.lines = TrialProgress(
                "search",
                exp.search.num_samples,
                done=store.spent(),
                best=(best[0]["objective"], f"#{best[0]['trial_id']}") if best else None,
            )
        space = partial(_space_fn, space=exp.space, depth=depth, pool=pool)
        super().__init__(space=space, **kw)

    def set_max_concurrency(self, max_concurrent: int) -> bool:
        """Called by Tune's ConcurrencyLimiter: the ETA divides by it. Returns False: the limiter
        still does the limiting."""
        if self.lines is not None:
            self.lines.concurrency = max(1, int(max_concurrent))
        return False

    def plan_batches(self, size: int, trials: int) -> None:
        """Reproducible mode: propose `size` trials at a time and learn from them in trial order.

        Each batch is asked from Optuna only once the previous one is told, and a batch is told
        only when all of it finished, in Optuna's trial order: what TPE sees at every proposal,
        and so the whole search, does not depend on which trial finishes first.

        Args:
            size: trials per batch (the search's concurrency).
            trials: trials this run will ask for in all (the last batch may be smaller).
        """
        self.batch = Batch(size=max(1, size), left=trials)

    def suggest(self, trial_id: str):
        if self.batch is not None:
            return self._suggest_in_batch(trial_id)
        if self.waiting is not None:
            ot_trial, params, rid = self.waiting
            if rid in self.pending:
                return None
            self.waiting = None
            self.bind(trial_id, ot_trial)
            return self._dress(trial_id, ot_trial, params, rid)
        asked = self._ask(trial_id)
        if asked is None:
            return None
        ot_trial, params, rid = asked
        if rid in self.pending:
            self.waiting = (ot_trial, params, rid)
            self.unbind(trial_id)
            return None
        return self._dress(trial_id, ot_trial, params, rid)

    def _suggest_in_batch(self, trial_id: str):
        """Reproducible mode's `suggest`: None while the current batch is full or not yet told."""
        if not self.batch.open():
            return None
        asked = self._ask(trial_id)
        if asked is None:
            return None
        ot_trial, params, rid = asked
        self.batch.ask(trial_id)
        # A twin of a recipe running in this batch is served from it when the batch is told.
        return self._dress(trial_id, ot_trial, params, rid, twin=rid in self.pending)

    def _ask(self, trial_id: str) -> tuple | None:
        """A new proposal from Optuna: (Optuna trial, params, recipe id by content), or None."""
        params = super().suggest(trial_id)
        if params is None:
            return None
        ot_trial = self.optuna_trial(trial_id)
        try:
            rid = content_recipe_id(decode(params, self.exp.space, self.depth, self.pool))
        except Exception:  # the trial reports the decoding error as a failed row
            rid = f"invalid-{ot_trial.number}"
        return ot_trial, params, rid

    def _dress(self, trial_id, ot_trial, params, rid, twin: bool = False) -> dict:
        served = {TWIN: rid} if twin else self.store.evaluated(rid)
        if served is None:
            self.pending[rid] = trial_id
        ot_trial.set_user_attr("recipe_id", rid)
        self.meta[trial_id] = {"number": ot_trial.number, "recipe_id": rid, "params": params}
        if self.lines is not None:
            self.lines.started(trial_id)
        search = self.exp.search
        bars = gates(search.fidelity, self.store.rows, search.multi_objective)
        return {**params, META: {"served": served, "gates": bars}}

    def note_error(self, trial_id: str, exc: BaseException | None) -> None:
        """The exception Tune gave up on for `trial_id` (optuna_tune.ErrorNotes, just before
        `on_trial_complete(error=True)`): it tells the trial's own error from Ray's."""
        self.errors[trial_id] = exc

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        pass  # one report per trial, handled at completion

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False):
        meta = self.meta.pop(trial_id, None)
        if meta is None or self.is_completed(trial_id):
            return
        self.mark_completed(trial_id)
        if self.batch is None:
            self._tell(trial_id, *self._record(trial_id, meta, result, error))
            return
        self.batch.held[trial_id] = (meta, result, error)
        if self.batch.done():
            held = sorted(self.batch.held.items(), key=lambda kv: kv[1][0]["number"])
            self.batch.next()
            # All the batch's rows in one write, then Optuna (in trial order, not the finishing
            # order): a kill leaves all rows or none, so --resume either re-runs the whole batch
            # in its place or tells Optuna the rest from the rows (`reconcile`), and the next
            # batch is asked from the history an uninterrupted run asks it from.
            with self.store.together():
                told = [(tid, *self._record(tid, *h)) for tid, h in held]
            for tid, row, res in told:
                self._tell(tid, row, res)

    def _record(self, trial_id: str, meta: dict, result: dict | None, error: bool) -> tuple:
        """Append the trial's row to the table (the table first: --resume trusts it).

        Returns:
            (row, result as Optuna is to hear it).
        """
        if self.pending.get(meta["recipe_id"]) == trial_id:
            del self.pending[meta["recipe_id"]]
        failure = None  # (status, error) of a trial that reported nothing
        if error or not result:
            own, text = trial_error(self.errors.pop(trial_id, None))
            failure, result = ("failed" if own else LOST, text), None
        elif TWIN in result:  # served from its twin, told just before
            source = self.store.evaluated(result[TWIN])
            result = served_result(source) if source is not None else None
            failure = None if source is not None else (LOST, TWIN_LOST)
        row = self._row(meta, result, failure)
        self.store.append(row)
        return row, result

    def _tell(self, trial_id: str, row: dict, result: dict | None) -> None:
        """Tell Optuna the recorded trial's outcome and print its progress line."""
        tell(self.study, self.optuna_trial(trial_id), row, result)
        if self.lines is not None:
            self.lines.finished(
                trial_id,
                status=row["status"],
                objective=row.get("objective"),
                label=f"#{row['trial_id']}",
                detail=_recipe_text(row),
            )

    def _row(self, meta: dict, result: dict | None, failure: tuple[str, str] | None = None) -> dict:
        row = {"trial_id": f"{meta['number']:04d}", "recipe_id": meta["recipe_id"]}
        row["params"] = json.dumps(meta["params"], sort_keys=True)
        row["finished_at"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
        try:
            recipe = decode(meta["params"], self.exp.space, self.depth, self.pool)
            row |= {"recipe_yaml": dump_recipe(recipe, meta["recipe_id"]), "method": recipe.method}
            row |= recipe_fields(recipe)
            row["task_expert_id"] = expert_id(self.pool, recipe.task_expert)
            row["language_expert_id"] = expert_id(self.pool, recipe.language_expert)
        except Exception as e:
            row |= {"status": "failed", "error": f"decode: {e}", "method": "layer_swap"}
            return row
        if result is None:  # no report: Ray's doing (lost), or the trial's own exception
            status, text = failure or (LOST, "no report (see the Ray logs)")
            if status == LOST and (n := self.store.losses(meta["recipe_id"]) + 1) >= MAX_LOSSES:
                status, text = "failed", f"lost to Ray {n} times, so failed (not run again): {text}"  # fmt: skip
            return row | {"status": status, "error": text}
        status = result.get("status", "failed")
        row["status"] = status
        row["error"] = result.get("error")
        # What its evaluator read, kept with the row: RUN/search/splits_read.json is derived from
        # the table (search._write_splits), so a driver killed before writing it loses nothing.
        splits = result.get("splits_read") or "[]"
        row["splits_read"] = json.dumps(sorted(map(list, json.loads(splits) if isinstance(splits, str) else splits)))  # fmt: skip
        for k in ("t_compose_s", "t_eval_s", "t_total_s", "t_move_s"):
            row[k] = float(result.get(k) or 0.0)
        row |= {
            k: result.get(k) for k in ("device", "gpu_ids", "expert_store", "placement", "node_id")
        }
        if status == "duplicate":
            row["error"] = f"served from trial {result.get('served_from')}"
            row["fidelity"] = result.get("fidelity")
            row["rungs"] = _json(result.get("rungs"))
            row["items_scored"] = 0  # nothing scored again
            row["objective"] = result.get("objective")
            if row["objective"] is not None and not math.isfinite(row["objective"]):
                row["objective"] = None
            row |= {k: v for k, v in result.items() if k.startswith(PROXY_PREFIX)}
            return row
        row["fidelity"] = int(result.get("fidelity") or 0)
        row["items_scored"] = int(result.get("items_scored") or 0)
        row["rungs"] = _json(result.get("rungs"))
        obj = result.get("objective")
        row["objective"] = (
            obj if status == "ok" and obj is not None and math.isfinite(obj) else None
        )
        row |= {k: float(v) for k, v in result.items() if k.startswith(PROXY_PREFIX)}
        return row


@dataclass
class Batch:
    """Reproducible mode's bookkeeping: the batch being run and the trials still to ask."""

    size: int
    left: int  # trials not yet asked in this run
    asked: list[str] = field(default_factory=list)
    held: dict[str, tuple] = field(default_factory=dict)  # finished, told when all are

    def open(self) -> bool:
        return len(self.asked) < self.size and self.left > 0

    def ask(self, trial_id: str) -> None:
        self.asked.append(trial_id)
        self.left -= 1

    def done(self) -> bool:
        """Every trial of the batch asked (or none left to ask) and finished."""
        return not self.open() and len(self.held) == len(self.asked)

    def next(self) -> None:
        self.asked, self.held = [], {}


def _json(value) -> str | None:
    """A list-valued result field as the table's JSON text (Tune may hand it over either way)."""
    if value is None or isinstance(value, str):
        return value
    return json.dumps(value)


def _recipe_text(row: dict) -> str:
    """A progress line's tail: the trial's number and recipe ("#0006 b=2 u=0 t_b=0 t_u=0 w=...")."""
    if row.get("bottom") is None:  # not decoded (the row's error says why)
        return f"#{row['trial_id']}"
    return (
        f"#{row['trial_id']} b={row['bottom']} u={row['top']} t_b={row.get('bottom_transition')} "
        f"t_u={row.get('top_transition')} w={row.get('weights')}"
    )


def _space_fn(trial, space, depth, pool):
    return suggest(trial, space, depth, pool)


def tell(study: optuna.Study, trial, row: dict, result: dict | None) -> None:
    """Tell Optuna the row's outcome: COMPLETE (full fidelity), PRUNED (screened out) or FAIL."""
    status = row["status"]
    if not isinstance(trial, int):  # the rung values, as Optuna's pruners and TPE read them
        for items, value in rung_values(row)[:-1] if status == "ok" else rung_values(row):
            trial.report(value, step=items)
    if status == "duplicate":
        status = (result or {}).get("source_status") or (
            "ok" if row["objective"] is not None else "failed"
        )
    try:
        if status == "ok" and row["objective"] is not None:
            n = len(study.directions)
            if n > 1:
                values = [(result or {}).get(f"objective_{i}") for i in range(n)]
                if any(v is None for v in values):
                    proxies = {
                        k[len(PROXY_PREFIX) :]: v
                        for k, v in row.items()
                        if k.startswith(PROXY_PREFIX)
                    }
                    # A served duplicate or a reconciled trial: its row keeps the raw
                    # scores; tell them normalised, as the trial itself reports them.
                    scales = _proxies(study)
                    values = combine(scales, {p.task: proxies.get(p.task) for p in scales})[1]
                study.tell(trial, values)
            else:
                study.tell(trial, row["objective"])
        elif status == "pruned":
            number = trial if isinstance(trial, int) else trial.number
            study.tell(number, state=STATES.PRUNED)
        else:
            study.tell(trial, state=STATES.FAIL)
    except Exception as e:  # e.g. already finished: the table stays the source of truth
        print(f"search: optuna tell for trial {row['trial_id']}: {e}")


def _proxies(study) -> list[Proxy]:
    """The study's proxies with their scales (search.search records them on the study; a study
    begun before the scales were recorded holds task names: accuracy-like scales, as then)."""
    saved = json.loads(study.user_attrs.get("proxies", "[]"))
    return [Proxy(task=p) if isinstance(p, str) else Proxy.model_validate(p) for p in saved]
