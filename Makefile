# Two commands: `make demo` and `make test`. Both (re)build .venv when it is missing or older
# than pyproject.toml or requirements.lock. The environment is the lock's exact versions (every
# extra, `[all]`), then this package without dependencies, so CI and `make demo` resolve the same
# versions on any machine. The lock names torch's CPU build (2.13.0+cpu), which uv takes from this
# machine's disk (/opt/wheels) instead of a multi-GB CUDA build; elsewhere it comes from PyTorch's
# CPU wheel index.
# `make lock` re-resolves the lock after a change to pyproject.toml, keeping every version it
# already holds that the ranges still allow.
PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.installed
BIN := $(VENV)/bin
IMPORTS_CHECK := $(CURDIR)/.imports-check

.PHONY: venv demo test lint lint-imports pytest clean lock install-check bench-fashion

LOCK := requirements.lock

# uv, at the lock's own version, installs the lock in about 10 s where pip took about 75. It compiles
# no bytecode (31 s with it): the commands below let Python write it for the modules they import.
WHEELS := $(wildcard /opt/wheels)
UV_INSTALL = $(BIN)/uv pip install --quiet --python $(BIN)/python $(if $(WHEELS),--find-links $(WHEELS))
# Where the environment sets PYTHONDONTWRITEBYTECODE, every process the tests and the demo start
# would compile torch and the rest again (the suite took 13:47 instead of 9:38); empty, it is unset.
WRITE_BYTECODE := PYTHONDONTWRITEBYTECODE=

$(STAMP): pyproject.toml $(LOCK)
	rm -rf $(VENV)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet $$(grep -o '^uv==[^ ]*' $(LOCK))
	$(UV_INSTALL) -r $(LOCK)
	$(UV_INSTALL) --no-deps -e .
	touch $(STAMP)

# uv comes with the environment (Flower depends on it). The lock is for Linux x86-64 and
# Python 3.11; --find-links lets it see the CPU torch wheel on this machine's disk.
lock: $(STAMP)
	$(BIN)/uv pip compile pyproject.toml --extra all --python-version 3.11 \
		--python-platform x86_64-manylinux_2_28 --find-links /opt/wheels \
		--index-strategy unsafe-best-match --annotation-style line \
		--custom-compile-command "make lock" --quiet -o $(LOCK)

# the environment alone: .venv/bin/harmony and the tools, nothing run
venv: $(STAMP)

demo: $(STAMP)
	$(WRITE_BYTECODE) $(BIN)/harmony demo

# The recurring benchmark (benchmarks/configs/fashion.yaml, with its tuning, budget check and
# mechanism study). It reads Debian's dataset-fashion-mnist package, installed here when missing, and
# goes on from the run records committed in its work dir. fashion-variants.yaml was made at an
# earlier budget: its header says how to run it again in a work dir of its own.
FASHION_DIR := /usr/share/datasets/fashion-mnist
SUDO := $(shell [ "$$(id -u)" -eq 0 ] || echo sudo)

bench-fashion: $(STAMP)
	test -d $(FASHION_DIR) || DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y --no-install-recommends dataset-fashion-mnist
	$(WRITE_BYTECODE) $(BIN)/harmony bench --profile fashion --jobs 2 --resume --work-dir benchmarks/results/fashion/work

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(MAKE) lint-imports

# The import contracts (pyproject.toml, [tool.importlinter]) run on an installed copy: export/ and
# server/ become harmony_mobile.export / .server only through the package-dir mapping. The checkout
# comes after it on the path for benchmarks/ (tests/test_import_contracts.py runs the same check).
lint-imports: $(STAMP)
	rm -rf $(IMPORTS_CHECK)
	$(BIN)/pip install --quiet --no-deps --no-build-isolation --no-compile --target $(IMPORTS_CHECK) . 2>&1 | grep -v "^WARNING" || true
	rm -rf build
	cd $(IMPORTS_CHECK) && PYTHONPATH=$(IMPORTS_CHECK):$(CURDIR) $(CURDIR)/$(BIN)/lint-imports $(CURDIR)/pyproject.toml --no-cache

# Three workers on 2 cores: most tests run one torch thread, and the Flower deployment tests spend
# most of their time waiting on SuperNodes' polls and heartbeats, which a third worker fills. A
# file's tests stay on one worker, so module fixtures (a SuperLink, a demo run, a server) are built
# once; files go out in tests/conftest.py's order, not xdist's (docs/DECISIONS.md, "Test suite").
pytest: $(STAMP)
	$(WRITE_BYTECODE) $(BIN)/python -m pytest -q -n 3 --dist loadfile --no-loadscope-reorder

test: lint pytest

clean:
	rm -rf $(VENV) runs .pytest_cache $(IMPORTS_CHECK)
