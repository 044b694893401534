# recurnmt: `make demo` sets everything up and runs the NMT demo; `make test` runs the tests.
# Both build the environment in .venv first when it is missing or out of date.

PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.recurnmt-installed

# fairseq-fixed compiles C extensions against the torch/numpy/cython already installed
# (--no-build-isolation), so those come first; setup.cfg pins the rest.
BUILD_DEPS := torch==2.14.1 numpy==2.4.6 cython==3.3.1 setuptools==84.2.1 wheel==0.48.0
FAIRSEQ := fairseq-fixed==0.12.3.1 hydra-core==1.3.2 omegaconf==2.3.0

.PHONY: setup demo test test-fast test-e2e lint format benchmark gpu-check clean

setup: $(STAMP)

# PYTHONWARNINGS: setuptools prints an "Editable installation" notice nobody can act on.
$(STAMP): setup.cfg pyproject.toml Makefile
	@command -v $(PYTHON) >/dev/null || { echo "error: $(PYTHON) not found (need Python 3.11)"; exit 1; }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip==26.3
	$(BIN)/pip install --quiet $(BUILD_DEPS)
	$(BIN)/pip install --quiet --no-build-isolation $(FAIRSEQ)
	PYTHONWARNINGS="ignore:Editable installation" \
		$(BIN)/pip install --quiet --no-build-isolation -e ".[dev,vision]"
	$(BIN)/python -c "import fairseq, recurnmt.nmt" 2>/dev/null
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python scripts/demo_nmt.py

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest

test-fast: $(STAMP)
	$(BIN)/python -m pytest -m "not e2e"

test-e2e: $(STAMP)
	$(BIN)/python -m pytest -m e2e

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

benchmark: $(STAMP)
	$(BIN)/python scripts/benchmark_nmt.py

# gpu-check: on a CUDA machine, .venv-gpu on the CUDA torch already installed (python3's, or
# PYTHON=... given here), the rest from the index or from WHEELS=dir alone; then pytest -m cuda
# and the base-size benchmarks in fp16 and bf16, reported in docs/gpu_check.md (GPU_REPORT=...).
GPU_PYTHON := $(if $(filter command line environment,$(origin PYTHON)),$(PYTHON),python3)
GPU_REPORT ?= docs/gpu_check.md

gpu-check:
	$(GPU_PYTHON) scripts/gpu_check.py --python $(GPU_PYTHON) --out $(GPU_REPORT) \
		$(if $(WHEELS),--wheels $(WHEELS)) $(GPU_CHECK_FLAGS)

clean:
	rm -rf $(VENV) .venv-gpu data-bin checkpoints work
