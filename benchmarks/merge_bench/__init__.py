"""The parts of the merge benchmark (benchmarks/bench_merge.py, whose docstring says what is
measured and how to run it): `experts` (the shapes, the recipe and the cached random experts),
`contenders` (each timed contender, and the launcher that measures a command's peak RSS),
`compare` (mergekit's output against ours, tensor by tensor) and `report` (medians, ratios,
targets, the printed table and bench_merge.json). Not run on their own.
"""
