"""The README's first block names the two commands a newcomer runs; the second, `make test`,
says there what it costs: what it installs as root, and how long the whole suite takes. The
README states that duration once, with the measured run it comes from. Every link and path the
README gives resolves, and its map of the docs names every doc."""

from __future__ import annotations

import re

from testkit import REPO

README = (REPO / "README.md").read_text()
MAKEFILE = (REPO / "Makefile").read_text()
CI_RUN = (REPO / ".ci" / "run").read_text()


def first_block() -> str:
    return README.split("```sh\n", 1)[1].split("```", 1)[0]


def test_the_readmes_make_test_line_says_it_installs_as_root_and_how_long_it_takes():
    block = first_block()
    commands = [line.split()[:2] for line in block.splitlines() if line.startswith("make ")]
    assert commands == [["make", "demo"], ["make", "test"]]
    said = " ".join(block.split("make test", 1)[1].split())
    assert "as root" in said and "Debian packages" in said and "guest kernel" in said and "Debian 13 root" in said
    assert re.search(r"about \d+ minutes on 2 cores", said), said


def test_the_suite_duration_is_stated_once_and_agrees_with_the_measured_run():
    text = " ".join(README.split())
    stated = re.findall(r"about (\d+) minutes on 2 cores", text)
    assert len(stated) == 1, stated
    assert len(re.findall(r"\d+ min \d+ s", text)) == 1, "one measured run of the suite"
    measured = re.search(r"The suite's (\d+) minutes: .*? took (\d+) min (\d+) s", text)
    assert measured and measured.group(1) == stated[0], "the duration names the run it comes from"
    minutes = int(measured.group(2)) + int(measured.group(3)) / 60
    assert abs(minutes - int(stated[0])) <= 3, (minutes, stated)


def test_ci_runs_the_readmes_test_command():
    assert re.search(r"^make test$", CI_RUN, re.M), CI_RUN


def test_what_the_readme_says_make_test_installs_is_what_its_target_sets_up():
    assert re.search(r"^test: setup$", MAKEFILE, re.M)
    setup = re.search(r"^setup: (.*)$", MAKEFILE, re.M).group(1).split()
    assert {"setup-base", ".cache/e2e/.kernel", ".cache/trixie/stamp"} <= set(setup)  # packages, kernel, root
    assert re.search(r"^test-fast: setup-base$", MAKEFILE, re.M)  # no kernel, no root
    assert "'not e2e and not image'" in MAKEFILE.split("test-fast:", 1)[1].split("\n\n", 1)[0]  # no boots


def test_the_slow_tier_the_readme_names_is_opt_in_as_it_says():
    assert "`make test-slow`: opt-in, not part of `make test`" in " ".join(README.split())
    slow = MAKEFILE.split("\ntest-slow:", 1)[1].split("\n\n", 1)[0]
    assert "PCITOPO_E2E_SLOW=1" in slow and "e2e_slow or image_slow" in slow
    assert "PCITOPO_E2E_SLOW" not in MAKEFILE.split("\ntest:", 1)[1].split("\n\n", 1)[0]


def test_every_make_target_the_readme_names_exists():
    named = set(re.findall(r"`make ([a-z][\w-]*)", README))
    targets = set(re.findall(r"^([a-z][\w-]*):", MAKEFILE, re.M))
    assert {"demo", "test", "test-fast", "test-slow", "cli-doc"} <= named
    assert named <= targets, named - targets


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but - and _ dropped, spaces to -."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.M | re.S)  # no headings in code
    return {slug(m.group(1)) for m in re.finditer(r"^#+ (.+)$", text, re.M)}


def test_the_anchor_rule_is_githubs():
    assert slug("1. Capture the node's PCI tree") == "1-capture-the-nodes-pci-tree"
    assert slug("`xmlfix`: rewrite a captured domain") == "xmlfix-rewrite-a-captured-domain"


def test_every_link_and_path_in_the_readme_and_the_cli_reference_resolves():
    broken = []
    for doc in (REPO / "README.md", REPO / "docs" / "CLI.md"):
        text = doc.read_text()
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if target.startswith("http"):
                continue
            path, _, anchor = target.partition("#")
            dest = (doc.parent / path).resolve() if path else doc
            if not dest.exists():
                broken.append(f"{doc.name}: {target}: no such file")
            elif anchor and anchor not in anchors(dest):
                broken.append(f"{doc.name}: {target}: no such heading")
        for path in re.findall(r"`((?:docs|deploy|scripts|tests|fixtures|bench|src)/[\w./-]*[\w/])`", text):
            if "<" not in path and not (REPO / path).exists():
                broken.append(f"{doc.name}: `{path}`: no such path")
    assert broken == []


def test_the_readmes_map_names_every_doc():
    mapped = set(re.findall(r"^- \[[^]]+\]\((docs/[A-Z]+\.md)\): ", README, re.M))
    docs = {f"docs/{p.name}" for p in (REPO / "docs").glob("*.md")}
    assert mapped == docs, (docs - mapped, mapped - docs)
