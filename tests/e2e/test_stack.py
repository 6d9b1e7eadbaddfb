"""The stack the e2e tier boots on.

Without a daemon: the version parsing of ``testkit.stack`` and, when ``make setup`` built it, that
the Debian 13 root carries the versions the docs claim (QEMU 10.0, libvirt 11.3, SeaBIOS 1.16.3,
OVMF 2025.02). With a daemon (``e2e``): libvirtd and QEMU really run from the root, its mounts
are invisible outside its namespace, and stopping it leaves no process behind.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from testkit.e2e.libvirtd import PrivateLibvirtd, _pid_alive
from testkit.stack import DEBIAN12, StackMissing, StackVersions, _upstream, debian13


def test_upstream_part_of_debian_versions():
    assert _upstream("1:10.0.13+ds-0+deb13u1") == "10.0.13"
    assert _upstream("2025.02-8+deb13u1") == "2025.02"
    assert _upstream("1.16.3-2") == "1.16.3"
    assert _upstream("11.3.0-3+deb13u3") == "11.3.0"
    assert _upstream("1:7.2+dfsg-7+deb12u18+b3") == "7.2"


def test_tested_with_line():
    v = StackVersions("Debian 13 (trixie)", "10.0.13", "11.3.0", "1.16.3", "2025.02",
                      (("seabios", "1.16.3-2"),))
    assert v.line() == ("Debian 13 (trixie): QEMU 10.0.13, libvirt 11.3.0, SeaBIOS 1.16.3, "
                        "OVMF 2025.02 (seabios 1.16.3-2)")
    assert v.as_dict()["packages"] == {"seabios": "1.16.3-2"}


def _debian13():
    """The root, or skip (locally) / fail (CI, where `make test` builds it)."""
    try:
        return debian13()
    except StackMissing as e:
        if os.environ.get("CI"):
            pytest.fail(str(e))
        pytest.skip(str(e))


def test_debian13_root_carries_the_documented_versions():
    stack = _debian13()
    v = stack.versions()
    assert v.qemu.startswith("10.0.") and v.libvirt.startswith("11.3."), v.line()
    assert (v.seabios, v.ovmf) == ("1.16.3", "2025.02"), v.line()
    assert stack.domain_rng.is_file()
    assert DEBIAN12.root is None and stack.root is not None


def _mount_points(mountinfo: str) -> list[str]:
    return [line.split()[4] for line in mountinfo.splitlines()]


@pytest.mark.e2e
def test_daemon_runs_from_the_root_and_leaves_nothing(e2e_ready, tmp_path):
    stack = _debian13()
    lv = PrivateLibvirtd(stack=stack)
    lv.start()
    try:
        pid = lv.proc.pid
        # the daemon's binary and its root directory are the root's
        assert Path(f"/proc/{pid}/root").resolve() == stack.root
        assert os.readlink(f"/proc/{pid}/exe") == f"{stack.root}/usr/sbin/libvirtd"
        version = lv.virsh("version").stdout
        assert f"Using library: libvirt {stack.versions().libvirt}" in version, version
        assert f"Running hypervisor: QEMU {stack.versions().qemu}" in version, version
        # its binds exist in its namespace only (its mountinfo names them relative to its root)
        inside = _mount_points(Path(f"/proc/{pid}/mountinfo").read_text())
        assert {"/dev", "/proc", "/sys", "/etc/libvirt", "/run/libvirt", str(lv.base)} <= set(inside), inside
        outside = _mount_points(Path("/proc/self/mountinfo").read_text())
        assert not [m for m in outside if m == str(stack.root) or m.startswith(f"{stack.root}/")]
    finally:
        lv.stop()
    assert not _pid_alive(pid)
    lv.cleanup()
    assert not lv.base.exists()


def test_a_qemu_abort_is_told_from_a_guest_failure():
    """guestboot boots once more only when QEMU itself aborted (seen once with QEMU 10.0's TCG)."""
    from testkit.e2e.guestboot import _qemu_abort

    log = ("2026-12-03 14:25:31.817+0000: Domain id=4 is tainted: high-privileges\n"
           "qemu-system-x86_64: system/physmem.c:2671: iotlb_to_section: Assertion "
           "`section_index < d->map.sections_nb' failed.\n"
           "2026-12-03 14:26:26.375+0000: shutting down, reason=crashed\n")
    assert _qemu_abort(log).endswith("d->map.sections_nb' failed.")
    assert _qemu_abort("2026-12-03 shutting down, reason=shutdown\n") is None
    assert _qemu_abort("qemu-system-x86_64: -device foo: Bus 'pci.9' not found\n") is None
