# `make train` and `make test` each create .venv on first use.
PYTHON ?= python3.11
VENV := .venv
STAMP := $(VENV)/.tff_kd-installed
ARGS ?=

.PHONY: train test test-fast clean-venv

$(STAMP): requirements.txt setup.py
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --no-deps -r requirements.txt
	$(VENV)/bin/pip install --quiet --no-deps -e .
	touch $(STAMP)

# Quick start: the best available method on scikit-learn's bundled digits.
train: $(STAMP)
	$(VENV)/bin/train --config=configs/digits.py --root_dir=runs/quickstart $(ARGS)

test: $(STAMP)
	$(VENV)/bin/python -m pytest tests -q $(ARGS)

# The suite without the end-to-end runs marked slow (a few minutes).
test-fast: $(STAMP)
	$(VENV)/bin/python -m pytest tests -q -m "not slow" $(ARGS)

clean-venv:
	rm -rf $(VENV)
