"""The README says what was booted (stack and versions), what was simulated and what has never
run, in one table, instead of "Proven by booting …". The booted stack's versions are the ones
scripts/setup-trixie.sh pins (the one place they are chosen; a mirror serving others fails that
script)."""

from __future__ import annotations

import re

from testkit import REPO as ROOT

README = (ROOT / "README.md").read_text()
# setup-trixie.sh's package name -> how the README names it
NAMES = {"qemu-system-x86": "QEMU", "libvirt-daemon": "libvirt", "seabios": "SeaBIOS", "ovmf": "OVMF (edk2)"}


def pinned_versions() -> dict[str, str]:
    """PINS=( package=[epoch:]upstream-prefix ... ) of setup-trixie.sh, as upstream versions."""
    script = (ROOT / "scripts" / "setup-trixie.sh").read_text()
    body = re.search(r"^PINS=\(\n(.*?)^\)", script, re.M | re.S).group(1)
    pins = dict(line.strip().split("=", 1) for line in body.splitlines() if line.strip())
    return {pkg: re.sub(r"^\d+:", "", v).rstrip(".-") for pkg, v in pins.items()}


def table_rows() -> dict[str, list[str]]:
    rows = {}
    for line in README.splitlines():
        m = re.match(r"^\| \*\*(booted|simulated|never run)\*\* \|(.*)\|$", line)
        if m:
            rows[m.group(1)] = [c.strip() for c in m.group(2).split("|")]
    return rows


def test_readme_table_says_booted_simulated_never_run():
    rows = table_rows()
    assert set(rows) == {"booted", "simulated", "never run"}
    booted = " ".join(rows["booted"])
    assert "TCG" in booted and "Debian 13" in booted
    simulated = " ".join(rows["simulated"])
    for word in ("re-parse", "stand-ins", "KubeVirt"):
        assert word in simulated, word
    never = " ".join(rows["never run"])
    for word in ("real KubeVirt cluster", "KVM", "GPUs", "NCCL itself"):
        assert word in never, word
    assert "Proven by" not in README


def test_booted_versions_are_the_ones_setup_trixie_pins():
    pins = pinned_versions()
    assert set(pins) == set(NAMES), "a pinned package the README table does not name (or the reverse)"
    stack = table_rows()["booted"][1]
    for pkg, version in pins.items():
        assert f"{NAMES[pkg]} {version}" in stack, (pkg, version, stack)
