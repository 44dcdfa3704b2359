# Two entry points (README): `make run` and `make test`. Each creates .venv if it is missing.

# No built-in implicit rules: nothing here needs them, and make tried them on each of the ~140 source
# files that .venv/.compiled depends on, which took 0.035 s of every `make run` (0.005 s without).
MAKEFLAGS += --no-builtin-rules
.SUFFIXES:

PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
# Two stamps, two environments in one .venv: `make run` installs what `zsim run` needs (the simulator's
# dependencies), `make test` adds the rest (torch, scipy, the test tools) on top (issue 28).
RUN_STAMP  := $(VENV)/.installed-run
TEST_STAMP := $(VENV)/.installed-test
PYC     := $(VENV)/.compiled
SOURCES := $(shell find zsim runtime -name '*.py')
SCENARIO ?= scenarios/1T-1024gpu.yaml
# pip drives the venv from outside (pip >= 22.3's --python) when $(PY) has pip: the venv is then made
# without one, which saves ensurepip's install of pip (`python3 -m venv` took 6.2 s with pip, 0.2 s
# without, on the 2-core development box); a $(PY) without pip makes the venv with its own (slower, same
# result). Python >= 3.11 (requires-python) ships pip >= 22.3, which has --python.
# A shell command substitution, so that it reads the venv as it is when the recipe line runs.
PIP      = $$(if [ -x $(BIN)/pip ]; then echo $(BIN)/python -m pip; else echo $(PY) -m pip --python $(BIN)/python; fi)
# Byte-code is written where the sources are read: here even under PYTHONDONTWRITEBYTECODE (set on the
# development machine), which would otherwise recompile every imported module on every run (~0.1-0.3 s).
WRITE_PYC := PYTHONDONTWRITEBYTECODE=

.PHONY: run test bench validate-replay device-check device-check-dry clean

# --no-compile: pip would compile every module of numpy, matplotlib, networkx and fontTools (8.6 s of
# the 18.9 s the simulator's dependencies took cold, measured); $(PYC) compiles the ones zsim imports.
$(RUN_STAMP): pyproject.toml setup.py
	@if $(PY) -m pip --version > /dev/null 2>&1; then $(PY) -m venv --without-pip $(VENV); else $(PY) -m venv $(VENV); fi
	@echo "pip install -e . (the simulator's dependencies, into $(VENV))"
	@$(PIP) install -q --no-compile -e .
	@touch $(RUN_STAMP)

$(TEST_STAMP): $(RUN_STAMP)
	# torch first and pinned: 2.13.0 is the local CPU wheel; an unpinned torch pulls GBs of CUDA.
	@echo 'pip install "torch==2.13.0" (into $(VENV))'
	@$(PIP) install -q "torch==2.13.0"
	# The tests' tools (pip among them), scipy for the fits, and the runtime extra (torch, already satisfied).
	@echo 'pip install -e ".[dev,fit,runtime]" (into $(VENV))'
	@$(PIP) install -q -e ".[dev,fit,runtime]"
	# Byte-code for every library, those `make run` installed uncompiled included: the tests start many
	# processes (an optimisation only: a file that does not compile is left to the interpreter).
	@$(WRITE_PYC) $(BIN)/python -m compileall -q -j 0 "$$($(BIN)/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")" > /dev/null || true
	@touch $(TEST_STAMP)

# Byte-code for the sources, written once per change, and for the libraries a flagship `zsim run` and
# its background plots import (pip installed them uncompiled): importing them writes only what is
# imported (2.5 s of CPU, against pip's 8.6 s for every module of every library).
$(PYC): $(RUN_STAMP) $(SOURCES)
	@$(WRITE_PYC) $(BIN)/python -m compileall -q zsim runtime > /dev/null
	@$(WRITE_PYC) $(BIN)/python -c "import matplotlib.pyplot, msgspec, numpy, simpy, yaml"
	@touch $(PYC)

run: $(PYC)
	$(BIN)/zsim run $(SCENARIO)

test: $(TEST_STAMP) $(PYC)
	$(BIN)/python -m pytest -n 2 -m "not serial" tests

# The held-out replay validation (issue 10): records real runtime runs on this machine, calibrates on
# some and replays the others; it needs the cores to itself, so it is not part of `make test` (CI):
# its step-time errors were 12-19% (median) on a loaded machine, against the 10% criterion.
validate-replay: $(TEST_STAMP) $(PYC)
	$(BIN)/python -m pytest -p no:xdist -m serial tests -s

bench: $(PYC)
	$(BIN)/python benchmarks/bench_start.py
	$(BIN)/python benchmarks/bench_run.py

# The device check (issue 26, docs/device-check.md): on a machine with one GPU and a CUDA torch, records
# runtime traces with Kineto, torch.cuda.memory_stats per step, a GEMM table and allocator-limit runs
# into data/device/<date>/. DEVICE_PY: the Python with CUDA torch (default the venv's); GEMM_SHAPES:
# DeepBench's table, whose shapes are timed, read from ../shared when it is there.
DEVICE_PY   ?= $(BIN)/python
DEVICE_OUT  ?= data/device/$(shell date -u +%Y%m%d-%H%M)
GEMM_SHAPES ?= $(wildcard ../shared/data/deepbench-v100/gemm_fp16_tensorcore.csv)
device-check:
	ZSIM_COMMIT=$$(git rev-parse HEAD 2>/dev/null) $(DEVICE_PY) -m zsim.runtime.device_check -o $(DEVICE_OUT) \
		$(if $(GEMM_SHAPES),--gemm-shapes $(GEMM_SHAPES))

# The same script on this CPU with tiny shapes (what tests/runtime/test_device_check.py runs); it needs torch,
# which the test environment brings
device-check-dry: $(TEST_STAMP) $(PYC)
	$(BIN)/python -m zsim.runtime.device_check --dry-run -o out/device-check-dry $(if $(GEMM_SHAPES),--gemm-shapes $(GEMM_SHAPES))

clean:
	rm -rf $(VENV) out
