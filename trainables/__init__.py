"""The work as plain functions: merging (`merge/`), evaluating (`evaluate/`), training (`train/`).

Nothing here imports ray except `train/ray_train.py`, the thin Ray Train wrapper of the loop,
`train/ray_failures.py`, its adapter over Ray's failure policy, and `ray_session.py`, which starts
or joins a cluster; the search drivers that wire these pieces into Ray Tune live in `search/`.
"""
