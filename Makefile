# Quick start targets. Each creates .venv on first use and installs torch first (the CPU wheel,
# torch==2.13.0), so pip never pulls a multi-GB CUDA build through the torch>=2.13 range.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: demo test test-gpu test-torch torch-venv torch-venv-newest test-torch-newest lint docs bench conformance clean

# torch comes through pip (it honours the machine's pip configuration, where the CPU wheel
# lies); everything else through uv (in the venv, from PyPI: about 20 s where pip took 160 s),
# with torch held at the installed release.
UV_INSTALL = $(BIN)/uv pip install -q --compile-bytecode --python $(BIN)/python -c $(VENV)/torch-constraint.txt

$(BIN)/.base: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q torch==2.13.0 uv
	echo torch==2.13.0 > $(VENV)/torch-constraint.txt
	$(UV_INSTALL) -e '.[lab]'
	touch $@

# The JupyterLab extension: an editable install builds it with node (extension/, into
# ddpviz/labextension) and copies it into the venv, so reinstall when its sources change.
EXTENSION := $(wildcard extension/package.json extension/yarn.lock extension/src/*.ts \
	extension/build-widget.js \
	extension/style/* extension/schema/*.json ddpviz/templates/*.ipynb)

# The frameworks extra (tests/frameworks) depends on torch: the constraint keeps the CPU wheel
# installed above, so uv never replaces it with a CUDA build. The docs extra builds the site.
$(BIN)/.test: $(BIN)/.base pyproject.toml $(EXTENSION)
	$(UV_INSTALL) --reinstall-package ddpviz -e '.[lab,test,frameworks,docs]'
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

# The linters and the docs build run beside pytest (the atlas's ranks mostly wait on timeouts),
# each into out/NAME.log with its exit status in out/NAME.status; `make test` fails when any of
# the three does, and prints the two logs at the end. The tests that read the built site
# (tests/browser/test_docs_site.py, the atlas's examples) wait for out/docs.status
# (DDPVIZ_DOCS_STATUS) and run last in their unit (tests/conftest.py: marker docs_build).
# Two pytest-xdist workers: a test file (a directory, for tests/browser) is
# one worker's whole (tests/conftest.py); half the suite's time is ranks waiting on each other
# and on timeouts, so two workers keep both cores busy.
test: $(BIN)/.test $(CHROMIUM)
	@mkdir -p out && rm -f out/lint.status out/docs.status
	@{ $(MAKE) --no-print-directory lint > out/lint.log 2>&1; echo $$? > out/lint.status; } & \
	{ $(MAKE) --no-print-directory docs > out/docs.log 2>&1; echo $$? > out/docs.status; } & \
	status=0; DDPVIZ_DOCS_STATUS=$(CURDIR)/out/docs.status $(BIN)/python -m pytest -n 2 --junitxml=out/junit.xml || status=$$?; \
	wait; \
	for s in lint docs; do \
	  echo "--- make $$s (out/$$s.log):"; cat out/$$s.log; \
	  if [ "$$(cat out/$$s.status 2>/dev/null)" != 0 ]; then \
	    echo "make test: \`make $$s\` failed (out/$$s.log, above)"; status=1; fi; \
	done; \
	exit $$status

# On a machine with CUDA GPUs: NCCL with as many ranks as GPUs (tests/gpu, marker gpu). Where
# torch sees no GPU every test there is skipped, saying so. Install a CUDA build of torch into
# the venv first (the Quick start installs the CPU one).
test-gpu: $(BIN)/.test
	$(BIN)/python -m pytest tests/gpu -m gpu -rs

# Another torch release beside the CI's 2.13 (issue: the torch users have): `make test-torch
# V=2.15.0` makes .venv-torch-2.15.0, installs that torch through uv from PyPI (Linux wheels of
# 2.14/2.15 are CUDA builds: 5.2 GB with their nvidia-* packages, about 50 s) and ddpviz, then
# runs what depends on torch's DDP: the twin and watch() against torch (tests/dist,
# tests/watch, tests/engine), `ddpviz record` jobs (tests/record), the bucket planner's
# cross-checks (tests/test_plan.py) and the conformance subset (tests/conformance), each
# version-specific test skipped with its reason where the installed torch lacks it.
# TORCH_TESTS=... narrows it. CI (.ci/run) runs TORCH_CI_TESTS on TORCH_NEWEST beside `make
# test`: 2.15's new DDP arguments and methods against torch's, bitwise (tests/dist), watch()'s
# transparency, `ddpviz record` on them, and the planner's cross-checks; of the cases that
# compare DDP arguments, only those using what 2.13 lacks (DDPVIZ_TEST_NEWER_ONLY=1,
# tests/dist/torch_release.py: the main suite runs the rest on 2.13; the full set by hand:
# docs/guide/torch-versions.md). `make torch-venv` only installs (CI: beside the lint and docs),
# without the build hooks: an editable install always runs the extension's `jlpm build:prod`
# (skip-if-exists counts for wheels only), whose `clean` deleted ddpviz/widgets/static/ under
# the main suite's running tests (stop 55's local CI); these tests use no front end.
TORCH_TESTS ?= tests/dist tests/watch tests/engine tests/record tests/test_plan.py \
	tests/conformance tests/test_torch_support.py
TORCH_NEWEST := 2.15.0
TORCH_CI_TESTS := tests/dist/test_torch_version_arguments.py tests/test_plan.py \
	tests/test_torch_support.py tests/dist/test_watch_transparency.py \
	tests/record/test_record.py::test_the_guard_steps_aside_for_lazy_buckets_as_views_and_the_job_ends_as_unwatched
TORCH_WORKERS ?= 3
TORCH_VENV = .venv-torch-$(V)
torch-venv: $(BIN)/.base
	@test -n "$(V)" || { echo "usage: make test-torch V=2.15.0 (the torch release to test)"; exit 2; }
	test -x $(TORCH_VENV)/bin/python || $(PY) -m venv $(TORCH_VENV)
	echo torch==$(V) > $(TORCH_VENV)/torch-constraint.txt
	HATCH_BUILD_NO_HOOKS=true $(BIN)/uv pip install -q --python $(TORCH_VENV)/bin/python \
		-c $(TORCH_VENV)/torch-constraint.txt "torch==$(V)" -e '.[lab,test]'
	$(TORCH_VENV)/bin/python -c "import torch; print('torch', torch.__version__)"

test-torch: torch-venv
	$(TORCH_VENV)/bin/python -m pytest -n $(TORCH_WORKERS) -rfEs -p no:cacheprovider $(TORCH_TESTS)

# CI's run on the newest release (.ci/run installs its venv first, beside `make test`)
torch-venv-newest:
	$(MAKE) --no-print-directory torch-venv V=$(TORCH_NEWEST)

test-torch-newest:
	DDPVIZ_TEST_NEWER_ONLY=1 $(MAKE) --no-print-directory test-torch V=$(TORCH_NEWEST) \
		TORCH_WORKERS=2 TORCH_TESTS="$(TORCH_CI_TESTS)"

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
