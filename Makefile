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

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

$(CHARTS_STAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[dev,charts]'
	touch $(CHARTS_STAMP)

# MNIST on a local multi-process cluster: parameter_server (chief + 2 workers + 1 ps),
# then multi_worker_mirrored (2 workers). Prints the test accuracy of each.
demo: $(CHARTS_STAMP)
	$(BIN)/python -m recipes.mnist.demo

# The in-process unit tests (tests/unit/: no process started, one pytest process): under a minute.
test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -ra tests/unit

# Style and the import contracts first (seconds), then the unit tests, then the rest of the suite
# (the tests that start processes): a formatting, lint or unit failure stops `make test` early.
# Two workers, a whole test file each (--dist loadfile keeps a module's shared cluster or
# checkpoint fixture built once). With one worker a 2-core VM sat 37% idle (vmstat) while
# tests waited on their TF processes (start-up, peers, kills); the second worker fills
# that: 45.8 min -> 32.4 min. --durations lists where the time goes.
TEST_WORKERS ?= 2
test: lint test-fast
	$(BIN)/python -m pytest -q -ra -n $(TEST_WORKERS) --dist loadfile --durations=30 --ignore=tests/unit tests

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
