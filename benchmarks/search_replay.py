"""What a search's fidelity policy and concurrency mode cost and find, replayed on a scored grid.

Run: nice -n 10 .venv/bin/python benchmarks/search_replay.py --world W --experts MATH LANG --out F.json
     [--seeds 5] [--budget 0.3] [--items-from F.json]   (e.g. the demo's world and experts)

Every recipe of the demo's search space is scored once on every proxy item (in-process, the
trial's own evaluator; per-item scores kept in each proxy's seeded order). Then searches are
replayed against that table, `--seeds` seeds each, through the project's own rules: the
search's TPE (`search.searcher.make_sampler`), the driver's gates (`search.fidelity.gates`),
the trial's rung walk (`search.trial.score_rungs`) and what Optuna is told
(`search.searcher.tell`). For each of random search, TPE, TPE + screening (the shipped
settings) and TPE + successive halving, at concurrency 1 and 4 (reproducible batches; and 4
asynchronous, trials finishing in a seeded random order, durations proportional to the items
they score): how many trials and how many proxy items were spent before a top-5 % recipe was
scored on every item, and how often one was found within the budget.
bench_search.py (part (e) of its docstring) points here; it does not run it.
Smoke run (tests/benchmarks/test_search_replay.py): --world W --size tiny --seeds 1 --budget 0.5
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))  # bench_search (experiment, grid enumeration)
sys.path.insert(0, str(ROOT / "tests" / "search"))  # expert builders shared with the tests

import optuna  # noqa: E402
from bench_search import bench_experiment, enumerate_space  # noqa: E402

from layerswap.search.fidelity import gates, policy_of, rung_spans  # noqa: E402
from layerswap.search.searcher import make_sampler, tell  # noqa: E402
from layerswap.search.trial import TrialResult, TrialRunner, combine, score_rungs  # noqa: E402
from layerswap.spaces.search_experiment import Fidelity  # noqa: E402
from layerswap.spaces.search_space import decode, suggest, warm_start  # noqa: E402
from layerswap.trainables.atomic import atomic_write_text  # noqa: E402
from layerswap.trainables.evaluate.scoring import aggregate_score, task_key  # noqa: E402
from layerswap.trainables.evaluate.tasks import write_world_tasks  # noqa: E402
from layerswap.trainables.model_ids import content_recipe_id  # noqa: E402

# (name, sampler kind, fidelity settings over the experiment's); the shipped screen is the default
POLICIES = [
    ("random", "random", {"policy": "none"}),
    ("tpe", "tpe", {"policy": "none"}),
    ("tpe_screen", "tpe", {"policy": "screen"}),
    ("tpe_halving", "tpe", {"policy": "halving"}),
]
MODES = [("sequential", 1, True), ("batches_of_4", 4, True), ("async_4", 4, False)]


def score_items(exp, world: Path, depth: int, pool, grid: list[dict], tmp: Path) -> dict:
    """Every grid recipe's per-item scores: {recipe id: {proxy: [score per item, seeded order]}}.

    Raises:
        ValueError when a proxy's reported number is not the mean of its items (the replay
        averages prefixes of items, as the trial's rungs do).
    """

    write_world_tasks(world, tmp / "tasks")
    whole = _fidelity(exp, {"policy": "none"})
    runner = TrialRunner(whole, pool, [str(tmp / "tasks")])
    ev = runner.parts[0]
    keys = {t: "{},{}".format(*task_key(c.task)) for t, c in ev.tasks.items()}
    out, t0 = {}, time.perf_counter()
    for i, params in enumerate(grid):
        if i % 20 == 0:
            print(f"items: {i}/{len(grid)} recipes ({time.perf_counter() - t0:.0f}s)", flush=True)
        rec = decode(params, exp.space, depth, pool)
        runner.load(rec)
        res = ev.score(runner.model, 1.0)
        # Each item's number is the task's own aggregation over that item alone (a Brier score's
        # items hold (gold, probabilities) pairs); their mean must be what the task reports.
        aggs = {t: ev.tasks[t].task.aggregation()[keys[t].split(",")[0]] for t in res.items}
        scores = {
            t: [float(aggs[t]([r.metrics[keys[t]]])) for r in items]
            for t, items in res.items.items()
        }
        for t, s in scores.items():
            reported = aggregate_score(ev.tasks[t].task, res.aggregate[t])
            if abs(reported - statistics.fmean(s)) > 1e-9:
                raise ValueError(f"{t}: reported {reported} is not the mean of its items")
        out[content_recipe_id(rec)] = scores
    return out


def _fidelity(exp, fields: dict):
    """`exp` with the shipped fidelity defaults but for `fields`."""

    fid = Fidelity.model_validate(fields)
    return exp.model_copy(update={"search": exp.search.model_copy(update={"fidelity": fid})})


class Replay:
    """One replayed search: asks, gates, rung walks and tells, against the scored items."""

    def __init__(self, exp, depth, pool, items: dict, sampler, warm: dict | None):

        self.exp, self.depth, self.pool, self.items = exp, depth, pool, items
        self.study = optuna.create_study(direction="maximize", sampler=sampler)
        if warm is not None:
            self.study.enqueue_trial(warm)
        self.policy = policy_of(exp.search.fidelity)
        first = next(iter(items.values()))
        self.n_items = {t: len(s) for t, s in first.items()}
        self.spans = rung_spans(self.policy.shares(exp.search.fidelity), self.n_items)
        self.rows: list[dict] = []
        self.done: dict[str, dict] = {}  # recipe id -> its row (repeats are served)

    def ask(self):

        t = self.study.ask()
        suggest(t, self.exp.space, self.depth, self.pool)
        bars = gates(self.exp.search.fidelity, self.rows)
        return t, content_recipe_id(decode(t.params, self.exp.space, self.depth, self.pool)), bars

    def score(self, rid: str, gates) -> dict:
        """The row a trial of `rid` would write (served when the recipe was scored before)."""

        if rid in self.done:
            return {**self.done[rid], "status": "duplicate", "items_scored": 0,
                    "source_status": self.done[rid]["status"]}  # fmt: skip
        per = self.items[rid]

        def part(span):
            return lambda: {t: (statistics.fmean(per[t][a:b]), b - a) for t, (a, b) in span.items()}

        parts = [part(span) for span in self.spans]
        res = TrialResult(status="ok")
        score_rungs(res, self.exp, self.policy, self.n_items, gates, parts)
        row = {"status": res.status, "objective": res.objective if res.status == "ok" else None,
               "rungs": json.dumps(res.rungs), "items_scored": res.items_scored, "recipe_id": rid}  # fmt: skip
        self.done[rid] = row
        return row

    def tell(self, trial, row: dict) -> None:

        self.rows.append(row)
        tell(self.study, trial, row, {"source_status": row.get("source_status")})


def run_one(exp, depth, pool, items, sampler, warm, budget, top, concurrency, reproducible, seed):
    """One search of `budget` trials; returns trials and items spent until a top recipe was
    scored on every item (None: not within the budget) and the items spent in all."""
    rp = Replay(exp, depth, pool, items, sampler, warm)
    spent, hit = 0, None
    order = random.Random(f"finish:{seed}")
    finished = []  # (trial number, row) in the order they finish
    if reproducible:
        while len(finished) < budget:
            batch = [rp.ask() for _ in range(min(concurrency, budget - len(finished)))]
            rows = [(t, rp.score(rid, g)) for t, rid, g in batch]  # gates from earlier batches
            for t, row in rows:  # told in trial order once all finished
                rp.tell(t, row)
                finished.append((t.number, row))
    else:
        clock, running = 0.0, []
        while len(finished) < budget:
            while len(running) < concurrency and len(finished) + len(running) < budget:
                t, rid, g = rp.ask()
                row = rp.score(rid, g)
                duration = (row["items_scored"] + 1) * order.uniform(0.5, 1.5)
                heapq.heappush(running, (clock + duration, t.number, t, row))
            clock, _, t, row = heapq.heappop(running)
            rp.tell(t, row)
            finished.append((t.number, row))
    for i, (_, row) in enumerate(sorted(finished, key=lambda x: x[0]), start=1):
        spent += row["items_scored"]
        if hit is None and row["status"] == "ok" and row["recipe_id"] in top:
            hit = (i, spent)
    total = sum(r["items_scored"] for _, r in finished)
    return {"trials": hit[0] if hit else None, "items": hit[1] if hit else None, "items_in_all": total}  # fmt: skip


def policy_report(exp, depth, pool, items: dict, budget_share: float, seeds: int) -> dict:
    """Every policy x mode over `seeds` seeds: hit rate, median trials and items to a top-5 %
    recipe (a miss counts as the whole budget's items), items spent in all."""

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    full = {rid: combine(exp.proxy_list, {t: statistics.fmean(s) for t, s in per.items()})[0]
            for rid, per in items.items()}  # fmt: skip
    values = sorted(full.values(), reverse=True)
    cut = values[max(0, int(0.05 * len(values)) - 1)]
    top = {r for r, v in full.items() if v >= cut}
    budget = max(1, int(budget_share * len(items)))
    per_recipe = sum(len(s) for s in next(iter(items.values())).values())
    out = {"grid_size": len(items), "top5_count": len(top), "top5_threshold": cut,
           "budget_trials": budget, "items_per_full_trial": per_recipe, "results": {}}  # fmt: skip
    for name, kind, fields in POLICIES:
        exp_p = _fidelity(exp, fields)
        for mode, conc, repro in MODES:
            runs = []
            for s in range(seeds):
                exp_s = exp_p.model_copy(update={"search": exp_p.search.model_copy(update={"seed": s, "num_samples": budget})})  # fmt: skip
                sampler = make_sampler(exp_s) if kind == "tpe" else optuna.samplers.RandomSampler(seed=s)  # fmt: skip
                warm = warm_start(exp.space, depth, pool) if kind == "tpe" else None
                runs.append(run_one(exp_s, depth, pool, items, sampler, warm, budget, top, conc, repro, s))  # fmt: skip
            out["results"][f"{name}/{mode}"] = _summary(runs)
    return out


def _summary(runs: list[dict]) -> dict:
    """Hit rate and medians over seeds; a search that missed counts as never reaching the top
    (a median that falls on a miss is None)."""
    found = [r for r in runs if r["trials"] is not None]
    items = statistics.median([r["items"] if r["items"] is not None else math.inf for r in runs])
    return {
        "hit_rate": f"{len(found)}/{len(runs)}",
        "trials_to_top5": [r["trials"] for r in runs],
        "items_to_top5": [r["items"] for r in runs],
        "median_items_to_top5": items if math.isfinite(items) else None,
        "items_in_all": [r["items_in_all"] for r in runs],
        "median_items_in_all": statistics.median([r["items_in_all"] for r in runs]),
    }


def table(report: dict) -> str:
    """The report as a Markdown table, with each policy's items relative to plain TPE's."""
    res = report["results"]
    lines = ["| search | hit rate | median items to top-5 % | vs TPE | median trials of hits | items in all |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    for key, r in res.items():
        base = res[f"tpe/{key.split('/')[1]}"]["median_items_to_top5"]
        mine = r["median_items_to_top5"]
        ratio = f"{mine / base:.2f}" if mine is not None and base else "-"
        trials = [t for t in r["trials_to_top5"] if t is not None]
        med_t = statistics.median(trials) if trials else "-"
        shown = "miss" if mine is None else f"{mine:g}"
        lines.append(f"| {key} | {r['hit_rate']} | {shown} | {ratio} | {med_t} | {r['median_items_in_all']:g} |")  # fmt: skip
    return "\n".join(lines)


def main(argv=None) -> int:

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--world", type=Path, help="an embedded world (default: build one at --size)")
    ap.add_argument("--size", default="tiny", choices=["tiny", "full"])
    ap.add_argument("--experts", type=Path, nargs=2, metavar=("MATH", "LANG"), help="trained checkpoints from --world's base (default: two quick tiny experts)")  # fmt: skip
    ap.add_argument("--max-gen-toks", type=int, default=24, help="MGSM generation budget")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--budget", type=float, default=0.3, help="search budget, share of the grid")
    ap.add_argument("--items-from", type=Path, help="reuse the per-item grid of an earlier --out")
    ap.add_argument("--out", type=Path, default=ROOT / "bench-out" / "search_replay.json")
    args = ap.parse_args(argv)
    args.space, args.recipes = "demo", 1  # bench_experiment's fields: the demo's search space
    with tempfile.TemporaryDirectory(prefix="search-replay-") as tmp:
        exp, world, depth, pool = bench_experiment(args, Path(tmp))
        grid = enumerate_space(exp.space, depth, pool)
        print(f"grid: {len(grid)} recipes (depth {depth})", flush=True)
        if args.items_from:
            items = json.loads(args.items_from.read_text())["items"]
        else:
            items = score_items(exp, Path(world), depth, pool, grid, Path(tmp))
        report = policy_report(exp, depth, pool, items, args.budget, args.seeds)
    print(table(report))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out, json.dumps({**report, "items": items}))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
