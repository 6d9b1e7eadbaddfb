"""The license text ships, the CHANGELOG says what each kind of release may
change, and `--version` prints the CHANGELOG's newest version (one source: __version__)."""

from __future__ import annotations

import hashlib
import re
import subprocess
import tomllib
from importlib import metadata as md

from pcitopo import __version__
from testkit import REPO as ROOT
from testkit.server_proc import BIN

# sha256 of the Apache License 2.0 as the ASF publishes it (LICENSE-2.0.txt; Debian ships the
# same bytes as /usr/share/common-licenses/Apache-2.0).
APACHE_2_0_SHA256 = "cfc7749b96f63bd31c3c42b5c471bf756814053e847c10f3eb003417bc523d30"
CHANGELOG = (ROOT / "CHANGELOG.md").read_text()


def test_license_is_the_apache_2_0_text_pyproject_names():
    assert hashlib.sha256((ROOT / "LICENSE").read_bytes()).hexdigest() == APACHE_2_0_SHA256
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == "Apache-2.0" and project["license-files"] == ["LICENSE"]
    assert 'org.opencontainers.image.licenses="Apache-2.0"' in (ROOT / "Containerfile").read_text()


def newest_version() -> str:
    versions = re.findall(r"^## (\d+\.\d+\.\d+)\b", CHANGELOG, re.M)
    assert versions, "CHANGELOG.md has no `## X.Y.Z` entry"
    return versions[0]


def test_version_flags_print_the_changelogs_newest_version():
    v = newest_version()
    assert v == __version__ == md.version("pcitopo")
    for cmd, want in (("pcitopo", f"pcitopo {v}"), ("xmlfix", f"xmlfix (pcitopo) {v}")):
        r = subprocess.run([str(BIN / cmd), "--version"], capture_output=True, text=True, timeout=60)
        # from a git checkout (the editable install) the commit follows: "pcitopo 0.2.0 (git 1a2b3c4d5e6f)"
        assert r.returncode == 0 and re.fullmatch(re.escape(want) + r"( \(git [0-9a-f]{12}\))?", r.stdout.strip()), (cmd, r.stdout)


def test_changelog_says_what_a_patch_and_a_minor_may_change():
    policy = CHANGELOG[CHANGELOG.index("## Version policy"):CHANGELOG.index(f"## {newest_version()}")]
    rows = {m.group(1): (m.group(2), m.group(3)) for m in
            re.finditer(r"^\| (patch|minor|major)\b[^|]*\| ([^|]+) \| ([^|]+) \|$", policy, re.M)}
    assert set(rows) == {"patch", "minor", "major"}
    patch_may_not, minor_may = rows["patch"][1], rows["minor"][0]
    for contract in ("JSON key", "annotation", "log field"):
        assert contract in patch_may_not and contract.split()[0] in minor_may, contract
    assert "Breaking" in policy and "before 1.0" in policy.lower()
