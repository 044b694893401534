# recurnmt: `make demo` sets everything up and runs the NMT demo; `make test` runs the tests.
# Both build the environment in .venv first when it is missing or out of date.

PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.recurnmt-installed
# the exact versions of the demo and CI environment (setup.cfg holds the ranges users get)
LOCK := requirements/lock.txt
# uv's pip interface when uv is on PATH or installable into the environment, else pip;
# INSTALLER=pip uses pip alone
INSTALLER ?= auto

.PHONY: setup demo test test-fast test-e2e lint format benchmark gpu-check gpu-wheels compat lock \
	argos-env clean

setup: $(STAMP)

# scripts/setup_env.py: torch, numpy and the build tools first (fairseq-fixed compiles its C
# extensions against them), then fairseq-fixed and recurnmt[dev,vision,deploy], all at the lock's versions
$(STAMP): setup.cfg pyproject.toml Makefile $(LOCK) scripts/setup_env.py
	@command -v $(PYTHON) >/dev/null || { echo "error: $(PYTHON) not found: the locked \
	environment is made with Python 3.11 (PYTHON=... names another interpreter; \
	make compat PY=... builds one for Python 3.12 or 3.13)"; exit 1; }
	$(PYTHON) scripts/setup_env.py --python $(PYTHON) --venv $(VENV) --lock $(LOCK) \
		--installer $(INSTALLER)
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python scripts/demo_nmt.py

# the tests run on every CPU (pytest-xdist), at most 8 workers (each holds torch and fairseq);
# one CPU runs them in this process. TEST_WORKERS=0 runs them in one process anywhere.
TEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 1); [ $$n -gt 8 ] && n=8; \
	[ $$n -lt 2 ] && n=0; echo $$n)
PYTEST := $(BIN)/python -m pytest -n $(TEST_WORKERS) --dist worksteal

test: $(STAMP)
	$(BIN)/ruff check .
	$(PYTEST)

test-fast: $(STAMP)
	$(PYTEST) -m "not e2e"

test-e2e: $(STAMP)
	$(PYTEST) -m e2e

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

benchmark: $(STAMP)
	$(BIN)/python scripts/benchmark_nmt.py

# gpu-check: on a CUDA machine, within BUDGET seconds (default 480, installation included):
# .venv-gpu on the CUDA torch already installed (python3's, or PYTHON=... given here), the rest
# from the index or from WHEELS=dir alone; then generation of every family (decode), the
# real fairseq-train/-generate, the NMT benchmark, pytest -m cuda and the vision benchmark,
# reported in docs/gpu_check.md (GPU_REPORT=...) after every step, every command's output in
# its .log.
GPU_PYTHON := $(if $(filter command line environment,$(origin PYTHON)),$(PYTHON),python3)
GPU_REPORT ?= docs/gpu_check.md

gpu-check:
	$(GPU_PYTHON) -m scripts.gpu_check --python $(GPU_PYTHON) --out $(GPU_REPORT) \
		$(if $(WHEELS),--wheels $(WHEELS)) $(if $(BUDGET),--budget $(BUDGET)) $(GPU_CHECK_FLAGS)

# gpu-wheels: here, with a package index, the wheels a GPU machine without one needs
# (requirements/lock.txt but the image's torch family) for its Python: make gpu-check WHEELS=
# IMAGE=scripts/gpu_check/images/NAME.txt: only what that image lacks
PYVER ?= 3.12
gpu-wheels:
	$(GPU_PYTHON) scripts/gpu_wheels.py --python-version $(PYVER) --out $(or $(WHEELS),wheels) \
		$(if $(IMAGE),--image $(IMAGE))

# compat: a second environment (.venv-compat/NAME) with another Python and torch inside
# setup.cfg's ranges, and the smoke subset of the tests there; the result goes to docs/compat/.
#   make compat PY=python3.12 TORCH=2.11.0   |   make compat PY=python3.12 LOWEST=1
#   make compat PY=python3.11 LOCKED=1 (the lock's versions) | INSTALLER=pip (pip alone)
PY ?= python3.12
compat:
	$(PY) scripts/compat.py --python $(PY) $(if $(TORCH),--torch $(TORCH)) \
		$(if $(LOWEST),--lowest) $(if $(LOCKED),--lock $(LOCK)) --installer $(INSTALLER)

# argos-env: .venv-argos, Argos Translate 1.11 on top of .venv (requirements/argos.txt says
# which packages and why; docs/deploy.md); the Argos end-to-end test builds it when missing
argos-env: $(STAMP)
	$(BIN)/python scripts/argos_env.py --venv .venv-argos

# lock: the newest versions in setup.cfg's ranges, resolved in a new .venv-lock, written to the lock
lock:
	rm -rf .venv-lock
	$(PYTHON) scripts/setup_env.py --python $(PYTHON) --venv .venv-lock --installer $(INSTALLER) \
		--write-lock $(LOCK)

clean:
	rm -rf $(VENV) .venv-gpu .venv-compat .venv-lock .venv-argos data-bin checkpoints work
