"""The README's first block names the two commands a newcomer runs; the second, `make test`,
says there what it costs: what it installs as root, and how long the whole suite takes."""

from __future__ import annotations

import re

from testkit import REPO

README = (REPO / "README.md").read_text()
MAKEFILE = (REPO / "Makefile").read_text()


def first_block() -> str:
    return README.split("```sh\n", 1)[1].split("```", 1)[0]


def test_the_readmes_make_test_line_says_it_installs_as_root_and_takes_about_30_minutes():
    block = first_block()
    commands = [line.split()[:2] for line in block.splitlines() if line.startswith("make ")]
    assert commands == [["make", "demo"], ["make", "test"]]
    said = " ".join(block.split("make test", 1)[1].split())
    assert "as root" in said and "Debian packages" in said and "guest kernel" in said and "Debian 13 root" in said
    assert re.search(r"about 30 minutes on 2 cores", said), said


def test_what_the_readme_says_make_test_installs_is_what_its_target_sets_up():
    assert re.search(r"^test: setup$", MAKEFILE, re.M)
    setup = re.search(r"^setup: (.*)$", MAKEFILE, re.M).group(1).split()
    assert {"setup-base", ".cache/e2e/.kernel", ".cache/trixie/stamp"} <= set(setup)  # packages, kernel, root
    assert re.search(r"^test-fast: setup-base$", MAKEFILE, re.M)  # no kernel, no root
    assert "'not e2e and not image'" in MAKEFILE.split("test-fast:", 1)[1].split("\n\n", 1)[0]  # no boots
