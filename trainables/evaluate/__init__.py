"""Evaluation: lm-eval runs, the cached proxy evaluator, merging indicators, the scoring rule.

Rooms: `tasks` (the world's task YAMLs over lm-eval's configs), `harness` (lm-eval runs on
checkpoints or in-memory models), `proxy` + `proxy_lm` (the cached evaluator and its
model-side kernels), `indicators` (expert checkpoints scored on their kind's dev tasks).
"""
