"""Fast tests of the e2e helpers (no guest is booted: not marked e2e)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from lxml import etree

from testkit.e2e.bootable import QEMU_NS, make_bootable
from testkit.e2e.guestboot import TCG_WRAPPER
from testkit.e2e.guesttree import (
    GuestAddr,
    PrintoutError,
    guest_bdf_of,
    guest_sysfs_tree,
    map_guest_bdfs,
    parse_printout,
)

DATA = Path(__file__).parent / "data"
SCHEMA = Path("/usr/share/libvirt/schemas/domain.rng")


def _smoke() -> bytes:
    return (DATA / "smoke-domain.xml").read_bytes()


def _bootable(xml: bytes | None = None, **kw):
    notes: list[str] = []
    out, mapping = make_bootable(
        xml or _smoke(), "/k/vmlinuz", "/k/initrd", "/k/serial.log", notes=notes, **kw
    )
    return etree.fromstring(out), mapping, notes


def _c14n(el) -> bytes:
    el = etree.fromstring(etree.tostring(el))
    for e in el.iter():
        if e.text is not None and not e.text.strip():
            e.text = None
        if e.tail is not None and not e.tail.strip():
            e.tail = None
    return etree.tostring(el, method="c14n")


def test_planner_decisions_are_kept():
    before = etree.fromstring(_smoke())
    after, _, _ = _bootable()
    ctl = lambda r: [_c14n(c) for c in r.iterfind("devices/controller[@type='pci']")]  # noqa: E731
    assert ctl(after) == ctl(before)
    assert [c.get("id") for c in after.iterfind("cpu/numa/cell")] == ["0", "1"]
    assert [m.get("cellid") for m in after.iterfind("numatune/memnode")] == ["0", "1"]
    assert after.find("features/acpi") is not None
    ov = after.findall(f"{{{QEMU_NS}}}override/{{{QEMU_NS}}}device")
    assert [d.get("alias") for d in ov] == ["ua-pcitopo-rp0"]


def test_hostdevs_become_standins_at_the_same_address():
    before = etree.fromstring(_smoke())
    after, mapping, _ = _bootable()
    assert after.find("devices/hostdev") is None
    want = {}
    for hd in before.iterfind("devices/hostdev"):
        want[hd.find("alias").get("name")] = dict(hd.find("address").attrib)
    got = {}
    for el in after.find("devices"):
        a = el.find("alias")
        if a is not None and a.get("name") in want:
            got[a.get("name")] = (el.tag, dict(el.find("address").attrib))
    assert {k: v[1] for k, v in got.items()} == want
    assert got["ua-gpu-gpu0"][0] == "video"
    assert got["ua-sriov-ib0"][0] == "interface"
    assert got["ua-hostdevice-gpu1-audio"][0] == "rng"
    assert mapping[GuestAddr(7, 0, 0)].alias == "ua-gpu-gpu1"
    assert mapping[GuestAddr(7, 0, 1)].source == "0000:9a:00.1"
    assert mapping[GuestAddr(6, 0, 0)].kind == "nic"


def test_kinds_override_and_decimal_bus():
    xml = _smoke().replace(b'bus="0x07" slot="0x00" function="0x1"', b'bus="7" slot="0" function="1"')
    after, mapping, _ = _bootable(xml, kinds={"0000:9a:00.1": "nic", "ua-gpu-gpu0": "other"})
    assert mapping[GuestAddr(7, 0, 1)].element == "interface"
    assert mapping[GuestAddr(5, 0, 0)].element == "rng"


def test_unbootable_things_are_gone():
    after, _, notes = _bootable()
    assert after.get("type") == "qemu"
    for xp in ("memoryBacking", "cputune", "uuid", "devices/disk", "devices/graphics",
               "devices/channel", "features/kvm", "cpu/feature"):
        assert after.find(xp) is None, xp
    assert after.find("os/kernel").text == "/k/vmlinuz"
    assert after.find("os/type").get("machine") == "q35"
    assert after.find("cpu").get("mode") == "custom"
    assert [i.get("type") for i in after.iterfind("devices/interface")] == ["user", "user"]
    assert [s.find("source").get("path") for s in after.iterfind("devices/serial")] == ["/k/serial.log"]
    assert int(after.find("vcpu").text) == 2
    assert notes


def test_first_gpu_is_primary_bochs_without_other_video():
    root = etree.fromstring(_smoke())
    devices = root.find("devices")
    devices.remove(devices.find("video"))
    after, mapping, _ = _bootable(etree.tostring(root))
    models = [v.find("model").get("type") for v in after.iterfind("devices/video")]
    assert models == ["bochs", "virtio"]
    assert mapping[GuestAddr(5, 0, 0)].model == "bochs"


def test_hostdev_without_guest_address_is_unplaced():
    root = etree.fromstring(_smoke())
    hd = root.xpath("devices/hostdev[alias/@name='ua-gpu-gpu0']")[0]
    hd.remove(hd.find("address"))
    unplaced = []
    _, mapping = make_bootable(etree.tostring(root), "/k", "/i", "/s", unplaced=unplaced)
    assert [s.alias for s in unplaced] == ["ua-gpu-gpu0"]
    assert all(s.alias != "ua-gpu-gpu0" for s in mapping.values())


@pytest.mark.skipif(not SCHEMA.exists(), reason="libvirt schemas not installed")
def test_bootable_domain_is_schema_valid():
    after, _, _ = _bootable()
    rng = etree.RelaxNG(etree.parse(str(SCHEMA)))
    assert rng.validate(after), rng.error_log


SERIAL = """\x1bc\x1b[?7l\x1b[2J@@PCITOPO-BEGIN 1\r
@@DEV 0000:00:00.0 /sys/devices/pci0000:00/0000:00:00.0\r
@@ATTR 0000:00:00.0 vendor 0x8086\r
@@ATTR 0000:00:00.0 device 0x29c0\r
@@ATTR 0000:00:00.0 class 0x060000\r
@@ATTR 0000:00:00.0 numa_node -1\r
@@ABSENT 0000:00:00.0 max_link_speed\r
@@DEV 0000:00:0b.0 /sys/devices/pci0000:00/0000:00:0b.0\r
@@ATTR 0000:00:0b.0 vendor 0x1b36\r
@@ATTR 0000:00:0b.0 device 0x000b\r
@@ATTR 0000:00:0b.0 class 0x060000\r
@@DEV 0000:20:00.0 /sys/devices/pci0000:20/0000:20:00.0\r
@@ATTR 0000:20:00.0 vendor 0x1b36\r
@@ATTR 0000:20:00.0 device 0x000c\r
@@ATTR 0000:20:00.0 class 0x060400\r
@@ATTR 0000:20:00.0 numa_node 0\r
@@ATTR 0000:20:00.0 max_link_speed 16.0 GT/s PCIe\r
@@ATTR 0000:20:00.0 max_link_width 16\r
[    2.0] some kernel noise\r
@@LINK 0000:20:00.0 driver ../../../bus/pci/drivers/pcieport\r
@@DEV 0000:21:00.0 /sys/devices/pci0000:20/0000:20:00.0/0000:21:00.0\r
@@ATTR 0000:21:00.0 vendor 0x1af4\r
@@ATTR 0000:21:00.0 device 0x1050\r
@@ATTR 0000:21:00.0 class 0x038000\r
@@ATTR 0000:21:00.0 numa_node 0\r
@@UNREADABLE 0000:21:00.0 current_link_speed\r
@@NODE 0 0\r
@@NODE 1 1\r
@@INFO kernel 6.1.0-57-cloud-amd64\r
@@LSPCI -+-[0000:00]-+-00.0  Intel [8086:29c0]\r
@@PCITOPO-END\r
[    3.0] reboot: Power down\r
"""

DOMAIN = b"""<domain type='qemu'><name>x</name><devices>
<controller type='pci' index='0' model='pcie-root'/>
<controller type='pci' index='1' model='pcie-expander-bus'><target busNr='32'><node>0</node></target>
  <address type='pci' bus='0x00' slot='0x0b' function='0x0'/></controller>
<controller type='pci' index='2' model='pcie-root-port'><address type='pci' bus='1' slot='0' function='0'/></controller>
<video><model type='virtio'/><address type='pci' bus='0x02' slot='0x00' function='0x0'/></video>
</devices></domain>"""


def test_parse_printout():
    p = parse_printout(SERIAL)
    assert sorted(p.functions) == ["0000:00:00.0", "0000:00:0b.0", "0000:20:00.0", "0000:21:00.0"]
    rp = p.functions["0000:20:00.0"]
    assert rp.attrs["max_link_speed"] == "16.0 GT/s PCIe"
    assert rp.links["driver"].endswith("/pcieport")
    assert p.functions["0000:00:00.0"].absent == {"max_link_speed"}
    assert p.functions["0000:21:00.0"].unreadable == {"current_link_speed"}
    assert p.nodes == {0: "0", 1: "1"}
    assert p.info["kernel"] == "6.1.0-57-cloud-amd64"
    assert p.functions["0000:21:00.0"].root == "pci0000:20"
    with pytest.raises(PrintoutError):
        parse_printout(SERIAL.split("@@PCITOPO-END")[0])


def test_sysfs_tree_is_read_by_the_project_reader(tmp_path):
    out = guest_sysfs_tree(parse_printout(SERIAL), tmp_path / "sys")
    link = out / "bus/pci/devices/0000:21:00.0"
    assert str(link.readlink()) == "../../../devices/pci0000:20/0000:20:00.0/0000:21:00.0"
    dev = out / "devices/pci0000:20/0000:20:00.0"
    assert (dev / "max_link_speed").read_text() == "16.0 GT/s PCIe\n"
    assert (out / "devices/pci0000:00/0000:00:00.0/numa_node").read_text() == "-1\n"
    assert not (out / "devices/pci0000:00/0000:00:00.0/max_link_speed").exists()
    assert (out / "devices/system/node/node1/cpulist").read_text() == "1\n"
    from pcitopo.host.sysfs import open_host
    from pcitopo.model.tree import Role

    topo = open_host(out)
    gpu = topo.function("0000:21:00.0")
    assert gpu.class_code == 0x038000 and gpu.numa_node == 0
    assert topo.role(topo.function("0000:20:00.0")) == Role.ROOT_PORT


def test_structural_mapping():
    p = parse_printout(SERIAL)
    from testkit.e2e.guesttree import StandIn

    s = StandIn("ua-gpu-a", "0000:18:00.0", "gpu", "video", "virtio")
    assert map_guest_bdfs(p, DOMAIN, {GuestAddr(2, 0, 0): s}) == {"0000:21:00.0": s}
    assert guest_bdf_of(p, DOMAIN, GuestAddr(1, 0, 0)) == "0000:20:00.0"
    assert guest_bdf_of(p, DOMAIN, GuestAddr(0, 0x0B, 0)) == "0000:00:0b.0"
    # a tree that came up under another root (busNr not honoured) does not match
    wrong = DOMAIN.replace(b"busNr='32'", b"busNr='48'")
    assert map_guest_bdfs(p, wrong, {GuestAddr(2, 0, 0): s}) == {}


@pytest.mark.parametrize("given,want", [
    (["-accel", "tcg"], ["-accel", "tcg,thread=single"]),
    (["-accel", "tcg,tb-size=64"], ["-accel", "tcg,tb-size=64,thread=single"]),
    (["-accel", "tcg,thread=multi"], ["-accel", "tcg,thread=multi"]),
    (["-accel", "kvm"], ["-accel", "kvm"]),
    (["-name", "tcg", "-append", "a b  c", "-accel", "tcg", "-S"],
     ["-name", "tcg", "-append", "a b  c", "-accel", "tcg,thread=single", "-S"]),
    ([], []),
])
def test_the_qemu_wrapper_puts_tcg_on_one_thread_and_keeps_every_other_argument(tmp_path, given, want):
    """guestboot.TCG_WRAPPER (every boot's emulator): ``thread=single`` on libvirt's ``-accel
    tcg``, nothing else touched (run with PCITOPO_QEMU naming a program that prints its argv)."""
    wrapper, show = tmp_path / "wrapper", tmp_path / "show"
    wrapper.write_text(TCG_WRAPPER)
    show.write_text('#!/bin/sh\nfor a; do printf "%s\\n" "$a"; done\n')
    for f in (wrapper, show):
        f.chmod(0o755)
    r = subprocess.run([str(wrapper), *given], capture_output=True, text=True, check=True,
                       env={**os.environ, "PCITOPO_QEMU": str(show)})
    assert r.stdout.splitlines() == want


def test_make_bootable_names_the_emulator_given():
    out, _ = make_bootable(_smoke(), "/k", "/i", "/s", emulator="/cache/qemu-wrapper")
    assert [e.text for e in etree.fromstring(out).iter("emulator")] == ["/cache/qemu-wrapper"]
