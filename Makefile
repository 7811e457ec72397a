# Set-up commands for a fresh machine with Python >= 3.11 and a C compiler:
#   make demo   creates .venv, installs kiln, runs the main job on a bundled example model
#   make test   creates .venv with the dev extras (torch 2.13 CPU as the test oracle), runs the suite
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=

.PHONY: demo test lint bench clean

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

# Runs the whole suite, `slow`-marked tests included (CI runs everything); PYTEST_ARGS='-m "not slow"' skips them.
test: $(VENV)/.installed-dev
	$(VENV)/bin/ruff check kiln tests benchmarks examples
	$(PY) -m pytest -n auto $(PYTEST_ARGS)

lint: $(VENV)/.installed-dev
	$(VENV)/bin/ruff check kiln tests benchmarks examples

bench: $(VENV)/.installed-dev
	$(PY) benchmarks/build_verify_10k.py
	$(PY) benchmarks/export_gpt2.py
	$(PY) benchmarks/c_backend.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
