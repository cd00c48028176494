"""The study planner behind `layerswap plan STUDY.yaml`: resolve a whole study offline, count its
runs, trials and evaluations (`plan.py`) and estimate device-hours from model shapes and a
throughput profile (`estimate.py`, the cost model). Nothing here trains, evaluates or starts Ray."""
