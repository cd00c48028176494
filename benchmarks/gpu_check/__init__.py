"""The GPU check (`make gpu-check`; run.py's docstring): one process that measures every GPU claim
layerswap makes on one GPU, or every stage at a tiny shape on a CPU with --smoke."""
