"""Drivers and their stores: the merge search (`search.py` driving Tune + Optuna through
`searcher.py`, one trial per recipe in `trial.py` / `tune_trial.py`, rows in `results.py`),
promotion to the full evaluation (`promote.py`), expert sweeps and their registry (`sweep.py`,
`registry.py`), and the demos (`demo.py`, `merge_demo.py`). Ray is imported only here and in
trainables/train/ray_train.py."""
