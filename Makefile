# Two entry points (README): `make run` and `make test`. Each creates .venv if it is missing.

# No built-in implicit rules: nothing here needs them, and make tried them on each of the ~140 source
# files that .venv/.compiled depends on, which took 0.035 s of every `make run` (0.005 s without).
MAKEFLAGS += --no-builtin-rules
.SUFFIXES:

PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
PYC     := $(VENV)/.compiled
SOURCES := $(shell find zsim runtime -name '*.py')
SCENARIO ?= scenarios/1T-1024gpu.yaml

.PHONY: run test bench validate-replay device-check device-check-dry clean

$(STAMP): pyproject.toml setup.py
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first and pinned: 2.13.0 is the local CPU wheel; an unpinned torch pulls GBs of CUDA.
	$(BIN)/pip install -q "torch==2.13.0"
	# The simulator, its tests and the runtime extra (torch, already satisfied by the pin above).
	$(BIN)/pip install -q -e ".[dev,runtime]"
	touch $(STAMP)

# Byte-code for the sources, written once per change: where PYTHONDONTWRITEBYTECODE is set (as on the
# development machine), Python would otherwise recompile every zsim module on every run (~0.1-0.3 s).
$(PYC): $(STAMP) $(SOURCES)
	@$(BIN)/python -m compileall -q zsim runtime > /dev/null
	@touch $(PYC)

run: $(PYC)
	$(BIN)/zsim run $(SCENARIO)

test: $(PYC)
	$(BIN)/python -m pytest -n 2 -m "not serial" tests

# The held-out replay validation (issue 10): records real runtime runs on this machine, calibrates on
# some and replays the others; it needs the cores to itself, so it is not part of `make test` (CI):
# its step-time errors were 12-19% (median) on a loaded machine, against the 10% criterion.
validate-replay: $(PYC)
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

# The same script on this CPU with tiny shapes (what tests/runtime/test_device_check.py runs)
device-check-dry: $(PYC)
	$(BIN)/python -m zsim.runtime.device_check --dry-run -o out/device-check-dry $(if $(GEMM_SHAPES),--gemm-shapes $(GEMM_SHAPES))

clean:
	rm -rf $(VENV) out
