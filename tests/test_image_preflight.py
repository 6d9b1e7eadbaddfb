"""`make image` (scripts/image.sh) honours pip's own
PIP_CERT as well as PIP_CA_BUNDLE, and a foreign-architecture build on a machine without
arch-test says which Debian packages to install instead of mmdebstrap's bare
`E: install arch-test`. Both through `--preflight`, which checks and prints the build commands
but builds nothing."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from testkit import REPO as ROOT

IMAGE_SH = ROOT / "scripts" / "image.sh"
BASH = shutil.which("bash") or "/bin/bash"


def _need_tools() -> None:
    missing = [t for t in ("mmdebstrap", "podman", "dpkg") if shutil.which(t) is None]
    if missing:
        msg = f"missing: {', '.join(missing)} (scripts/setup-debian.sh installs them)"
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)


def preflight(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([BASH, str(IMAGE_SH), "--preflight", *args], capture_output=True, text=True,
                          env=env, timeout=120, cwd=ROOT)


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PIP_CERT", "PIP_CA_BUNDLE")}
    return {**env, **extra}


def native_arch() -> str:
    return subprocess.run(["dpkg", "--print-architecture"], capture_output=True, text=True, check=True).stdout.strip()


def test_make_image_honours_pips_own_pip_cert(tmp_path):
    _need_tools()
    ca, ours = tmp_path / "proxy-ca.pem", tmp_path / "ours.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    ours.write_text("-----BEGIN CERTIFICATE-----\n")
    mount = f"-v {ca}:/run/pip-ca.crt:ro --build-arg PIP_CERT=/run/pip-ca.crt"

    r = preflight(env=clean_env(PIP_CERT=str(ca)))
    assert r.returncode == 0, r.stderr
    assert mount in r.stdout and f"PIP_CERT={ca}" in r.stderr

    r = preflight(env=clean_env(PIP_CERT=str(ca), PIP_CA_BUNDLE=str(ours)))
    assert r.returncode == 0 and f"-v {ours}:/run/pip-ca.crt:ro" in r.stdout, "PIP_CA_BUNDLE first"

    r = preflight(env=clean_env())
    assert r.returncode == 0 and "pip-ca.crt" not in r.stdout

    r = preflight(env=clean_env(PIP_CERT=str(tmp_path / "missing.pem")))
    assert r.returncode == 2 and r.stderr.strip() == f"image: PIP_CERT={tmp_path / 'missing.pem'} is not readable"


def path_without(tmp_path: Path, *hidden: str) -> str:
    """A PATH with every program of this machine's PATH but ``hidden``: a machine without them."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for d in os.environ["PATH"].split(os.pathsep):
        if not os.path.isdir(d):
            continue
        for name in os.listdir(d):
            target = os.path.join(d, name)
            if name not in hidden and not (bindir / name).exists() and os.access(target, os.X_OK):
                (bindir / name).symlink_to(target)
    return str(bindir)


def test_a_foreign_arch_without_arch_test_says_what_to_install(tmp_path):
    _need_tools()
    foreign = {"amd64": "arm64", "arm64": "amd64"}[native_arch()]
    r = preflight("--arch", foreign, env=clean_env(PATH=path_without(tmp_path, "arch-test")))
    assert r.returncode == 2, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert "apt-get install arch-test" in lines[0] and foreign in lines[0], lines[0]
    assert "E: install arch-test" not in r.stderr and not r.stdout


def test_setup_debian_installs_what_a_foreign_arch_build_needs():
    """mmdebstrap only recommends arch-test, and setup-debian.sh installs without recommends:
    it names arch-test itself, next to qemu-user-static and binfmt-support."""
    text = (ROOT / "scripts" / "setup-debian.sh").read_text()
    packages = text[text.index("PACKAGES=("):text.index("\n)\n")]
    for p in ("arch-test", "qemu-user-static", "binfmt-support", "mmdebstrap"):
        assert f"\n    {p} " in packages or f"\n    {p}\n" in packages, p


# -- the installed package, as the docs describe it ----------------------------------------------

DOCS = [ROOT / "README.md", ROOT / "fixtures" / "README.md", ROOT / "tests" / "e2e" / "README.md",
        *sorted((ROOT / "docs").glob("*.md"))]
# a dotted module path that starts at a folder's name, not at the installed package
# (a KubeVirt Plugin's `sidecar.socketPath` is a field of its CR, not a module)
BARE_MODULE = re.compile(r"(?<![\w./-])(?:topology|sidecar)\.(?!socketPath)[a-z_]+\w*(?:\.\w+)*")


def test_docs_name_modules_as_installed_and_say_one_top_level_package():
    """The wheel installs one package, `pcitopo` (and no test kit): a doc naming a module by an
    old folder name (`import topology`, `sidecar.core`) names what no install has."""
    for doc in DOCS:
        text = doc.read_text()
        bare = BARE_MODULE.findall(text)
        assert not bare, f"{doc.relative_to(ROOT)}: {bare[:5]} (write pcitopo.{bare[0]})"
        assert not re.search(r"\b(?:import|from) (?:topology|sidecar)\b", text), doc
    for doc in (ROOT / "README.md", ROOT / "docs" / "ARCHITECTURE.md"):
        text = " ".join(doc.read_text().split())
        assert "one top-level Python package, `pcitopo`" in text, doc
        assert "`pcitopo`" in text and "`pcitopo.cli`" in text, doc
    arch = " ".join((ROOT / "docs" / "ARCHITECTURE.md").read_text().split())
    assert "It is never installed" in arch and "a package of the development install" not in arch


# a module named as code (`pcitopo.serve`, `pcitopo.kubevirt.launcher`); `pcitopo.kubevirt.io/...`
# is an annotation prefix, not a module
NAMED_MODULE = re.compile(r"`(pcitopo(?:\.[a-z_]\w*)+)`")


def module_file(dotted: str) -> Path | None:
    path = ROOT / "src" / Path(*dotted.split("."))
    return next((p for p in (path.with_suffix(".py"), path / "__init__.py") if p.is_file()), None)


def installed_module(dotted: str) -> bool:
    """A module the package installs, or a name defined at the top of one (`pcitopo.x.y.func`)."""
    parts = dotted.split(".")
    for k in range(len(parts), 0, -1):
        found = module_file(".".join(parts[:k]))
        if found:
            rest = parts[k:]
            return not rest or (len(rest) == 1 and re.search(
                rf"^(?:def|class|async def) {rest[0]}\b|^{rest[0]}\b[^=\n]*=", found.read_text(), re.M) is not None)
    return False


def test_docs_name_modules_that_the_package_has():
    """The README named `pcitopo.cli` as "the commands and the hook" after the hook moved to
    `pcitopo.serve`; every module a doc names as code is one src/pcitopo/ installs."""
    assert installed_module("pcitopo.serve") and not installed_module("pcitopo.sidecar")
    assert installed_module("pcitopo.host.sysfs.open_host") and not installed_module("pcitopo.host.sysfs.no_such_name")
    missing = [f"{doc.relative_to(ROOT)}: {name}" for doc in DOCS
               for name in NAMED_MODULE.findall(doc.read_text())
               if not name.startswith("pcitopo.kubevirt.io") and not installed_module(name)]
    assert missing == []
