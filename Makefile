# Every target installs what it needs into .venv itself (idempotent: a stamp
# file is rebuilt only when pyproject.toml changes).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The charts extra (matplotlib) on top: make demo and make bench draw charts, make test does
# not install it (Keras imports matplotlib.pyplot in every TensorFlow process when it is there).
CHARTS_STAMP := $(VENV)/.installed-charts

.PHONY: install demo test test-fast lint format bench clean

install: $(STAMP)

# setuptools' editable build says "Editable installation" in a 9-line block each time (a
# BuildBackendWarning, informational only): the one filter keeps a first `make demo` quiet.
PIP_INSTALL := PYTHONWARNINGS='ignore:Editable installation' $(BIN)/python -m pip install --quiet

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP_INSTALL) --upgrade pip
	$(PIP_INSTALL) -e '.[dev]'
	touch $(STAMP)

$(CHARTS_STAMP): $(STAMP)
	$(PIP_INSTALL) -e '.[dev,charts]'
	touch $(CHARTS_STAMP)

# MNIST on a local multi-process cluster: parameter_server (chief + 2 workers + 1 ps),
# then multi_worker_mirrored (2 workers). Prints the test accuracy of each.
demo: $(CHARTS_STAMP)
	$(BIN)/python -m recipes.mnist.demo

# The in-process unit tests (tests/unit/: no process started beyond pytest's) on two pytest-xdist
# workers, a whole file each (--dist loadfile keeps a module's fixtures built once).
TEST_WORKERS ?= 2
PYTEST := $(BIN)/python -m pytest -q -ra

test-fast: $(STAMP)
	$(PYTEST) -n $(TEST_WORKERS) --dist loadfile tests/unit

# Style and the import contracts first (seconds), then the unit tests, then the rest of the suite
# (the tests that start processes): a formatting, lint or unit failure stops `make test` early.
# The cluster tests run one at a time: each already starts 3-6 TensorFlow processes, and two such
# tests side by side on a 2-core CI machine made the run slower (79 min against 55 serially) and
# starved a chaos job past its deadline. --durations lists where the time goes.
test: lint test-fast
	$(PYTEST) --durations=30 --ignore=tests/unit tests

lint: $(STAMP)
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .
	$(BIN)/lint-imports

# Rewrite the code into the enforced style (and apply ruff's safe fixes).
format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

bench: $(CHARTS_STAMP)
	$(BIN)/python -m benchmarks.run_all

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
