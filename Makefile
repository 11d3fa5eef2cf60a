# `make test` and `make demo` do all the set-up: a local .venv with .[cpu,test] installed.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
STAMP := $(VENV)/.installed-stamp
PY := $(VENV)/bin/python

.PHONY: test test-slow demo bench clean

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

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache
