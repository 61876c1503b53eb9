# The two commands of the README: `make run` (the pipeline on the embedded default) and `make test`.
# Both create .venv and install the locked dependencies on first use.
VENV    ?= .venv
PYTHON  ?= python3
PROFILE ?= demo
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed

.PHONY: install run test bench repro clean-outputs

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# constraints.txt pins torch==2.13.0: on CPU machines the local CPU build, never a CUDA wheel.
	$(BIN)/pip install -q -c constraints.txt -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

run: install
	$(BIN)/lopd run --profile $(PROFILE)

test: install
	$(BIN)/pytest

bench: install
	$(BIN)/python benchmarks/rollout.py

repro: install
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/dvc repro

clean-outputs:
	rm -rf models data metrics/*.json
