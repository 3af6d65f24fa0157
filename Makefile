# `make test` and `make demo` work on a fresh machine: they install what they need.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: test demo lint typecheck unit system-deps venv clean protos

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -c constraints.txt -e '.[test]' --config-settings editable_mode=compat
	touch $@

venv: $(STAMP)

system-deps:
	scripts/install-system-deps

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: venv
	$(BIN)/mypy

unit: venv
	$(BIN)/pytest

test: system-deps lint typecheck unit

# Stubs of deviceplugin/api/*.proto and testbed/cri/*.proto, with the grpcio-tools pinned
# in constraints.txt.
protos: venv
	$(BIN)/python -m deviceplugin.api.generate
	$(BIN)/python -m testbed.cri.generate

demo: system-deps venv
	$(BIN)/python -m scripts.demo

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis
