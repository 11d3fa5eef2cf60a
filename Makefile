# `make test` and `make demo` do all the set-up: a local .venv with .[cpu,test] installed.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
STAMP := $(VENV)/.installed-stamp
PY := $(VENV)/bin/python

.PHONY: test test-slow demo bench bench-paper clean

$(STAMP): setup.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[cpu,test]'
	touch $(STAMP)

test: $(STAMP)
	$(PY) -m pytest tests

test-slow: $(STAMP)
	$(PY) -m pytest tests -m slow

demo: $(STAMP)
	$(PY) examples/demo.py

# The benchmarks: tables printed and written to bench/out/search.md and bench/out/partition.md
# (the runs README quotes are kept in bench/results/). partition.py's k=8 rows need about 10 GB
# of memory; `make bench BENCH_ARGS=--quick` runs the smaller sweep of both scripts.
BENCH_ARGS ?=

bench: $(STAMP)
	$(PY) bench/search.py $(BENCH_ARGS)
	$(PY) bench/partition.py $(BENCH_ARGS)

# The simulated paper evaluation (about 10 minutes): bench/out/paper.md and two plots.
bench-paper: $(STAMP)
	$(PY) -m pip install --quiet -e '.[cpu,test,bench]'
	$(PY) bench/paper.py $(BENCH_ARGS)

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache
