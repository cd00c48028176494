"""RUN/search/trials.parquet: one row per merge-search trial, rewritten atomically as trials finish.

`TrialStore(path)` loads existing rows (for --resume); `append(row)` adds one and rewrites the file;
inside `with store.together():` the rows appended are written in one rewrite at the end (a batch).
A `lost` row is a trial Ray lost (its process or node died, Tune's retries spent): it spends no
budget, is never served to a repeat, and --resume runs its recipe again (search/searcher.py).
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from layerswap.trainables.atomic import atomic_write, read_parquet

# The table's fixed columns, in order (the schema analysis/load.py reads); proxy__<task> columns follow.
COLUMNS: dict[str, pa.DataType] = {
    "trial_id": pa.string(),
    "recipe_id": pa.string(),
    "recipe_yaml": pa.string(),
    "method": pa.string(),
    "params": pa.string(),
    "bottom": pa.int64(),
    "top": pa.int64(),
    "bottom_transition": pa.int64(),
    "top_transition": pa.int64(),
    "weights": pa.string(),
    "non_layer": pa.string(),
    "granularity": pa.string(),
    "task_expert_id": pa.string(),
    "language_expert_id": pa.string(),
    "status": pa.string(),
    "error": pa.string(),
    "fidelity": pa.int64(),
    "items_scored": pa.int64(),  # items scored over all proxies: what the trial cost
    "rungs": pa.string(),  # JSON [[items, objective], ...] per fidelity rung reached
    "objective": pa.float64(),
    "t_compose_s": pa.float64(),
    "t_eval_s": pa.float64(),
    "t_total_s": pa.float64(),
    "finished_at": pa.string(),
    # Where the trial ran (search/tune_trial.trial_device) and held the experts.
    "t_move_s": pa.float64(),
    "device": pa.string(),
    "gpu_ids": pa.string(),
    "expert_store": pa.string(),
    "placement": pa.string(),
    "node_id": pa.string(),  # the Ray node the trial's final attempt ran on
    "splits_read": pa.string(),  # JSON [[task, split], ...] its evaluator read (splits_read.json)
}
PROXY_PREFIX = "proxy__"
# The status of a trial Ray lost, not the trial's own outcome: not counted, not served, re-run.
LOST = "lost"
# A recipe Ray lost this many times is failed the next: a loss that recurs (an OOM kill of a
# merge that never fits, a store that cannot start) would otherwise be re-queued by every
# --resume, and the search would never finish.
MAX_LOSSES = 3
TWIN_LOST = "its twin trial was lost"  # the error of a twin row whose source Ray lost


def write_parquet_atomic(path: Path, rows: list[dict], columns: dict[str, pa.DataType]) -> None:
    """Write rows (missing keys -> null) with the given typed columns plus any extra float ones."""
    extra = sorted({k for r in rows for k in r} - set(columns))
    schema = pa.schema([*columns.items(), *((k, pa.float64()) for k in extra)])
    table = pa.Table.from_pylist([{k: r.get(k) for k in schema.names} for r in rows], schema=schema)
    atomic_write(path, lambda tmp: pq.write_table(table, tmp))


class TrialStore:
    """The trial table in memory and on disk; lookups by recipe id for serving repeats.

    Args:
        path: RUN/search/trials.parquet (loaded if it exists).
    """

    def __init__(self, path: Path):
        self.path = Path(path)
        self.rows: list[dict] = []
        self.deferred = False  # inside `together`: appends wait for its one write
        if self.path.exists():
            try:
                self.rows = read_parquet(self.path).to_pylist()
            except (OSError, ValueError) as e:  # pyarrow names a damaged file '<Buffer>'
                raise ValueError(
                    f"{self.path}: not a readable trial table ({e}); restore it, or start "
                    "the search over with --overwrite"
                ) from None

    def __len__(self) -> int:
        return len(self.rows)

    def spent(self) -> int:
        """Trials that count toward search.num_samples: every row but the lost ones."""
        return sum(r["status"] != LOST for r in self.rows)

    def losses(self, recipe_id: str) -> int:
        """How many times Ray lost a trial of this recipe (a twin lost with it is no loss of
        its own: one node loss under a batch with three copies would count three)."""
        return sum(
            r["status"] == LOST and r["recipe_id"] == recipe_id and r.get("error") != TWIN_LOST
            for r in self.rows
        )

    def lost(self) -> list[dict]:
        """The rows of trials Ray lost (each to run again on --resume)."""
        return [r for r in self.rows if r["status"] == LOST]

    def ids(self) -> set[str]:
        return {r["trial_id"] for r in self.rows}

    def append(self, row: dict) -> None:
        if row["trial_id"] in self.ids():
            raise ValueError(f"trial {row['trial_id']} is already in {self.path}")
        self.rows.append(row)
        if not self.deferred:
            self._write()

    @contextmanager
    def together(self):
        """Rows appended inside are written in one atomic rewrite when it ends: a kill leaves
        all of them on disk or none. They are visible to lookups (`evaluated`) meanwhile; if the
        block (or the write) raises, they are dropped from memory too."""
        before, self.deferred = len(self.rows), True
        try:
            yield self
            self.deferred = False
            if len(self.rows) > before:
                self._write()
        except BaseException:  # the block or the write failed: memory stays as the disk is
            del self.rows[before:]
            raise
        finally:
            self.deferred = False

    def _write(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_parquet_atomic(self.path, self.rows, COLUMNS)

    def evaluated(self, recipe_id: str) -> dict | None:
        """The row that evaluated this recipe (status ok/failed/pruned), if any; never a lost one."""
        for r in self.rows:
            if r["recipe_id"] == recipe_id and r["status"] not in ("duplicate", LOST):
                return r
        return None

    def kth_best(self, k: int) -> float | None:
        """The k-th best full-fidelity objective so far (None until k trials are complete)."""
        vals = sorted(
            (
                r["objective"]
                for r in self.rows
                if r["status"] == "ok" and r["objective"] is not None
            ),
            reverse=True,
        )
        return vals[k - 1] if len(vals) >= k else None

    def best(self, k: int) -> list[dict]:
        """Top-k distinct recipes by objective among full-fidelity (status ok) rows."""
        seen, out = set(), []
        ok = [r for r in self.rows if r["status"] == "ok" and r["objective"] is not None]
        for r in sorted(ok, key=lambda r: (-r["objective"], r["trial_id"])):
            if r["recipe_id"] not in seen:
                seen.add(r["recipe_id"])
                out.append(r)
        return out[:k]


def proxies_of(row: dict) -> dict[str, float]:
    return {k[len(PROXY_PREFIX) :]: v for k, v in row.items() if k.startswith(PROXY_PREFIX)}


def params_of(row: dict) -> dict:
    return json.loads(row["params"])
