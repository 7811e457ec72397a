# Set-up commands for a fresh machine with Python >= 3.11 and a C compiler:
#   make demo   creates .venv, installs kiln, runs the main job on a bundled example model
#   make test   creates .venv with the dev extras (torch 2.13 CPU as the test oracle), runs the suite
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=

.PHONY: demo test lint bench fuzz clean

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

$(VENV)/.installed: pyproject.toml | $(VENV)/bin/python
	$(PY) -m pip install -q -e .
	touch $@

$(VENV)/.installed-dev: pyproject.toml | $(VENV)/bin/python
	$(PY) -m pip install -q -e ".[dev]"
	touch $@ $(VENV)/.installed

demo: $(VENV)/.installed
	$(PY) examples/demo.py

# The AVX2 machines' code paths on any x86-64 CPU that runs AVX2: kiln's C code built for AVX2, and torch (the
# oracle) on its AVX2 kernels (ATen's dispatch and oneDNN), as on an AMD EPYC without AVX-512.
AVX2_ENV := KILN_CPU_CAPABILITY=AVX2 ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2

# Runs the whole suite, `slow`-marked tests included (CI runs everything), at this CPU's native level; then, where
# the CPU has AVX-512 (so its native level is not AVX2), again at AVX2 the non-slow tests whose C code depends on the
# capability: the first pass records them in $(CAPABILITY_TESTS) (tests/conftest.py). The slow ones are
# whole-model sweeps and sanitizer builds, which the first pass covers. On an AVX2-only CPU the first pass is the
# AVX2 run. PYTEST_ARGS='-m "not slow"' skips the slow tests in the first pass too.
CAPABILITY_TESTS := $(CURDIR)/.pytest-capability-tests
test: $(VENV)/.installed-dev
	$(VENV)/bin/ruff check kiln tests benchmarks examples
	rm -rf $(CAPABILITY_TESTS)
	KILN_RECORD_CAPABILITY_TESTS=$(CAPABILITY_TESTS) $(PY) -m pytest -n auto $(PYTEST_ARGS)
	if grep -qw avx512f /proc/cpuinfo 2>/dev/null; then \
		$(AVX2_ENV) KILN_CAPABILITY_TESTS=$(CAPABILITY_TESTS) $(PY) -m pytest -n auto -m "not slow"; fi

lint: $(VENV)/.installed-dev
	$(VENV)/bin/ruff check kiln tests benchmarks examples

bench: $(VENV)/.installed-dev
	$(PY) benchmarks/build_verify_10k.py
	$(PY) benchmarks/export_gpt2.py
	$(PY) benchmarks/c_backend.py

# Differential fuzzing (tests/fuzz): random programs through the interpreter, ONNX, C at every capability this CPU
# runs, Triton's interpreter, the .pt2 round trip and torch eager; prints programs, ops covered, mismatches and
# crashes per backend, and each failure shrunk by hypothesis as a test for tests/regressions/.
# FUZZ_ARGS='--programs 500 --seed 3' for a shorter or another run.
FUZZ_ARGS ?= --programs 10000 --seed 0
fuzz: $(VENV)/.installed-dev
	$(PY) -m tests.fuzz $(FUZZ_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
