"""The reader: live /sys as the oracle (lspci, pyudev), captures, and hostile trees."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest

from pcitopo.errors import MalformedBdfError, SysfsError
from pcitopo.host.capture import capture
from pcitopo.host.sources import DirSource, MemoryTree, resolve
from pcitopo.host.sysfs import SysfsReader, open_host
from pcitopo.model.tree import Bdf, Topology

LIVE = os.path.isdir("/sys/bus/pci/devices") and bool(os.listdir("/sys/bus/pci/devices"))


def model_facts(t: Topology) -> list[tuple]:
    return [
        (str(f.bdf), f.path, f.vendor, f.device, f.class_code, f.subsystem_vendor, f.subsystem_device,
         f.numa_node, tuple(f.link), f.driver, f.iommu_group, f.physfn, t.role(f).value)
        for f in t.functions()
    ]


@pytest.mark.live
@pytest.mark.skipif(not LIVE, reason="this machine shows no PCI devices in /sys")
@pytest.mark.skipif(shutil.which("lspci") is None, reason="pciutils not installed (make setup)")
def test_live_sys_matches_lspci():
    t = open_host("/sys")
    out = subprocess.run(["lspci", "-Dn"], capture_output=True, text=True, check=True, timeout=30).stdout
    seen = {}
    for line in out.splitlines():
        m = re.match(r"^(\S+) ([0-9a-f]{4}): ([0-9a-f]{4}):([0-9a-f]{4})", line)
        assert m, line
        seen[m.group(1)] = (int(m.group(2), 16), int(m.group(3), 16), int(m.group(4), 16))
    assert sorted(seen) == [str(b) for b in t.bdfs()]
    for bdf, (cls, ven, dev) in seen.items():
        f = t.function(bdf)
        assert (f.class_code >> 8, f.vendor, f.device) == (cls, ven, dev)
    # lspci's tree (-tv) gives each function's parent bridge: compare with ours.
    tree = subprocess.run(["lspci", "-tn"], capture_output=True, text=True, check=True, timeout=30).stdout
    roots = re.findall(r"\[([0-9a-f]{4}):([0-9a-f]{2})\]", tree)
    ours = {(f.bdf.domain, f.bdf.bus) for f in t.functions() if f.parent_bdf is None}
    if roots:
        assert {(int(d, 16), int(b, 16)) for d, b in roots} == ours
    for f in t.functions():
        parent = f.parent_bdf
        if parent is not None:
            sec = int(open(f"/sys/bus/pci/devices/{parent}/secondary_bus_number").read()) if os.path.exists(
                f"/sys/bus/pci/devices/{parent}/secondary_bus_number") else f.bdf.bus
            assert sec == f.bdf.bus


@pytest.mark.live
@pytest.mark.skipif(not LIVE, reason="this machine shows no PCI devices in /sys")
def test_live_sys_matches_pyudev():
    pyudev = pytest.importorskip("pyudev")
    ctx = pyudev.Context()
    udev = {d.sys_name: d for d in ctx.list_devices(subsystem="pci")}
    t = open_host("/sys")
    assert sorted(udev) == [str(b) for b in t.bdfs()]
    for b in t.bdfs():
        d = udev[str(b)]
        f = t.function(b)
        parent = d.find_parent("pci")
        assert (str(f.parent_bdf) if f.parent_bdf else None) == (parent.sys_name if parent else None)
        assert int(d.attributes.asstring("vendor"), 16) == f.vendor
        assert d.sys_path == "/sys/devices/" + "/".join(f.path)


@pytest.mark.live
@pytest.mark.skipif(not LIVE, reason="this machine shows no PCI devices in /sys")
def test_capture_of_live_sys_reads_back_identically(tmp_path):
    out = tmp_path / "host.tar.gz"
    summary = capture("/sys", out)
    assert summary.functions == len(os.listdir("/sys/bus/pci/devices"))
    assert model_facts(open_host(out)) == model_facts(open_host("/sys"))
    assert open_host(out).numa_nodes() == open_host("/sys").numa_nodes()


@pytest.mark.parametrize("fixture", ["hgx-h100", "pcie-2socket"])
def test_capture_roundtrip_is_exact_and_deterministic(tmp_path, fixture):
    a, b = tmp_path / "a.tar.gz", tmp_path / "b.tar.gz"
    capture(f"fixtures/{fixture}", a)
    capture(a, b)
    assert a.read_bytes() == b.read_bytes()
    assert model_facts(open_host(a)) == model_facts(open_host(f"fixtures/{fixture}"))
    d = tmp_path / "dir"
    MemoryTree.from_tarball(a).write_dir(d)
    assert model_facts(open_host(d)) == model_facts(open_host(a))


def _tree(**files) -> MemoryTree:
    t = MemoryTree("hostile")
    t.add_link("bus/pci/devices/0000:00:01.0", "../../../devices/pci0000:00/0000:00:01.0")
    base = "devices/pci0000:00/0000:00:01.0"
    defaults = {"vendor": "0x10de\n", "device": "0x2330\n", "class": "0x030200\n"}
    defaults.update(files)
    for k, v in defaults.items():
        if v is None:
            continue
        if v == "DIR":
            t.add_dir(f"{base}/{k}")
        else:
            t.add_file(f"{base}/{k}", v)
    return t


def test_missing_optional_attributes_are_fine():
    t = Topology(SysfsReader(_tree()))
    f = t.function("0000:00:01.0")
    assert f.numa_node == -1 and f.subsystem_vendor is None and f.link.max_width is None


def test_missing_required_attribute_is_a_clear_error():
    t = Topology(SysfsReader(_tree(vendor=None)))
    with pytest.raises(SysfsError, match="required attribute .*vendor is missing"):
        t.function("0000:00:01.0")


def test_unreadable_optional_attribute_is_a_warning_not_a_crash():
    t = Topology(SysfsReader(_tree(numa_node="DIR", max_link_width="sixteen\n")))
    f = t.function("0000:00:01.0")
    assert f.numa_node == -1 and f.link.max_width is None
    assert any("numa_node" in w for w in t.warnings) and any("max_link_width" in w for w in t.warnings)


def test_unreadable_required_attribute_names_the_file():
    t = Topology(SysfsReader(_tree(vendor="DIR")))
    with pytest.raises(SysfsError, match="vendor is unreadable"):
        t.function("0000:00:01.0")


def test_symlink_loop_is_a_clear_error():
    t = MemoryTree("loop")
    t.add_link("bus/pci/devices/0000:00:01.0", "../../../devices/a")
    t.add_link("devices/a", "b")
    t.add_link("devices/b", "a")
    with pytest.raises(SysfsError, match="symlink loop"):
        Topology(SysfsReader(t)).function("0000:00:01.0")


def test_symlinks_cannot_escape_a_directory_source(tmp_path):
    (tmp_path / "bus/pci/devices").mkdir(parents=True)
    os.symlink("/etc", tmp_path / "devices")
    src = DirSource(tmp_path)
    # An absolute link resolves inside the tree (chroot semantics), never to the real /etc.
    assert resolve(src, "devices/passwd") == "etc/passwd"
    assert src.read(resolve(src, "devices/passwd")) is None
    os.symlink("../../../devices/pci0000:00/0000:00:01.0", tmp_path / "bus/pci/devices/0000:00:01.0")
    with pytest.raises(SysfsError):
        open_host(tmp_path).function("0000:00:01.0")


def test_attribute_symlinks_are_refused_in_directories(tmp_path):
    d = tmp_path / "devices/pci0000:00/0000:00:01.0"
    d.mkdir(parents=True)
    (tmp_path / "bus/pci/devices").mkdir(parents=True)
    os.symlink("../../../devices/pci0000:00/0000:00:01.0", tmp_path / "bus/pci/devices/0000:00:01.0")
    (d / "vendor").write_text("0x10de\n")
    (d / "device").write_text("0x2330\n")
    os.symlink("/etc/hostname", d / "class")
    with pytest.raises(SysfsError, match="class is unreadable"):
        open_host(tmp_path).function("0000:00:01.0")


def test_not_a_capture_is_a_clear_error(tmp_path):
    bad = tmp_path / "x.tar.gz"
    bad.write_bytes(b"not a tarball")
    with pytest.raises(SysfsError, match="not a readable capture"):
        open_host(bad)
    with pytest.raises(SysfsError, match="no such sysfs"):
        open_host(tmp_path / "missing")


def test_unknown_bdf_and_bad_bdf():
    t = open_host("fixtures/hgx-h100")
    assert t.find("0000:77:00.0") is None
    with pytest.raises(MalformedBdfError, match="malformed BDF: not a PCI address"):
        Bdf.parse("zz:00.0")
    with pytest.raises(ValueError, match="device number above 0x1f"):
        Bdf.parse("0000:00:20.0")
