"""The work as plain functions: merging (`merge/`), evaluating (`evaluate/`), training (`train/`).

Nothing here imports ray except `train/ray_train.py`, the thin Ray Train wrapper of the loop, and
`train/ray_failures.py`, its adapter over Ray's failure policy; the search drivers that wire these pieces into Ray Tune live in `search/`.
"""
