# `make train` and `make test` each create .venv on first use.
PYTHON ?= python3.11
VENV := .venv
STAMP := $(VENV)/.tff_kd-installed
DEV_STAMP := $(VENV)/.tff_kd-dev-installed
ARGS ?=

.PHONY: train test test-fast check-fresh clean-venv

$(STAMP): requirements.txt setup.py
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --no-deps -r requirements.txt
	$(VENV)/bin/pip install --quiet --no-deps -e .
	touch $(STAMP)

# Quick start: FedAvg against FedGen (data-free distillation) on scikit-learn's
# bundled digits, then both curves in one PNG and a two-line comparison.
QUICKSTART := runs/quickstart
train: $(STAMP)
	$(VENV)/bin/train --config=configs/digits.py --method=fedavg --root_dir=$(QUICKSTART)/fedavg --noplot $(ARGS)
	$(VENV)/bin/train --config=configs/digits.py --method=fedgen --root_dir=$(QUICKSTART)/fedgen --noplot $(ARGS)
	$(VENV)/bin/plot --runs=$(QUICKSTART)/fedavg,$(QUICKSTART)/fedgen --out=$(QUICKSTART)/curves.png --title="FedAvg vs FedGen on digits" --compare

# Test-only packages (the notebook test's Jupyter kernel), --no-deps too.
$(DEV_STAMP): $(STAMP) requirements-dev.txt
	$(VENV)/bin/pip install --quiet --no-deps -r requirements-dev.txt
	touch $(DEV_STAMP)

# Two pytest workers (pytest-xdist), each test file on one of them: the
# suite's end-to-end runs are mostly single-threaded Python and tracing.
TEST_WORKERS ?= 2
test: $(DEV_STAMP)
	$(VENV)/bin/python -m pytest tests -q -n $(TEST_WORKERS) --dist loadfile --durations=25 $(ARGS)

# The suite without the end-to-end runs marked slow (a few minutes).
test-fast: $(DEV_STAMP)
	$(VENV)/bin/python -m pytest tests -q -m "not slow" $(ARGS)

# Both commands above in a fresh clone of HEAD, with HOME and every cache
# empty (.ci/check_fresh); ONLY=train or ONLY=test runs one of them.
check-fresh:
	ONLY="$(ONLY)" .ci/check_fresh

clean-venv:
	rm -rf $(VENV)
