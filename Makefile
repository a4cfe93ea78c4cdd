# Quick start targets. Each creates .venv on first use and installs torch first (the CPU wheel,
# torch==2.13.0), so pip never pulls a multi-GB CUDA build through the torch>=2.13 range.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: demo test test-gpu lint docs bench conformance clean

$(BIN)/.base: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e '.[lab]'
	touch $@

# The JupyterLab extension: `pip install -e .` builds it with node (extension/, into
# ddpviz/labextension) and copies it into the venv, so reinstall when its sources change.
EXTENSION := $(wildcard extension/package.json extension/yarn.lock extension/src/*.ts \
	extension/style/* extension/schema/*.json ddpviz/templates/*.ipynb)

# The frameworks extra (tests/frameworks) depends on torch: the constraint keeps the CPU wheel
# installed above, so pip never replaces it with a CUDA build. The docs extra builds the site.
$(BIN)/.test: $(BIN)/.base pyproject.toml $(EXTENSION)
	echo torch==2.13.0 > $(VENV)/torch-constraint.txt
	$(BIN)/python -m pip install -q -c $(VENV)/torch-constraint.txt -e '.[lab,test,frameworks,docs]'
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 >/dev/null
	touch $@

demo: $(BIN)/.base
	$(BIN)/ddpviz demo --out out/demo

# The browser tests drive Debian's Chromium: install it when it is missing (apt, as root).
CHROMIUM := /usr/bin/chromium
$(CHROMIUM):
	apt-get update -qq && apt-get install -y -qq chromium

lint: $(BIN)/.test extension/node_modules
	$(BIN)/ruff check ddpviz tests benchmarks docs ddpviz_autowatch.py
	$(BIN)/mypy
	cd extension && PATH="$(abspath $(BIN)):$$PATH" jlpm lint:check

# the extension's linters (eslint, prettier, stylelint: extension/package.json devDependencies)
extension/node_modules: extension/package.json extension/yarn.lock $(BIN)/.test
	cd extension && PATH="$(abspath $(BIN)):$$PATH" jlpm install
	touch $@

# The documentation site (docs/, Sphinx) into out/docs/html, warnings as errors: a broken link,
# a missing reference, a page outside every toctree or a docstring off the house style fails it.
# The atlas's examples (docs/_generated/atlas) come from real 2-rank gloo runs first.
DOCS_OUT := out/docs/html
docs: $(BIN)/.test
	PYTHONPATH=. $(BIN)/python docs/atlas_examples.py
	$(BIN)/python -m sphinx -b html -E -W --keep-going -q docs $(DOCS_OUT)

# The docs are built first so that CI (.ci/run) covers them (tests/browser/test_docs_site.py).
# The linters and the docs build run side by side (the atlas's ranks mostly wait on timeouts,
# mypy and eslint want one core): -O keeps each one's output together.
# Two pytest-xdist workers: a test file (a directory, for tests/browser and tests/frameworks) is
# one worker's whole (tests/conftest.py); half the suite's time is ranks waiting on each other
# and on timeouts, so two workers keep both cores busy.
test: $(BIN)/.test $(CHROMIUM)
	$(MAKE) --no-print-directory -j2 -Otarget lint docs
	$(BIN)/python -m pytest -n 2

# On a machine with CUDA GPUs: NCCL with as many ranks as GPUs (tests/gpu, marker gpu). Where
# torch sees no GPU every test there is skipped, saying so. Install a CUDA build of torch into
# the venv first (the Quick start installs the CPU one).
test-gpu: $(BIN)/.test
	$(BIN)/python -m pytest tests/gpu -m gpu -rs

bench: $(BIN)/.test
	for f in benchmarks/bench_*.py; do $(BIN)/python $$f || exit 1; done

# torch 2.13's own DDP tests (its wheel's distributed_test.py) with torch's DDP, then with
# ddpviz's swapped in, world sizes 2 and 3, each test in fresh ranks -> out/conformance/table.md.
# Long (about 100 tests x 2 engines x 2 world sizes); CI runs a subset (tests/conformance).
CONFORMANCE_JOBS ?= 2
conformance: $(BIN)/.test
	$(BIN)/python -m tests.conformance.runner --world-sizes 2 3 -j $(CONFORMANCE_JOBS)

clean:
	rm -rf $(VENV)
