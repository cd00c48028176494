"""The merge search and its promotion: `search.py` drives Ray Tune + Optuna through `searcher.py`,
one trial per recipe in `trial.py` / `tune_trial.py`, rows in `results.py`, experts once per node
in `expert_store.py`, the pool in `pool.py`, checks before Ray in `preflight.py`; `promote.py`
gives the best recipes the full evaluation. Expert sweeps are experts/, the demo demo/."""
