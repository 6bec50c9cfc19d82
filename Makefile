# make test      CPU suite (creates .venv on first use; torch pinned to the CPU build 2.13.0)
# make run       the default scenario set: on the GPU when torch sees one, else on the CPU simulator
# make gpu-test  GPU tests + a CUDA run + the mutant kill matrix, on a runner that already has
#                torch (no install step)

VENV      ?= .venv
VPY       := $(VENV)/bin/python
REPORTS   ?= reports
# The interpreter of a GPU runner: its own torch, nothing installed.
PYTHON    ?= python3
HAS_TORCH := $(shell $(PYTHON) -c 'import torch' >/dev/null 2>&1 && echo yes)

.PHONY: test run gpu-test clean

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip
	$(VPY) -m pip install -q torch==2.13.0
	$(VPY) -m pip install -q -e '.[dev]'
	touch $@

test: $(VENV)/.installed
	$(VPY) -m pytest -q -m "not gpu" -n 2

ifeq ($(HAS_TORCH),yes)
run:
	PYTHONPATH=. $(PYTHON) -m harness run --device auto --out $(REPORTS)
else
run: $(VENV)/.installed
	$(VPY) -m harness run --device auto --out $(REPORTS)
endif

gpu-test:
	mkdir -p $(REPORTS)
	PYTHONPATH=. $(PYTHON) -m pytest -q -m gpu -p no:cacheprovider --junitxml=$(REPORTS)/junit.xml
	PYTHONPATH=. $(PYTHON) -m harness run --device cuda --out $(REPORTS)
	PYTHONPATH=. $(PYTHON) -m harness mutants --device cuda --out $(REPORTS)/mutants

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
