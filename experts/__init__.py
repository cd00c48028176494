"""Experts as a population: sweeps over training hyperparameters (`sweep.py`, Ray Tune) and the
expert registry they fill (`registry.py`, one Parquet row per scored checkpoint), which the merge
search draws its pool from. Training one expert is trainables/train/."""
