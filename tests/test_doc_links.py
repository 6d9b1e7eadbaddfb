"""The docs point only at what the checkout has: every relative link resolves (a file that exists,
an anchor that is a heading of that page), every backticked repository path names a file or folder
that exists, every `path` `name` pair in docs/ARCHITECTURE.md's rules names something that file
defines, and every "PAGE.md, "Heading"" reference in the docs and the package names a heading of
that page. So a moved module, a renamed heading or a deleted script cannot stay in a doc."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted({ROOT / "README.md", ROOT / "CHANGELOG.md", ROOT / "tests" / "e2e" / "README.md",
                *(ROOT / "docs").glob("*.md"), *(ROOT / "fixtures").glob("**/README.md")})

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
CODE_SPAN = re.compile(r"`([^`\n]+)`")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
# a path of this checkout (or of a folder the package left: topology/, sidecar/, kubevirt/). Other projects'
# paths that docs/SOURCES.md quotes (NCCL's src/graph/, QEMU's docs/*.txt, KubeVirt's tests/*.go)
# share some first folders, so those folders count only with the kinds of file this checkout keeps.
REPO_PATH = re.compile(r"^(?:(?:src/pcitopo|testkit|bench|fixtures|deploy|proto|topology|sidecar)/[\w./-]*"
                       r"|scripts/[\w./-]+\.(?:sh|py)|tests/[\w/-]+(?:\.py|/)|tests/[\w/-]*README\.md"
                       r"|docs/[\w-]+\.(?:md|svg)|docs/kustomize-pinned/[\w./-]*"
                       r"|kubevirt/(?:launcher|kubelet)/[\w./-]*|kubevirt/\w+\.py)$")
PLACEHOLDER = re.compile(r"[*<>{}…]|\.\.\.|NAME|/$(?<=NAME/)")


def rel(p: Path) -> str:
    return str(p.relative_to(ROOT))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as dashes."""
    text = re.sub(r"`|\*\*", "", heading.strip()).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def headings(page: Path) -> list[str]:
    text = FENCE.sub("", page.read_text())
    return [m.group(1) for m in re.finditer(r"^#{1,6}\s+(.+?)\s*$", text, re.M)]


def titles(page: Path) -> list[str]:
    """What a reference may name: a heading, or the bold lead of a list item or paragraph."""
    text = FENCE.sub("", page.read_text())
    leads = re.findall(r"^(?:- )?\*\*(.+?)\*\*", text, re.M) + re.findall(r"^([A-Z][\w' -]{2,40}):", text, re.M)
    return headings(page) + leads


def links(page: Path) -> list[str]:
    return [m.group(1) for m in LINK.finditer(FENCE.sub("", page.read_text()))]


def test_the_slug_is_githubs():
    assert slug("What `doctor: require` guarantees") == "what-doctor-require-guarantees"
    assert slug("Guest NUMA cells: kubelet's CPU manager") == "guest-numa-cells-kubelets-cpu-manager"
    assert slug("Two doors, one per release") == "two-doors-one-per-release"


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_relative_links_resolve(page):
    broken = []
    for target in links(page):
        if re.match(r"^[a-z]+:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no {path}")
        elif anchor and dest.suffix == ".md" and anchor not in {slug(h) for h in headings(dest)}:
            broken.append(f"{target}: no heading #{anchor} in {rel(dest)}")
    assert broken == [], f"{rel(page)}: {broken}"


def repo_paths(text: str) -> list[str]:
    out = []
    for m in CODE_SPAN.finditer(text):
        for word in m.group(1).split():
            word = word.strip(",;:()'\"").split("::")[0]
            if REPO_PATH.match(word) and not PLACEHOLDER.search(word):
                out.append(word.rstrip("."))
    return out


def test_the_path_finder_sees_old_and_new_paths():
    text = ("`src/pcitopo/guest/plan.py` `sidecar/xmlfix.py`, `make bench` and `bench/perf.py --quick`, `fixtures/<host>/`"
            " `kubevirt/launcher/` `kubevirt/kubevirt` `src/graph/paths.cc` `docs/pcie.txt`")
    assert repo_paths(text) == ["src/pcitopo/guest/plan.py", "sidecar/xmlfix.py", "bench/perf.py", "kubevirt/launcher/"]


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_backticked_repository_paths_exist(page):
    text = page.read_text()
    if page.name == "CHANGELOG.md":  # released entries keep the paths they had; the policy and the
        versions = [m.start() for m in re.finditer(r"^## \d", text, re.M)]  # newest entry are now
        text = text[:versions[1]] if len(versions) > 1 else text
    missing = sorted({p for p in repo_paths(text) if not (ROOT / p).exists()})
    assert missing == [], f"{rel(page)}: {missing}"


# -- docs/ARCHITECTURE.md's rules table: each `path` `name` names something that file defines ----

def rule_pairs(text: str) -> list[tuple[str, str]]:
    """(path, name) for every backticked name after a backticked package path in a table row's
    last cell, up to the next path."""
    pairs = []
    for row in re.findall(r"^\|.*\|\s*$", text, re.M):
        where = row.strip().strip("|").split(" | ")[-1]
        path = None
        for span in CODE_SPAN.findall(where):
            if span.startswith("src/pcitopo/") or span.startswith("tests/"):
                path = span
            elif path and path.endswith(".py") and re.fullmatch(r"[A-Za-z_][\w.]*\*?", span):
                pairs.append((path, span))
    return pairs


def test_the_rule_reader_pairs_names_with_their_file():
    row = "| x | `src/pcitopo/a.py` (`f`, `G.h`), `src/pcitopo/b/` (`c.py`), `src/pcitopo/d.py` `check_*` |"
    assert rule_pairs(row) == [("src/pcitopo/a.py", "f"), ("src/pcitopo/a.py", "G.h"), ("src/pcitopo/d.py", "check_*")]


def test_architecture_rules_name_what_their_files_define():
    wrong = []
    for path, name in rule_pairs((ROOT / "docs" / "ARCHITECTURE.md").read_text()):
        source = (ROOT / path).read_text() if (ROOT / path).is_file() else ""
        for part in name.rstrip("*").split("."):
            if part and not re.search(rf"\b{re.escape(part)}", source):
                wrong.append(f"{path} {name}")
    assert wrong == []


# -- "PAGE.md, "Heading"": the heading exists (a prefix of it, as the references abbreviate) -----

SECTION_REF = re.compile(r"(?<![\w/.-])((?:[\w.-]+/)*[A-Z]+)\.md`?,? \"([^\"]+)\"")


def section_refs(text: str) -> list[tuple[str, str]]:
    text = re.sub(r"\n\s*(?:#|//)\s?", "\n", text)  # a reference wrapped over comment lines
    return [(m.group(1) + ".md", m.group(2)) for m in SECTION_REF.finditer(" ".join(text.split()))]


def test_the_reference_reader_sees_both_spellings():
    text = 'see docs/DEPLOY.md, "Guest NUMA cells" and (SOURCES.md "Deploy"), `docs/VM.md`, "Options"'
    assert section_refs(text) == [("docs/DEPLOY.md", "Guest NUMA cells"), ("SOURCES.md", "Deploy"), ("docs/VM.md", "Options")]
    assert section_refs('fixtures/README.md, "The .topo\n# format"') == [("fixtures/README.md", "The .topo format")]


def _page(name: str) -> Path | None:
    """A bare page name is a page of docs/ (or the top's README.md, CHANGELOG.md)."""
    for p in ((ROOT / name,) if "/" in name else (ROOT / "docs" / name, ROOT / name)):
        if p.is_file():
            return p
    return None


def _sources() -> list[Path]:
    return [p for p in PAGES if p.name != "CHANGELOG.md"] + sorted((ROOT / "src" / "pcitopo").rglob("*.py")) + \
        sorted(p for p in (ROOT / "deploy").rglob("*.yaml"))


def test_section_references_name_a_heading():
    wrong = []
    for src in _sources():
        for page_name, title in section_refs(src.read_text()):
            page = _page(page_name)
            if page is None:
                continue
            want = slug(title.rstrip(".,;"))
            if not any(want in slug(h) for h in titles(page)):  # references may abbreviate
                wrong.append(f"{rel(src)}: {page_name}, \"{title}\"")
    assert wrong == []


# -- `pcitopo.room.module.name`: what the docs call by its import path, the package has ----------

DOTTED = re.compile(r"`(pcitopo(?:\.[A-Za-z_]\w*)+)")


def resolves(name: str) -> bool:
    import importlib

    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def test_the_resolver_tells_a_moved_module():
    assert resolves("pcitopo.guest.rewrite.rewrite_domain") and resolves("pcitopo.SLOTS")
    assert not resolves("pcitopo.sidecar.hooks") and not resolves("pcitopo.guest.predict")


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_import_paths_in_the_docs_resolve(page):
    names = {n for n in DOTTED.findall(page.read_text()) if not n.startswith("pcitopo.kubevirt.io")}
    assert sorted(n for n in names if not resolves(n)) == [], rel(page)
