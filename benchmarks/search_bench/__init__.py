"""The parts of the merge-search benchmark (benchmarks/bench_search.py, whose docstring says what
is measured and how to run it): `space` (the grids and their enumeration), `experiments` (the
search experiments the parts run), `efficiency` ((c): the grid table and the samplers replayed
against it), `race` ((a) and (b): the search against a merge-to-disk + lm-eval loop) and
`shape_trials` ((d): trials of a real-shaped model). Not run on their own; imported through
bench_search.py, which puts tests/search/ (the expert builders) on sys.path.
"""


class RunsFailed(RuntimeError):
    """Trials of the benchmark failed or disagreed: no figure is reported, the exit is 1."""
