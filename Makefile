# `make test` and `make demo` work on a fresh machine: they install what they need.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: test check demo lint typecheck system-deps venv clean protos image

# Every shell program in the repository: a tracked file whose first line runs sh or bash.
SHELL_PROGRAMS = $(shell git ls-files -z | xargs -0 awk 'FNR == 1 && /^\#!.*[\/ ](ba|da)?sh( |$$)/ { print FILENAME } { nextfile }')

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -c constraints.txt -e '.[test]' --config-settings editable_mode=compat
	touch $@

venv: $(STAMP)

system-deps:
	scripts/install-system-deps

# ruff, the layers (scripts/layers.py), shellcheck. Without shellcheck (make system-deps as
# root installs it) the shell programs go unchecked, which fails CI (GPUWIRE_NO_SKIP).
lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m scripts.layers
	@if command -v shellcheck >/dev/null; then shellcheck $(SHELL_PROGRAMS); \
	else echo "shellcheck not installed: $(SHELL_PROGRAMS) not checked" >&2; \
	test -z "$$GPUWIRE_NO_SKIP"; fi

typecheck: venv
	$(BIN)/mypy

# The fast loop: lint, types, and every test but the system ones (tests/system: real
# containers and daemons), in about two minutes.
check: lint typecheck
	$(BIN)/pytest -q -m "not system"

# Everything, as CI runs it (the system tests run the image).
test: system-deps lint typecheck image
	$(BIN)/pytest

# The one image (Containerfile), built here and saved as .cache/image/gpuwire-<version>.tar
# for the testbed's containerd and podman (scripts/image.py); nothing to do on an unchanged tree.
image: system-deps venv
	$(BIN)/python -m scripts.image

# Stubs of deviceplugin/api/*.proto and testbed/cri/*.proto, with the grpcio-tools pinned
# in constraints.txt.
protos: venv
	$(BIN)/python -m deviceplugin.api.generate
	$(BIN)/python -m testbed.cri.generate

demo: system-deps venv
	$(BIN)/python -m scripts.demo

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis
