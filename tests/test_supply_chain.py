"""The image's inputs. A small build context (.containerignore), every
dependency pinned with hashes in a lock the Containerfile installs from, and `make demo` without
the e2e guest kernel. (The image pinned by digest through kustomize: tests/test_kustomize.py.)"""

from __future__ import annotations

import os
import re
import subprocess
import tomllib
from importlib import metadata as md
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from testkit import REPO as ROOT

CONTEXT_LIMIT = 2 * 1024 * 1024


# -- .containerignore ---------------------------------------------------------------------------

def _pattern(p: str) -> re.Pattern:
    """A .containerignore/.dockerignore pattern (Go filepath.Match plus `**`) as a regex."""
    p = p.strip().rstrip("/").lstrip("/")
    out, i = "", 0
    while i < len(p):
        if p.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif p.startswith("**", i):
            out, i = out + ".*", i + 2
        elif p[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif p[i] == "?":
            out, i = out + "[^/]", i + 1
        else:
            out, i = out + re.escape(p[i]), i + 1
    return re.compile(out + r"\Z")


def build_context(root: Path) -> dict[str, int]:
    """The files (relative path → size) a container engine sends with this ignore file: the
    last matching rule wins, and a rule matching a directory covers everything below it."""
    rules = []
    for line in (root / ".containerignore").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            rules.append((line.startswith("!"), _pattern(line.lstrip("!"))))
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d != ".git"] if Path(dirpath) == root else dirnames
        for name in filenames:
            path = Path(dirpath, name)
            rel = path.relative_to(root).as_posix()
            parts = rel.split("/")
            prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
            keep = True
            for negated, rx in rules:
                if any(rx.match(p) for p in prefixes):
                    keep = negated
            if keep:
                out[rel] = path.lstat().st_size
    return out


def test_containerignore_keeps_the_build_context_small():
    """No .venv, guest kernel, .cache or build output in the context; everything the
    Containerfile COPYs is in it."""
    assert os.path.realpath(ROOT / ".dockerignore") == str(ROOT / ".containerignore")
    ctx = build_context(ROOT)
    assert sum(ctx.values()) < CONTEXT_LIMIT, sorted(ctx, key=ctx.get)[-5:]
    assert not [p for p in ctx if p.startswith((".venv/", ".cache/", "build/", "tests/", "fixtures/", "bench/", "docs/"))]
    assert not [p for p in ctx if "__pycache__" in p or p.endswith(".pyc")]
    text = (ROOT / "Containerfile").read_text()
    sources = [s for line in re.findall(r"^COPY (?!--from)(.+)$", text, re.M) for s in line.split()[:-1]]
    assert {"pyproject.toml", "requirements.lock", "requirements-build.lock", "src/"} <= set(sources)
    for src in sources:
        path = ROOT / src.rstrip("/")
        files = [f for f in ([path] if path.is_file() else path.rglob("*.py")) if "__pycache__" not in f.parts]
        assert files and all(f.relative_to(ROOT).as_posix() in ctx for f in files), src


# -- the lock files -----------------------------------------------------------------------------

def read_lock(path: Path) -> dict[str, tuple[str, list[str]]]:
    """name → (version, sha256 hashes) of a pip-compile --generate-hashes file."""
    text = re.sub(r"\\\n\s*", " ", path.read_text())
    out = {}
    for line in text.splitlines():
        m = re.match(r"^([A-Za-z0-9_.\-]+)==(\S+)((?:\s+--hash=sha256:[0-9a-f]{64})*)", line)
        if m:
            out[canonicalize_name(m.group(1))] = (m.group(2), re.findall(r"sha256:([0-9a-f]{64})", m.group(3)))
    return out


def _closure(names: list[str]) -> set[str]:
    seen: set[str] = set()
    todo = list(names)
    while todo:
        req = Requirement(todo.pop())
        key = canonicalize_name(req.name)
        if key in seen or (req.marker and not req.marker.evaluate({"extra": ""})):
            continue
        seen.add(key)
        todo += [r for r in md.requires(req.name) or [] if "extra ==" not in r]
    return seen


def test_lock_pins_every_runtime_dependency_with_hashes():
    """Requirements.lock covers [project.dependencies] and what they pull in, each
    pinned (==) to a version the pyproject allows, each with sha256 hashes."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    lock = read_lock(ROOT / "requirements.lock")
    assert lock and all(hashes for _, hashes in lock.values()), "every pin carries --hash lines"
    for dep in project["dependencies"]:
        req = Requirement(dep)
        key = canonicalize_name(req.name)
        assert key in lock, f"{req.name} is in pyproject.toml but not in requirements.lock: run make lock"
        assert req.specifier.contains(lock[key][0], prereleases=True), f"{req.name}=={lock[key][0]} violates {req.specifier}"
    assert set(lock) == _closure(project["dependencies"]), "requirements.lock is stale: run make lock"


def test_build_lock_pins_the_build_backend():
    """The wheel is built with pinned, hash-checked setuptools and wheel."""
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]["requires"]
    lock = read_lock(ROOT / "requirements-build.lock")
    for dep in requires:
        req = Requirement(dep)
        version, hashes = lock[canonicalize_name(req.name)]
        assert req.specifier.contains(version) and hashes


def test_containerfile_installs_from_the_locks():
    """Both stages install with --require-hashes from the lock files."""
    text = re.sub(r"\\\n\s*", " ", (ROOT / "Containerfile").read_text())
    build, final = text.split("\nFROM ")[1:3]
    runs_build = " ".join(re.findall(r"^RUN (.+)$", build, re.M))
    runs_final = " ".join(re.findall(r"^RUN (.+)$", final, re.M))
    assert re.search(r"pip install [^&]*--require-hashes -r requirements-build\.lock", runs_build)
    assert re.search(r"pip download [^&]*--require-hashes [^&]*-r requirements\.lock", runs_build)
    assert "--no-build-isolation" in runs_build, "our wheel builds with the pinned setuptools, not a fresh download"
    assert re.search(r"pip install [^&]*--no-index [^&]*--require-hashes -r /tmp/requirements\.lock", runs_final)
    assert re.search(r"pip install [^&]*--no-index [^&]*--no-deps pcitopo", runs_final)


# -- make demo ----------------------------------------------------------------------------------

def _make_dry_run(target: str) -> list[str]:
    r = subprocess.run(["make", "-n", "-B", target], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout.splitlines()


def test_make_demo_does_not_fetch_the_guest_kernel():
    """`make demo` (and test-fast) run the Debian setup with SKIP_KERNEL=1 only;
    `make test` still fetches the kernel for the e2e tier."""
    for target in ("demo", "test-fast"):
        setup = [ln for ln in _make_dry_run(target) if "setup-debian.sh" in ln]
        assert setup and all("SKIP_KERNEL=1 bash" in ln for ln in setup), (target, setup)
    setup = [ln for ln in _make_dry_run("test") if "setup-debian.sh" in ln]
    assert any(not ln.startswith("SKIP_KERNEL=1") for ln in setup), setup


# -- the SBOM a scanner reads -------------------------------------------------------------------

def test_the_sbom_of_a_plain_venv_is_valid_spdx_with_its_vendored_libraries(tmp_path):
    """scripts/sbom.py on this test environment (and this machine's dpkg database): spdx-tools'
    validator accepts it without a message; the document DESCRIBES the environment, packages
    carry checksums and declared licences, and the native libraries inside the lxml and grpcio
    wheels are listed with the versions those wheels carry."""
    import json
    import sys
    import sysconfig

    import lxml.etree

    from testkit import spdx_problems

    status = Path("/var/lib/dpkg/status")
    if not status.exists():
        status = tmp_path / "status"
        status.write_text("")
    out = tmp_path / "sbom.spdx.json"
    with open(out, "w") as fh:
        r = subprocess.run([sys.executable, str(ROOT / "scripts" / "sbom.py"), str(status), sysconfig.get_paths()["purelib"],
                            "2026-01-01T00:00:00Z", "pcitopo test environment"], stdout=fh, stderr=subprocess.PIPE,
                           text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert spdx_problems(out) == ""
    doc = json.loads(out.read_text())
    root = doc["documentDescribes"][0]
    assert {"spdxElementId": "SPDXRef-DOCUMENT", "relationshipType": "DESCRIBES", "relatedSpdxElement": root} in doc["relationships"]
    by_name = {p["name"]: p for p in doc["packages"]}
    assert by_name["pcitopo"]["licenseDeclared"] == "Apache-2.0" and by_name["pcitopo"]["checksums"][0]["algorithm"] == "SHA256"
    assert by_name["PyYAML"]["licenseDeclared"].startswith("LicenseRef-")  # License: MIT, a free-text field, kept as text
    refs = {r["licenseId"]: r for r in doc["hasExtractedLicensingInfos"]}
    assert refs[by_name["PyYAML"]["licenseDeclared"]]["extractedText"] == "MIT"
    assert by_name["libxml2"]["versionInfo"] == ".".join(map(str, lxml.etree.LIBXML_VERSION))
    assert by_name["libxslt"]["versionInfo"] == ".".join(map(str, lxml.etree.LIBXSLT_VERSION))
    assert re.fullmatch(r"\d+(\.\d+)+", by_name["zlib"]["versionInfo"])
    assert {"boringssl", "c-ares"} <= set(by_name)
    contained = {(r["spdxElementId"], r["relatedSpdxElement"]) for r in doc["relationships"] if r["relationshipType"] == "CONTAINS"}
    assert (by_name["lxml"]["SPDXID"], by_name["libxml2"]["SPDXID"]) in contained
    assert (by_name["grpcio"]["SPDXID"], by_name["zlib"]["SPDXID"]) in contained
    cpes = [ref["referenceLocator"] for ref in by_name["libxml2"]["externalRefs"] if ref["referenceType"] == "cpe23Type"]
    assert cpes == [f"cpe:2.3:a:xmlsoft:libxml2:{by_name['libxml2']['versionInfo']}:*:*:*:*:*:*:*"]


def test_the_validator_sees_an_sbom_without_its_describes_relationship(tmp_path):
    """The check above can fail: the document the old sbom.py wrote (no DESCRIBES) is refused."""
    from testkit import spdx_problems

    doc = {"spdxVersion": "SPDX-2.3", "dataLicense": "CC0-1.0", "SPDXID": "SPDXRef-DOCUMENT", "name": "x",
           "documentNamespace": "https://spdx.org/spdxdocs/x", "creationInfo": {"created": "2026-01-01T00:00:00Z",
                                                                               "creators": ["Tool: x"]},
           "packages": [{"SPDXID": f"SPDXRef-{n}", "name": n, "downloadLocation": "NOASSERTION"} for n in ("a", "b")]}
    path = tmp_path / "old.spdx.json"
    path.write_text(__import__("json").dumps(doc))
    assert "DESCRIBES" in spdx_problems(path)
