# `make test` and `make demo` do all the set-up: a local .venv with .[cpu,test] installed.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
STAMP := $(VENV)/.installed-stamp
PY := $(VENV)/bin/python

.PHONY: test test-slow test-horovod demo bench bench-paper clean

# pytest processes (pytest-xdist): CI's machines have 2 cores; `make test TEST_WORKERS=0`
# runs the suite in one process
TEST_WORKERS ?= 2

$(STAMP): setup.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[cpu,test]'
	$(PY) -m pip install --quiet --no-deps 'gluoncv==0.10.5.post0'
	touch $(STAMP)

test: $(STAMP)
	$(PY) -m pytest tests -n $(TEST_WORKERS)

test-slow: $(STAMP)
	$(PY) -m pytest tests -m slow -n $(TEST_WORKERS)

# Horovod, built from source against the installed MXNet (several minutes; needs cmake and a
# C++ compiler), then the distributed tests, which run it where it imports.
HOROVOD_BUILD := HOROVOD_WITH_MXNET=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 \
	HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_PYTORCH=1

test-horovod: $(STAMP)
	$(PY) -c "import horovod.mxnet" 2>/dev/null || { \
		$(PY) -m pip install --quiet setuptools wheel && \
		$(HOROVOD_BUILD) $(PY) -m pip install --quiet --no-build-isolation --no-cache-dir \
			'horovod==0.28.1'; }
	$(PY) -m pytest -rs tests/tofu_mx/gluon/test_distributed.py

demo: $(STAMP)
	$(PY) examples/demo.py

# The benchmarks: tables printed and written to bench/out/search.md, partition.md and
# memory_mxnet.md (the runs README quotes are kept in bench/results/). partition.py's k=8 rows
# need about 10 GB of memory; `make bench BENCH_ARGS=--quick` runs the smaller sweeps.
BENCH_ARGS ?=

bench: $(STAMP)
	$(PY) bench/search.py $(BENCH_ARGS)
	$(PY) bench/partition.py $(BENCH_ARGS)
	$(PY) bench/memory_mxnet.py $(BENCH_ARGS)

# The simulated paper evaluation (about 10 minutes): bench/out/paper.md and two plots.
bench-paper: $(STAMP)
	$(PY) -m pip install --quiet -e '.[cpu,test,bench]'
	$(PY) bench/paper.py $(BENCH_ARGS)

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache
