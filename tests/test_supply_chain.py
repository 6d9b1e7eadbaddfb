"""Issue 14 finding 10: the image's inputs. A small build context (.containerignore), every
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


def test_f10_containerignore_keeps_the_build_context_small():
    """Finding 10: no .venv, guest kernel, .cache or build output in the context; everything the
    Containerfile COPYs is in it."""
    assert os.path.realpath(ROOT / ".dockerignore") == str(ROOT / ".containerignore")
    ctx = build_context(ROOT)
    assert sum(ctx.values()) < CONTEXT_LIMIT, sorted(ctx, key=ctx.get)[-5:]
    assert not [p for p in ctx if p.startswith((".venv/", ".cache/", "build/", "tests/", "fixtures/", "bench/", "docs/"))]
    assert not [p for p in ctx if "__pycache__" in p or p.endswith(".pyc")]
    text = (ROOT / "Containerfile").read_text()
    sources = [s for line in re.findall(r"^COPY (?!--from)(.+)$", text, re.M) for s in line.split()[:-1]]
    assert {"pyproject.toml", "requirements.lock", "requirements-build.lock", "topology/", "sidecar/"} <= set(sources)
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


def test_f10_lock_pins_every_runtime_dependency_with_hashes():
    """Finding 10: requirements.lock covers [project.dependencies] and what they pull in, each
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


def test_f10_build_lock_pins_the_build_backend():
    """Finding 10: the wheel is built with pinned, hash-checked setuptools and wheel."""
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]["requires"]
    lock = read_lock(ROOT / "requirements-build.lock")
    for dep in requires:
        req = Requirement(dep)
        version, hashes = lock[canonicalize_name(req.name)]
        assert req.specifier.contains(version) and hashes


def test_f10_containerfile_installs_from_the_locks():
    """Finding 10: both stages install with --require-hashes from the lock files."""
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


def test_f10_make_demo_does_not_fetch_the_guest_kernel():
    """Finding 10: `make demo` (and test-fast) run the Debian setup with SKIP_KERNEL=1 only;
    `make test` still fetches the kernel for the e2e tier."""
    for target in ("demo", "test-fast"):
        setup = [ln for ln in _make_dry_run(target) if "setup-debian.sh" in ln]
        assert setup and all("SKIP_KERNEL=1 bash" in ln for ln in setup), (target, setup)
    setup = [ln for ln in _make_dry_run("test") if "setup-debian.sh" in ln]
    assert any(not ln.startswith("SKIP_KERNEL=1") for ln in setup), setup
