# Two entry points (README): `make run` and `make test`. Each creates .venv if it is missing.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
SCENARIO ?= scenarios/1T-1024gpu.yaml

.PHONY: run test bench clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first and pinned: 2.13.0 is the local CPU wheel; an unpinned torch pulls GBs of CUDA.
	$(BIN)/pip install -q "torch==2.13.0"
	$(BIN)/pip install -q -e ".[dev]"
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/zsim run $(SCENARIO)

test: $(STAMP)
	$(BIN)/python -m pytest -n 2 -m "not serial" tests
	$(BIN)/python -m pytest -p no:xdist -m serial tests

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_run.py

clean:
	rm -rf $(VENV) out
