# Two commands a newcomer needs: `make demo` and `make test`. Both set everything up first.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: setup demo test test-fast golden fixtures proto fuzz bench clean

setup: $(STAMP) .cache/e2e/.debian

# Debian packages (libvirt, QEMU, pciutils, ...) and the guest kernel for the e2e tier.
.cache/e2e/.debian: scripts/setup-debian.sh
	bash scripts/setup-debian.sh
	mkdir -p .cache/e2e && touch $@

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $@

demo: setup
	$(BIN)/pcitopo topo --sysfs fixtures/hgx-b200
	$(BIN)/xmlfix --explain --sysfs fixtures/hgx-b200 fixtures/hgx-b200/domain.xml

test: setup
	$(BIN)/python -m pytest

test-fast: setup
	$(BIN)/python -m pytest -m 'not e2e'

# Opt-in: the slow e2e boots (OVMF under TCG, several minutes; see tests/e2e/README.md).
test-slow: setup
	$(BIN)/python -m pytest tests/e2e -m e2e_slow -v

fixtures: setup
	$(BIN)/python fixtures/generate.py

# Regenerate golden domains (inputs and expected outputs) and topo.json; review the diff.
golden: setup
	$(BIN)/python fixtures/golden.py

# At least 10,000 generated examples through every property (prints the count; CI runs fewer).
fuzz: setup
	HYPOTHESIS_PROFILE=fuzz $(BIN)/python -m pytest tests/test_properties.py -p no:cacheprovider

# Issue 7's performance table (about a minute on 2 cores); rewrites bench/RESULTS.md.
bench: setup
	$(BIN)/python bench/perf.py --results bench/RESULTS.md

# Regenerate the gRPC code from proto/ (committed; a test proves it matches).
proto: setup
	$(BIN)/python proto/generate.py

clean:
	rm -rf $(VENV) .cache .pytest_cache .hypothesis build *.egg-info
