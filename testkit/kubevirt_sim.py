"""What KubeVirt and libvirt do to a domain around our hook, written down so tests can do it too.

- :func:`kubevirt_domain`: a domain shaped exactly like KubeVirt's first ``OnDefineDomain`` call
  (tabs, double quotes, explicit end tags, ``xmlns:qemu`` on the root, kubevirt metadata,
  ``ua-gpu-…``/``ua-sriov-…`` hostdev aliases, guest NUMA cells and memnode maps as
  ``guestMappingPassthrough`` writes them).
- :func:`kubevirt_numa_preplace`: KubeVirt's ``PCINUMAAwareTopology`` placement (one
  pcie-expander-bus per guest cell, one root port per device, busNr counted down from 255).
- :func:`libvirt_define`: what libvirt adds at define (pcie-root, ``pci.N`` aliases, model names
  and chassis/port on ports, a root port on pcie-root and an address for every PCI device that
  has none, the primary video at 00:01.0, hostdev ``mode``/``<driver>`` and source addresses
  without ``type``).
- :func:`kubevirt_reparse`: KubeVirt's lossy re-parse between hook calls, per release
  (:mod:`testkit.kubevirt_releases`: which fields each release's Go struct has).
- :func:`hook_calls`: the 1–3 calls of one boot through one release's re-parse.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

from lxml import etree

from pcitopo.topology.libvirt.domain import ROOT_PORT, parse_cpuset, parse_int
from pcitopo.topology.model.tree import Bdf, Role, Topology

from .kubevirt_releases import Release, reparse
from .libvirt_sim import PORT_MODEL_NAMES, _sub, libvirt_define, to_kubevirt_bytes  # noqa: F401  (re-exported)

QEMU_NS = "http://libvirt.org/schemas/domain/qemu/1.0"
KUBEVIRT_NS = "http://kubevirt.io"


@dataclass(frozen=True)
class DomainSpec:
    name: str
    devices: tuple[Bdf, ...]
    guest_numa: bool = True  # guestMappingPassthrough: one cell per host node used
    vcpus_per_cell: int = 4
    acpi: bool = True
    namespace: str = "default"  # KubeVirt names the domain <namespace>_<name> (api.VMINamespaceKeyFunc)


def alias_for_hostdev(host: Topology, bdf: Bdf, n: int) -> str:
    role = host.role(host.function(bdf))
    if role == Role.GPU:
        return f"ua-gpu-gpu{n}"
    if role == Role.NIC:
        return f"ua-sriov-net{n}"
    return f"ua-hostdevice-dev{n}"


def kubevirt_domain(host: Topology, spec: DomainSpec) -> bytes:
    nsmap = {"qemu": QEMU_NS}
    root = etree.Element("domain", nsmap=nsmap)
    root.set("type", "kvm")
    _sub(root, "name", f"{spec.namespace}_{spec.name}")
    nodes = sorted({host.numa_of(host.function(b)) for b in spec.devices} - {-1}) or [0]
    cells = len(nodes) if spec.guest_numa else 1
    vcpus = spec.vcpus_per_cell * cells
    mem_per_cell = 4 * 1024**3
    _sub(root, "memory", str(mem_per_cell * cells), unit="b")
    os_el = _sub(root, "os")
    _sub(os_el, "type", "hvm", arch="x86_64", machine="pc-q35-rhel9.6.0")
    _sub(os_el, "smbios", mode="sysinfo")
    devices = _sub(root, "devices")
    iface = _sub(devices, "interface", type="ethernet")
    _sub(iface, "source")
    _sub(iface, "target", dev="tap0", managed="no")
    _sub(iface, "model", type="virtio-non-transitional")
    _sub(iface, "mac", address="02:00:00:aa:bb:cc")
    _sub(iface, "mtu", size="1500")
    _sub(iface, "alias", name="ua-default")
    _sub(iface, "rom", enabled="no")
    ch = _sub(devices, "channel", type="unix")
    _sub(ch, "target", name="org.qemu.guest_agent.0", type="virtio")
    _sub(devices, "controller", type="usb", index="0", model="none")
    scsi = _sub(devices, "controller", type="scsi", index="0", model="virtio-non-transitional")
    _sub(scsi, "driver", iothread="1")
    _sub(devices, "controller", type="virtio-serial", index="0", model="virtio-non-transitional")
    video = _sub(devices, "video")
    _sub(video, "model", type="vga", heads="1", vram="16384")
    graphics = _sub(devices, "graphics", type="vnc")
    _sub(graphics, "listen", type="socket", socket="/var/run/kubevirt-private/1234/virt-vnc")
    balloon = _sub(devices, "memballoon", model="virtio-non-transitional")
    _sub(balloon, "stats", period="10")
    disk = _sub(devices, "disk", device="disk", type="file", model="virtio-non-transitional")
    _sub(disk, "source", file="/var/run/kubevirt-private/vmi-disks/rootdisk/disk.img")
    _sub(disk, "target", bus="virtio", dev="vda")
    _sub(disk, "driver", cache="none", error_policy="stop", io="native", name="qemu", type="raw", discard="unmap")
    _sub(disk, "alias", name="ua-rootdisk")
    _hostdevs(devices, host, spec.devices)
    _sub(root, "clock", offset="utc")
    res = _sub(root, "resource")
    _sub(res, "partition", "/machine")
    feats = _sub(root, "features")
    if spec.acpi:
        _sub(feats, "acpi")
    _cpu_and_numa(root, host, spec, nodes, cells, mem_per_cell)
    mb = _sub(root, "memoryBacking")
    hp = _sub(mb, "hugepages")
    _sub(hp, "page", size="1048576", unit="KiB")
    _sub(root, "vcpu", str(vcpus), placement="static")
    _sub(root, "iothreads", "1")
    meta = _sub(root, "metadata")
    kv = etree.SubElement(meta, f"{{{KUBEVIRT_NS}}}kubevirt", nsmap={None: KUBEVIRT_NS})
    etree.SubElement(kv, f"{{{KUBEVIRT_NS}}}uid").text = "0b9f0d4e-6f39-4d0b-9c5e-2f1b9a0d7c11"
    gp = etree.SubElement(kv, f"{{{KUBEVIRT_NS}}}graceperiod")
    etree.SubElement(gp, f"{{{KUBEVIRT_NS}}}deletionGracePeriodSeconds").text = "30"
    return to_kubevirt_bytes(root)


def _hostdevs(devices: etree._Element, host: Topology, bdfs: tuple[Bdf, ...]) -> None:
    """One managed='no' PCI hostdev per device, aliased by role."""
    counters: dict[str, int] = {}
    for bdf in bdfs:
        role = host.role(host.function(bdf))
        key = role.value
        n = counters.get(key, 0)
        counters[key] = n + 1
        hd = _sub(devices, "hostdev", type="pci", managed="no")
        src = _sub(hd, "source")
        _sub(src, "address", type="pci", domain=f"0x{bdf.domain:04x}", bus=f"0x{bdf.bus:02x}",
             slot=f"0x{bdf.slot:02x}", function=f"0x{bdf.function:x}")
        _sub(hd, "alias", name=alias_for_hostdev(host, bdf, n))


def _cpu_and_numa(root: etree._Element, host: Topology, spec: DomainSpec, nodes: list[int], cells: int,
                  mem_per_cell: int) -> None:
    """``<cpu>`` with topology and cells, ``<numatune>`` and ``<cputune>`` as
    ``guestMappingPassthrough`` writes them."""
    cpu = _sub(root, "cpu", mode="host-passthrough")
    _sub(cpu, "topology", sockets=str(cells), cores=str(spec.vcpus_per_cell), threads="1")
    if spec.guest_numa:
        numa = _sub(cpu, "numa")
        for i in range(cells):
            lo = i * spec.vcpus_per_cell
            _sub(numa, "cell", id=str(i), cpus=f"{lo}-{lo + spec.vcpus_per_cell - 1}", memory=str(mem_per_cell), unit="b")
        tune = _sub(root, "numatune")
        _sub(tune, "memory", mode="strict", nodeset=",".join(str(n) for n in nodes))
        for i, node in enumerate(nodes):
            _sub(tune, "memnode", cellid=str(i), mode="strict", nodeset=str(node))
        cputune = _sub(root, "cputune")
        host_nodes = host.numa_nodes()
        for i, node in enumerate(nodes):
            cpus = sorted(parse_cpuset(host_nodes[node].cpulist or "")) if node in host_nodes else []
            for k in range(spec.vcpus_per_cell):
                pin = cpus[k + 2] if len(cpus) > k + 2 else k
                _sub(cputune, "vcpupin", vcpu=str(i * spec.vcpus_per_cell + k), cpuset=str(pin))


# KubeVirt's OVMF (spec.domain.firmware.bootloader.efi, secure boot off), as virt-launcher writes it:
# the code as v1.6-v1.8 pick it (v1.9 prefers OVMF_CODE.secboot.fd: Release.ovmf_code).
KUBEVIRT_OVMF_CODE = Release.V1_7.ovmf_code
KUBEVIRT_OVMF_VARS = "/usr/share/edk2/ovmf/OVMF_VARS.fd"


def with_efi(xml: bytes, code: str = KUBEVIRT_OVMF_CODE) -> bytes:
    """The same domain booting UEFI, as KubeVirt writes ``<os>`` for an EFI bootloader (issue 11:
    the firmware decides the MMIO settings)."""
    root = etree.fromstring(xml)
    os_el = root.find("os")
    if os_el.find("loader") is None:
        loader = etree.Element("loader", readonly="yes", secure="no", type="pflash")
        loader.text = code
        nvram = etree.Element("nvram", template=KUBEVIRT_OVMF_VARS)
        nvram.text = "/var/run/kubevirt-private/libvirt/qemu/nvram/default_VARS.fd"
        os_el.find("type").addnext(loader)
        loader.addnext(nvram)
    return to_kubevirt_bytes(root)


def kubevirt_numa_preplace(xml: bytes, host: Topology) -> bytes:
    """KubeVirt's PCINUMAAwareTopology: a pxb per guest cell, a root port per device, busNr
    counted down from 255. It groups by NUMA only, never by switch."""
    root = etree.fromstring(xml)
    devices = root.find("devices")
    cell_of_node = {int(m.get("nodeset")): int(m.get("cellid")) for m in root.findall("numatune/memnode")}
    by_cell: dict[int, list[etree._Element]] = {}
    for hd in devices.findall("hostdev"):
        a = hd.find("source/address")
        bdf = Bdf(parse_int(a.get("domain"), "d"), parse_int(a.get("bus"), "b"), parse_int(a.get("slot"), "s"),
                  parse_int(a.get("function"), "f"))
        cell = cell_of_node.get(host.numa_of(host.function(bdf)), 0)
        by_cell.setdefault(cell, []).append(hd)
    index = 1
    bus_nr = 255
    first = devices.find("hostdev")
    for slot_base, cell in enumerate(sorted(by_cell)):
        hds = by_cell[cell]
        bus_nr -= len(hds) + 1
        pxb = etree.Element("controller", type="pci", index=str(index), model="pcie-expander-bus")
        t = _sub(pxb, "target", busNr=str(bus_nr))
        _sub(t, "node", str(cell))
        _sub(pxb, "address", type="pci", domain="0x0000", bus="0x00", slot=f"0x{0x0a + slot_base:02x}", function="0x0")
        first.addprevious(pxb)
        pxb_index = index
        index += 1
        for n, hd in enumerate(hds):
            rp = etree.Element("controller", type="pci", index=str(index), model=ROOT_PORT)
            _sub(rp, "address", type="pci", domain="0x0000", bus=f"0x{pxb_index:02x}", slot=f"0x{n:02x}", function="0x0")
            first.addprevious(rp)
            old = hd.find("address")
            if old is not None:
                hd.remove(old)
            _sub(hd, "address", type="pci", domain="0x0000", bus=f"0x{index:02x}", slot="0x00", function="0x0")
            index += 1
    return to_kubevirt_bytes(root)


def kubevirt_reparse(xml: bytes, decimal_bus: bool = False, release: Release = Release.MAIN) -> bytes:
    """``xml`` read into ``release``'s ``api.DomainSpec`` and marshalled again, in KubeVirt's style."""
    return to_kubevirt_bytes(reparse(xml, release, decimal_bus))


def next_call_input(output: bytes, release: Release = Release.MAIN, decimal_bus: bool = False) -> bytes:
    """What the next ``OnDefineDomain`` call receives: a call's output after libvirt's define
    additions and ``release``'s re-parse."""
    return kubevirt_reparse(libvirt_define(output), decimal_bus=decimal_bus, release=release)


def hook_calls(xml: bytes, rewrite, calls: int = 3, decimal_bus: bool = False,
               release: Release = Release.MAIN) -> list[bytes]:
    """The 1–3 OnDefineDomain calls of one boot: each later call gets the previous output after
    libvirt's define additions and ``release``'s lossy re-parse; the last output is defined raw."""
    outputs = []
    current = xml
    for i in range(calls):
        out = rewrite(current)
        outputs.append(out)
        current = next_call_input(out, release, decimal_bus=decimal_bus and i % 2 == 0)
    return outputs


def gpus_and_nics(host: Topology, vfs: bool = False) -> list[Bdf]:
    out = []
    for f in host.functions():
        if host.role(f) in (Role.GPU, Role.NIC) and (vfs or not f.is_vf):
            out.append(f.bdf)
    return out


def canonical(xml: bytes) -> bytes:
    """Exclusive c14n: namespaces declared where they are used, so a root that lost an unused
    ``xmlns:qemu`` in KubeVirt's re-parse reads the same."""
    parser = etree.XMLParser(remove_blank_text=True)
    return etree.tostring(etree.fromstring(xml, parser), method="c14n", exclusive=True)


def _strip_mmio_owned(root: etree._Element) -> None:
    """issue 11: what the mmio and p2p-clique options own: <cpu><maxphysaddr>, the pdpe1gb
    feature, and the pref64-reserve / x-nv-gpudirect-clique properties in <qemu:override>;
    issue 19: what link and nccl-topo own: x-speed / x-width, and the fw_cfg NCCL entry (with a
    <sysinfo type='fwcfg'> left empty by it)."""
    from pcitopo.topology.guest.cliques import CLIQUE_PROPERTY
    from pcitopo.topology.guest.mmio import FEATURE_1G_PAGES, PREF64_RESERVE
    from pcitopo.topology.libvirt.links import X_SPEED, X_WIDTH
    from pcitopo.topology.paths.ncclxml import FWCFG_NAME

    for si in root.findall("sysinfo[@type='fwcfg']"):
        for e in si.findall(f"entry[@name='{FWCFG_NAME}']"):
            si.remove(e)
        if len(si) == 0:
            root.remove(si)

    for el in root.findall("cpu/maxphysaddr") + root.findall(f"cpu/feature[@name='{FEATURE_1G_PAGES}']"):
        el.getparent().remove(el)
    q = f"{{{QEMU_NS}}}"
    for ov in root.findall(f"{q}override"):
        for dev in ov.findall(f"{q}device"):
            for fe in dev.findall(f"{q}frontend"):
                for p in fe.findall(f"{q}property"):
                    if p.get("name") in (PREF64_RESERVE, CLIQUE_PROPERTY, X_SPEED, X_WIDTH):
                        fe.remove(p)
                if len(fe) == 0:
                    dev.remove(fe)
            if len(dev) == 0:
                ov.remove(dev)
        if len(ov) == 0:
            root.remove(ov)


def non_owned_elements(xml: bytes) -> list[bytes]:
    """Every top-level domain child and every device except PCI controllers and PCI hostdevs'
    addresses (and what the rewrite formats as libvirt does: a source address ``type``, an empty
    ``<driver>``, the default ``mode``), canonicalised: what the rewrite promises not to touch."""
    root = etree.fromstring(xml, etree.XMLParser(remove_blank_text=True))
    _strip_mmio_owned(root)
    out = []
    for el in root:
        if el.tag == "devices":
            continue
        out.append(etree.tostring(el, method="c14n", exclusive=True))
    for el in root.find("devices"):
        if el.tag == "controller" and el.get("type") == "pci":
            continue
        if el.tag == "hostdev" and el.get("type") == "pci":
            el = etree.fromstring(etree.tostring(el))
            for a in el.findall("address"):
                el.remove(a)
            src = el.find("source/address")
            if src is not None:
                src.attrib.pop("type", None)
            if el.get("mode") == "subsystem":  # libvirt's default, written out (issue 25)
                del el.attrib["mode"]
            for drv in el.findall("driver"):
                if not drv.attrib and len(drv) == 0:
                    el.remove(drv)
        out.append(etree.tostring(el, method="c14n", exclusive=True))
    return sorted(out)


def pick(host: Topology, bdfs: Iterable[Bdf], nodes: Sequence[int]) -> list[Bdf]:
    return [b for b in bdfs if host.numa_of(host.function(b)) in nodes]
