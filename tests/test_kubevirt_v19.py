"""The simulation sends what KubeVirt v1.9.0 sends (item 1), the hotplug ports a VM
ends with (item 2), DRA and SR-IOV aliases (item 4). testkit/kubevirt_converter.py,
testkit/kubevirt_define.py, bench/hotplug.py; docs/SOURCES.md names the KubeVirt files."""

from __future__ import annotations

import os

import pytest
from lxml import etree

from pcitopo.guest.rewrite import rewrite_domain
from pcitopo.kubevirt.launcher.converter import UPSTREAM_MACHINE
from pcitopo.kubevirt.launcher.defines import (
    append_root_ports,
    boot_defines,
    pci_address_count as port_count_v2_devices,
    port_count_v2,
    vmi_interfaces,
)
from pcitopo.kubevirt.launcher.release_groups import Release
from pcitopo.kubevirt.launcher.skeleton import RHEL_MACHINE
from pcitopo.libvirt.domain import DomainView
from pcitopo.model.tree import Role
from pcitopo.serve.core import handle_define_domain
from pcitopo.synth import host_from_topo
from pcitopo.views.explain import explain_text
from testkit import REPO
from testkit.hookkit import placement
from testkit.kubevirt_define import (
    RealLibvirt,
    free_hotplug_ports,
    real_libvirt_available,
)
from testkit.kubevirt_sim import DomainSpec, kubevirt_domain
from testkit.kubevirt_vmi import deploy_examples, domain_for_vmi

EXAMPLES = {name: (host, vmi, gpus) for name, host, vmi, gpus in deploy_examples(REPO)}
NAMES = sorted(EXAMPLES)
MACHINES = (UPSTREAM_MACHINE, RHEL_MACHINE)


def _first(name: str, release: Release = Release.V1_9, machine: str = UPSTREAM_MACHINE) -> etree._Element:
    host, vmi, gpus = EXAMPLES[name]
    return etree.fromstring(domain_for_vmi(host, vmi, gpus, release=release, machine=machine))


def test_every_example_is_simulated():
    assert set(NAMES) == {"vm-gpu.yaml", "vmi-gpu.yaml", "vm-pairs.yaml", "nvlink-fabric.yaml"}


def test_vm_gpu_rows_as_v1_9_sends_them():
    root = _first("vm-gpu.yaml")
    assert root.findtext("vcpu") == "168"  # the manifest's maxSockets 2, 42 cores, 2 threads: no hotplug room
    vcpus = root.findall("vcpus/vcpu")
    assert len(vcpus) == 168 and sum(v.get("enabled") == "yes" for v in vcpus) == 168
    assert dict(root.find("cpu/topology").attrib) == {"sockets": "2", "cores": "42", "threads": "2"}
    assert root.findtext("os/loader").endswith("/OVMF_CODE.secboot.fd") and root.find("os/loader").get("secure") == "no"
    assert root.find("os/type").get("machine") == "q35"
    assert root.find("cputune/emulatorpin") is not None
    pages = root.findall("memoryBacking/hugepages/page")
    assert [p.get("nodeset") for p in pages] == [c.get("id") for c in root.findall("cpu/numa/cell")]
    assert {(p.get("size"), p.get("unit")) for p in pages} == {(str(2**30), "b")}
    assert root.find("memoryBacking/source").get("type") == "memfd"
    assert root.find("memoryBacking/allocation").get("mode") == "immediate"
    aliases = [hd.findtext("alias") or hd.find("alias").get("name") for hd in root.findall("devices/hostdev")]
    assert aliases == [f"ua-gpu-gpu{i}" for i in range(8)] + [f"ua-sriov-ib{i}" for i in range(8)]


def test_older_release_keeps_the_plain_ovmf_code():
    assert _first("vm-gpu.yaml", Release.V1_7).findtext("os/loader").endswith("/OVMF_CODE.fd")


def test_cloud_init_virtio_disk_is_a_second_disk():
    disks = _first("vmi-gpu.yaml").findall("devices/disk")
    assert [d.find("target").get("dev") for d in disks] == ["vda", "vdb"]
    assert [d.find("alias").get("name") for d in disks] == ["ua-rootdisk", "ua-cloudinit"]
    # vm-gpu carries a cloud-init disk too too, on virtio as well
    vm_disks = _first("vm-gpu.yaml").findall("devices/disk")
    assert [(d.find("target").get("dev"), d.find("target").get("bus")) for d in vm_disks] == [("vda", "virtio"), ("vdb", "virtio")]


def test_dra_hostdevs_come_from_kep_5304_metadata():
    root = _first("vm-pairs.yaml")
    aliases = [hd.find("alias").get("name") for hd in root.findall("devices/hostdev")]
    # host devices before GPUs: compute/host_device.go NewHostDeviceDomainConfigurator(generic, GPUs, SR-IOV)
    assert aliases == ["ua-dra-hostdevice-nic0", "ua-dra-hostdevice-nic1", "ua-dra-gpu-gpu0", "ua-dra-gpu-gpu1"]


def _by_source(xml: bytes) -> dict:
    out = {}
    for hd in etree.fromstring(xml).findall("devices/hostdev"):
        src, a = hd.find("source/address"), hd.find("address")
        out[tuple(int(src.get(k), 16) for k in ("bus", "slot", "function"))] = (
            None if a is None else tuple(int(a.get(k), 16) for k in ("bus", "slot", "function")))
    return out


@pytest.mark.parametrize("machine", MACHINES)
@pytest.mark.parametrize("name", NAMES)
def test_placement_is_the_same_whatever_the_aliases(name, machine):
    """Item 4: devices are matched by source address, never by alias: the same domain with
    every hostdev renamed places every device at the same guest address."""
    host = EXAMPLES[name][0]
    root = _first(name, machine=machine)
    real = rewrite_domain(etree.tostring(root), host)
    for n, hd in enumerate(root.findall("devices/hostdev")):
        hd.find("alias").set("name", f"ua-hostdevice-other{n}")
    renamed = rewrite_domain(etree.tostring(root), host)
    assert _by_source(real.xml) == _by_source(renamed.xml)
    assert all(a is not None for a in _by_source(real.xml).values())


def test_explain_works_unchanged_with_dra_and_sriov_aliases():
    """Item 4: --explain labels devices by host address; ua-dra-* and ua-sriov-<iface> aliases
    give the very text other aliases give, every pair as on the host."""
    for name in ("vm-pairs.yaml", "vm-gpu.yaml"):
        host = EXAMPLES[name][0]
        root = _first(name)
        text = explain_text(rewrite_domain(etree.tostring(root), host), host)
        for n, hd in enumerate(root.findall("devices/hostdev")):
            hd.find("alias").set("name", f"ua-hostdevice-other{n}")
        assert explain_text(rewrite_domain(etree.tostring(root), host), host) == text
        assert text.splitlines()[0].startswith("Verdict: NCCL: ") and "as on the host" in text.splitlines()[0]


@pytest.mark.parametrize("release", [Release.V1_9, Release.MAIN], ids=lambda r: r.value)
@pytest.mark.parametrize("name", NAMES)
def test_placement_identical_through_every_define(name, release):
    """The hook's placement does not move between the defines of a boot (simulated libvirt)."""
    host, vmi, gpus = EXAMPLES[name]
    first = domain_for_vmi(host, vmi, gpus, release=release)
    boot = boot_defines(first, lambda x: rewrite_domain(x, host).xml, release, interfaces=vmi_interfaces(vmi))
    hds = [placement(out)["hostdevs"] for out in boot.hook_outputs]
    assert all(h == hds[0] for h in hds) and all(a is not None for a in hds[0].values())


def test_append_stops_at_index_31():
    xml = b"<domain><memory unit='b'>1</memory><devices><controller type='pci' index='29' model='pcie-root-port'/></devices></domain>"
    root = etree.fromstring(append_root_ports(xml, 6))
    assert [c.get("index") for c in root.findall("devices/controller")] == ["29", "30", "31"]
    assert free_hotplug_ports(etree.tostring(root)) == 3


@pytest.fixture(scope="module")
def real_define():
    if not real_libvirt_available():
        pytest.skip("libvirt is not installed (scripts/setup-debian.sh)")
    os.environ.setdefault("PCITOPO_CACHE", str(REPO / ".cache" / "e2e"))
    from testkit.e2e.libvirtd import PrivateLibvirtd
    from testkit.stack import DEBIAN12

    with PrivateLibvirtd(stack=DEBIAN12) as daemon:
        yield RealLibvirt(daemon)


def test_hotplug_no_example_ends_with_fewer_free_ports_than_without_pcitopo(real_define):
    from bench.hotplug import measure

    lost = [(name, r.value, plain - hooked) for name, r, hooked, plain in measure(real_define) if hooked < plain]
    assert lost == []


# -- item 2: the hotplug ports pcitopo leaves -------------------------------------------------------

def _hotplug(xml: bytes, host):
    return rewrite_domain(xml, host).report.hotplug


@pytest.mark.parametrize("release", [Release.V1_9, Release.MAIN], ids=lambda r: r.value)
@pytest.mark.parametrize("name", NAMES)
def test_hotplug_wanted_is_kubevirts_count_plus_libvirts_spare_on_every_call(name, release):
    """The planner's reading of KubeVirt's calculateHotplugPortCountV2 agrees with the
    simulation's (written separately, from the Go source) on every call of a boot: placeholders,
    the ports and the SATA controller libvirt adds are not KubeVirt's devices."""
    host, vmi, gpus = EXAMPLES[name]
    first = domain_for_vmi(host, vmi, gpus, release=release)
    boot = boot_defines(first, lambda x: rewrite_domain(x, host).xml, release, interfaces=vmi_interfaces(vmi))
    want = port_count_v2(first) + 1
    assert [_hotplug(x, host).wanted for x in boot.hook_inputs] == [want] * len(boot.hook_inputs)
    assert [_hotplug(x, host).kept for x in boot.hook_inputs] == [want] * len(boot.hook_inputs)


def test_hotplug_placeholders_sata_and_pci_controllers_are_not_counted():
    root = _first("vm-pairs.yaml")
    base = DomainView(etree.ElementTree(root)).kubevirt_pci_devices()
    devices = root.find("devices")
    etree.SubElement(devices, "controller", type="sata", index="0")
    etree.SubElement(devices, "controller", type="pci", index="1", model="pcie-root-port")
    ph = etree.SubElement(devices, "interface", type="ethernet")
    etree.SubElement(ph, "alias", name="placeholder-0")
    assert DomainView(etree.ElementTree(root)).kubevirt_pci_devices() == base
    # the usb controller of model none is one of KubeVirt's (iteratePCIAddresses visits every controller)
    assert base == port_count_v2_devices(etree.tostring(_first("vm-pairs.yaml")))


def test_hotplug_every_address_names_a_controller_through_real_defines(real_define):
    """Devices libvirt put in pcitopo's bare root ports keep them on later calls (their index
    stays), on v1.9 and main, with and without placeholders; every call leaves the same count."""
    for name in NAMES:
        host, vmi, gpus = EXAMPLES[name]
        for release in (Release.V1_9, Release.MAIN):
            first = domain_for_vmi(host, vmi, gpus, release=release)
            boot = boot_defines(first, lambda x: rewrite_domain(x, host).xml, release, real_define, vmi_interfaces(vmi))
            for out in boot.hook_outputs:
                root = etree.fromstring(out)
                indexes = {int(c.get("index")) for c in root.iter("controller") if c.get("type") == "pci"}
                buses = {int(a.get("bus"), 0) for a in root.iter("address")
                         if a.get("type") == "pci" and a.getparent().tag != "source"}
                assert buses <= indexes, (name, release.value, sorted(buses - indexes))
            assert len({(h.wanted, h.kept) for h in (_hotplug(x, host) for x in boot.hook_inputs)}) == 1
            assert free_hotplug_ports(boot.last) >= _hotplug(boot.hook_inputs[0], host).wanted, (name, release.value)


def _tight_host():
    """22 root complexes of one switch with 8 NICs each: 242 of the 256 buses for the tree."""
    lines = ["numa 0 cpus=0-3"]
    for i in range(22):
        dom, b = divmod(i, 18)
        b = 0x10 + b * 12
        lines += [f"rc {dom:04x}:{b:02x} numa=0", f"  rp {b:02x}:01.0 preset=intel-rp", f"    us {b+1:02x}:00.0 preset=pex-gen5-oem"]
        lines += [x for s in range(8) for x in (f"      ds {b+2:02x}:{s:02x}.0", f"        ep {b+3+s:02x}:00.0 preset=cx7-eth")]
    return host_from_topo("\n".join(lines))


def test_hotplug_ports_lost_are_in_the_log_line_and_explain():
    """When the mirrored tree leaves too few bus numbers, the hook's log fields and --explain
    say how many hotplug ports the VM lost."""
    host = _tight_host()
    nics = tuple(f.bdf for f in host.functions() if host.role(f) == Role.NIC)
    xml = kubevirt_domain(host, DomainSpec("big", nics))
    outcome = handle_define_domain(xml, None, host)
    assert (outcome.summary["hotplug_ports"], outcome.summary["hotplug_ports_lost"]) == (3, 4)
    text = explain_text(outcome.result, host)
    assert "Hotplug: 3 free root port(s)" in text and "the VM lost 4" in " ".join(text.split())
    ok = handle_define_domain(etree.tostring(_first("vm-gpu.yaml")), None, EXAMPLES["vm-gpu.yaml"][0])
    assert (ok.summary["hotplug_ports"], ok.summary["hotplug_ports_lost"]) == (7, 0)
