# One entry point for humans and CI: `make demo`, `make test`, `make docs` (each sets up .venv on
# first use).
# torch is installed before the project so a CPU machine takes the CPU wheel (torch==2.13.0 is on
# this kind of machine's disk) instead of pulling a multi-GB CUDA build through the torch>=2.6 range. A
# torch already in .venv is kept when it is 2.6.0 or newer, as pip and transformers 5.24 compare
# (a pre-release 2.6.0a0+git..., as NGC containers ship, is older: transformers disables it).
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH ?= torch==2.13.0
# The tested versions of everything else (the file cluster nodes install by; torch is left to
# TORCH, or to a GPU machine's own build). `make install CONSTRAINTS=` takes the newest versions
# pyproject.toml allows instead (tests/test_cluster_constraints.py then names what moved).
CONSTRAINTS ?= cluster-constraints.txt

define TORCH_OK
import re, sys, torch
m = re.match(r"(\d+)\.(\d+)\.?(\d*)([^+]*)", torch.__version__)
v = tuple(int(x or 0) for x in m.groups()[:3])
sys.exit(not (v > (2, 6, 0) or (v == (2, 6, 0) and not m[4])))
endef
export TORCH_OK

.PHONY: install demo test lint format bench-merge docs schemas gpu-check gpu-carry

$(VENV)/.installed: pyproject.toml $(CONSTRAINTS)
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check --upgrade pip
	$(PY) -c "$$TORCH_OK" 2>/dev/null || $(PY) -m pip install -q "$(TORCH)"
	grep -v '^torch==' $(or $(CONSTRAINTS),/dev/null) > $(VENV)/constraints.txt || true
	$(PY) -m pip install -q -c $(VENV)/constraints.txt -e '.[test,docs]'
	touch $@

install: $(VENV)/.installed

demo: install
	$(VENV)/bin/layerswap demo --out runs/demo --overwrite

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# The suite in TEST_WORKERS processes (pytest-xdist), each test file whole on one of them (its
# module-scoped Ray session and in-file order kept). Most of the suite waits on subprocesses and
# Ray start-up, so two processes on 2 cores finish it in far less time than one;
# `make test TEST_WORKERS=0` runs it in this one process.
TEST_WORKERS ?= 2
test: lint
	$(PY) -m pytest -q --durations=25 $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile)

format: install
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

# The guide (mkdocs + Material) into site/; --strict fails on a broken link or a warning. Its
# reference pages are generated from the code (docs/hooks/reference.py).
docs: install
	$(VENV)/bin/mkdocs build --strict

# The JSON Schemas of the config files, rewritten from the models (tests fail when they are stale).
schemas: install
	for kind in $$($(PY) -c "from layerswap.spaces.reference import KINDS; print(*KINDS)"); do \
		$(VENV)/bin/layerswap schema $$kind --out docs/schemas/$$kind.schema.json --overwrite || exit 1; \
	done

bench-merge: install
	$(PY) benchmarks/bench_merge.py

# The GPU check (benchmarks/gpu_check/run.py): on one H100 ~6 minutes, every GPU claim measured
# and set beside its target in OUT/report.md. `make gpu-check ARGS=--smoke` runs it on a CPU at a
# tiny shape (the test suite does, so it cannot rot). On the lent GPU machine, where there is no
# .venv: `source .gpu/on_device.sh && timeout -k 15 540 python3 benchmarks/gpu_check/run.py --out $$OUT/gpu_check`
# (.gpu/ is written by `bash ../shared/gpu/prepare.sh`, a workplace script outside this repository,
# then slimmed by `make gpu-carry` to fit the machine's 64 MiB per call with the tree)
# (it ends by its --budget-s 480 + 30 s, or its hang watchdog 20 s later; -k 15: SIGKILL what
# ignores timeout's SIGTERM; the measurements come back under $$OUT/gpu_check: apply them
# here with `python benchmarks/gpu_check/throughput.py DIR`).
GPU_CHECK_OUT ?= benchmarks/logs/gpu_check/$(shell date +%Y-%m-%d-%H%M)
gpu-check:
	$(if $(wildcard $(PY)),$(PY),python3) benchmarks/gpu_check/run.py --out $(GPU_CHECK_OUT) $(ARGS)

gpu-carry: install
	$(PY) benchmarks/gpu_check/carry.py
