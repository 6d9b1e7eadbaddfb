"""Smoke test of the e2e machinery: boot a hand-written rewritten-style domain
(two expander buses on two guest NUMA cells, a switch with two downstream
ports, a root port with a multi-function device) under TCG and check the
guest's PCI tree, read through the project's own sysfs reader."""

from __future__ import annotations

from pathlib import Path

import pytest
from lxml import etree

from testkit.e2e.guestboot import GuestSilent, boot
from testkit.e2e.guesttree import GuestAddr, bus_overlaps

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

DATA = Path(__file__).parent / "data"


def smoke_domain(acpi: bool = True) -> bytes:
    xml = (DATA / "smoke-domain.xml").read_bytes()
    if acpi:
        return xml
    root = etree.fromstring(xml)
    feats = root.find("features")
    feats.remove(feats.find("acpi"))
    return etree.tostring(root)


def _boot(libvirtd, xml: bytes, label: str):
    r = boot(xml, libvirtd=libvirtd, timeout=120)
    t = r.timings
    print(
        f"\n[e2e] {label}: define {t['define']:.2f}s, start→end marker {t['run']:.2f}s, "
        f"total {t['total']:.2f}s, QEMU CPU {t.get('qemu_cpu', float('nan')):.2f}s "
        f"(guest firmware {r.firmware}; {libvirtd.versions().short()})"
    )
    return r


def _by_alias(r):
    return {s.alias: bdf for bdf, s in r.bdf_map.items()}


def test_switch_hierarchy_and_numa(libvirtd, tmp_path):
    r = _boot(libvirtd, smoke_domain(acpi=True), "acpi")
    p = r.printout
    bdf = _by_alias(r)
    # the stack's QEMU ran, with its TCG on one thread (guestboot.TCG_WRAPPER: no MTTCG races)
    argv = list(r.qemu_argv)
    assert argv and argv[0] == "/usr/bin/qemu-system-x86_64", argv[:1]
    assert argv[argv.index("-accel") + 1].startswith("tcg") and "thread=single" in argv[argv.index("-accel") + 1], argv

    # every stand-in showed up, at the address the planner gave its hostdev
    assert set(bdf) == {"ua-gpu-gpu0", "ua-sriov-ib0", "ua-gpu-gpu1", "ua-hostdevice-gpu1-audio"}
    assert r.mapping[GuestAddr(5, 0, 0)].source == "0000:18:00.0"
    assert r.mapping[GuestAddr(7, 0, 1)].source == "0000:9a:00.1"

    # expander-bus roots are named after busNr
    gpu0, ib0 = p.functions[bdf["ua-gpu-gpu0"]], p.functions[bdf["ua-sriov-ib0"]]
    gpu1, audio = p.functions[bdf["ua-gpu-gpu1"]], p.functions[bdf["ua-hostdevice-gpu1-audio"]]
    assert gpu0.root == ib0.root == "pci0000:20"
    assert gpu1.root == audio.root == "pci0000:80"
    # gpu0 and ib0 share root port and upstream port, differ in downstream port
    assert len(gpu0.hops) == len(ib0.hops) == 4
    assert gpu0.hops[:2] == ib0.hops[:2] and gpu0.hops[2] != ib0.hops[2]
    # gpu1 + audio: one slot, functions 0 and 1, right under the root port
    assert len(gpu1.hops) == 2 and gpu1.hops[0] == audio.hops[0]
    assert gpu1.bdf.endswith(".0") and audio.bdf.endswith(".1")
    assert gpu1.bdf[:-1] == audio.bdf[:-1]
    # stand-in classes: display / network / other
    assert gpu0.attrs["class"].startswith("0x03")
    assert ib0.attrs["class"].startswith("0x02")

    # NUMA: everything below an expander bus is on that bus's <node>
    for f in p.by_root("pci0000:20"):
        assert f.numa_node == 0, f
    for f in p.by_root("pci0000:80"):
        assert f.numa_node == 1, f
    assert p.nodes == {0: "0", 1: "1"}

    assert r.unmapped() == [] and bus_overlaps(p) == []

    # the guest booted the stack's own SeaBIOS (QEMU's default BIOS in that root)
    assert r.firmware.startswith(f"SeaBIOS {libvirtd.versions().seabios}"), r.firmware

    # the controller override survived make_bootable (x-width 16 on rp0)
    rp0 = p.functions[f"0000:{gpu0.hops[0].split(':', 1)[1]}"]
    assert rp0.attrs["max_link_width"] == "16"

    # the project's own reader sees the same tree
    tree = r.sysfs_tree(tmp_path / "sysfs")
    from pcitopo.host.sysfs import open_host
    from pcitopo.model.tree import Role

    topo = open_host(tree)
    g0 = topo.function(bdf["ua-gpu-gpu0"])
    roles = [topo.role(a) for a in topo.ancestry(g0)]
    assert roles == [Role.ROOT_PORT, Role.UPSTREAM_PORT, Role.DOWNSTREAM_PORT]
    assert topo.numa_of(g0) == 0
    assert topo.numa_of(topo.function(bdf["ua-gpu-gpu1"])) == 1
    assert topo.switch_of(topo.ancestry(g0)[2]) == topo.switch_of(
        topo.ancestry(topo.function(bdf["ua-sriov-ib0"]))[2]
    )
    assert sorted(topo.numa_nodes()) == [0, 1]


def test_without_acpi_numa_node_is_minus_one(libvirtd):
    r = _boot(libvirtd, smoke_domain(acpi=False), "no acpi")
    p = r.printout
    # the hierarchy is the same ...
    assert len(r.bdf_map) == 4
    assert {f.root for f in p.functions.values()} == {"pci0000:00", "pci0000:20", "pci0000:80"}
    # ... but no function knows its NUMA node
    assert {f.numa_node for f in p.functions.values()} == {-1}
    # (the guest still has both NUMA nodes: SeaBIOS writes its own SRAT
    # when QEMU provides no ACPI tables; only PCI proximity (_PXM) is gone)
    assert sorted(p.nodes) == [0, 1]


def test_overlapping_busnr_is_caught(libvirtd):
    """rc0's subtree needs buses 32..36 (root bus, root port, upstream port,
    two downstream ports); rc1 at 36 overlaps by one. libvirt defines and
    starts it; in the guest the switch's second downstream port loses its bus
    to rc1's root and ib0 disappears. The tier must notice."""
    root = etree.fromstring(smoke_domain())
    rc1 = root.xpath("devices/controller[alias/@name='ua-pcitopo-rc1']")[0]
    rc1.find("target").set("busNr", "36")
    r = _boot(libvirtd, etree.tostring(root), "overlapping busNr")
    assert [s.alias for s in r.unmapped()] == ["ua-sriov-ib0"]
    assert bus_overlaps(r.printout)


def test_a_silent_guest_is_retried_once_then_reported(libvirtd, capsys):
    """A guest that never writes to its serial port (here: a kernel whose console is the VGA
    screen, with no /init, that panics and waits: ``console=tty0 panic=0``) raises GuestSilent
    after ``silent_after`` (QEMU CPU seconds, or 1.75 times that of wall time), is booted once
    more, and the error carries the firmware's debug log, which says how far SeaBIOS got: the
    hang seen once in CI left only an empty serial log."""
    cmdline = "console=tty0 quiet panic=0 rdinit=/nonexistent root=/dev/nonexistent"
    with pytest.raises(GuestSilent) as e:
        boot(smoke_domain(), libvirtd=libvirtd, timeout=120, silent_after=6, cmdline=cmdline)
    assert "serial log empty after" in str(e.value), str(e.value)[:500]
    firmware = str(e.value).split("--- firmware debug log ---\n")[1].split("\n--- qemu log ---")[0]
    assert firmware.strip() and "not readable" not in firmware, str(e.value)[:2000]  # SeaBIOS's port 0x402
    assert "the firmware's last line" in e.value.reason and "no firmware output" not in e.value.reason
    out = capsys.readouterr().out
    assert out.count("guest silent") == 1, out  # one retry, printed with its reason
