# One command sets everything up and runs the tests (`make test`); one runs the demo
# (`make demo`). Only Python 3.11+ and make are needed: the venv is created here.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-dev

.PHONY: install test lint typecheck docs pytest test-other-driver demo clean screenshots

include bench/Makefile.inc

$(STAMP): setup.cfg pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q -e '.[dev,embedded,web]'
	touch $@

install: $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check .

typecheck: $(STAMP)
	$(BIN)/mypy

# the documentation site, warnings as errors (broken links, missing pages or snippets,
# docstrings mkdocstrings cannot render); the site goes to site/ (no --quiet: it hides
# the warnings that --strict counts)
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

# The suite runs on one psycopg driver (POSTJOB_TEST_DRIVER: psycopg, i.e. psycopg 3, by
# default, or psycopg2); the modules that reach the database through every path (enqueue,
# checkout, worker, workflows, transactional jobs, edges, CLI) are marked both_drivers
# (pytestmark) and run again on the other.
POSTJOB_TEST_DRIVER ?= psycopg
OTHER_DRIVER := $(if $(filter psycopg2,$(POSTJOB_TEST_DRIVER)),psycopg,psycopg2)

# pytest-xdist: test modules are shared out to worker processes, each module whole to one
# (--dist loadfile: its database, cloned from the template, stays its own). Most tests wait on
# the database or on worker processes, so twice as many processes as cores, at most 8;
# PYTEST_WORKERS=0 runs in one process.
PYTEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 2); n=$$((n * 2)); echo $$((n > 8 ? 8 : n)))
XDIST := $(if $(filter 0,$(PYTEST_WORKERS)),,-n $(PYTEST_WORKERS) --dist loadfile)

pytest: $(STAMP)
	POSTJOB_TEST_DRIVER=$(POSTJOB_TEST_DRIVER) $(BIN)/pytest $(XDIST) $(PYTEST_ARGS)

test-other-driver: $(STAMP)
	POSTJOB_TEST_DRIVER=$(OTHER_DRIVER) $(BIN)/pytest $(XDIST) $(PYTEST_ARGS) -m both_drivers

test: lint typecheck docs pytest test-other-driver

# the dashboard's screenshots in docs/img/ (headless Chromium on a scratch database)
screenshots: $(STAMP)
	$(BIN)/python -m tests.screenshots

demo: $(STAMP)
	$(BIN)/postjob demo

clean:
	rm -rf $(VENV) build site *.egg-info .mypy_cache .ruff_cache .pytest_cache
