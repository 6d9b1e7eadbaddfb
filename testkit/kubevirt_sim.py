"""What KubeVirt and libvirt do to a domain around our hook, written down so tests can do it too
(the first call's shape is the product's, :mod:`pcitopo.kubevirt.launcher.skeleton`; this is
test scaffolding around it).

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
  (:mod:`pcitopo.kubevirt.launcher.reparse`: which fields each release's Go struct has).
- :func:`hook_calls`: the 1–3 calls of one boot through one release's re-parse.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from lxml import etree

from pcitopo.kubevirt.launcher.release_groups import Release
from pcitopo.kubevirt.launcher.reparse import reparse
from pcitopo.kubevirt.launcher.skeleton import OVMF_VARS, GuestCell, Hostdev, LauncherSpec, launcher_domain, with_efi as launcher_efi
from pcitopo.libvirt.define_sim import libvirt_define
from pcitopo.libvirt.domain import ROOT_PORT, Q, parse_cpuset, parse_int
from pcitopo.libvirt.marshal import sub as _sub, to_kubevirt_bytes
from pcitopo.model.tree import Bdf, Role, Topology


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


def _hostdevs(host: Topology, bdfs: tuple[Bdf, ...]) -> tuple[Hostdev, ...]:
    """One hostdev per device, aliased by role and counted per role."""
    counters: dict[str, int] = {}
    out = []
    for bdf in bdfs:
        key = host.role(host.function(bdf)).value
        n = counters.get(key, 0)
        counters[key] = n + 1
        out.append(Hostdev(bdf, alias_for_hostdev(host, bdf, n)))
    return tuple(out)


def _cells(host: Topology, spec: DomainSpec) -> tuple[GuestCell, ...]:
    """A cell per host node of the devices, each vCPU pinned past the node's first two CPUs (a
    made-up placement: tests that need kubelet's use the product's, pcitopo.kubevirt.launcher.cpus)."""
    if not spec.guest_numa:
        return ()
    nodes = sorted({host.numa_of(host.function(b)) for b in spec.devices} - {-1}) or [0]
    host_nodes = host.numa_nodes()
    out = []
    for node in nodes:
        cpus = sorted(parse_cpuset(host_nodes[node].cpulist or "")) if node in host_nodes else []
        out.append(GuestCell(node, tuple(cpus[k + 2] if len(cpus) > k + 2 else k for k in range(spec.vcpus_per_cell))))
    return tuple(out)


def kubevirt_domain(host: Topology, spec: DomainSpec) -> bytes:
    """KubeVirt's first-call shape (the product's :func:`launcher_domain`) for ``spec``'s devices."""
    return launcher_domain(LauncherSpec(spec.name, _hostdevs(host, spec.devices), _cells(host, spec),
                                        vcpus=spec.vcpus_per_cell, acpi=spec.acpi, namespace=spec.namespace))


# KubeVirt's OVMF (spec.domain.firmware.bootloader.efi, secure boot off), as virt-launcher writes it:
# the code as v1.6-v1.8 pick it (v1.9 prefers OVMF_CODE.secboot.fd: Release.ovmf_code).
KUBEVIRT_OVMF_CODE = Release.V1_7.ovmf_code
KUBEVIRT_OVMF_VARS = OVMF_VARS


def with_efi(xml: bytes, code: str = KUBEVIRT_OVMF_CODE) -> bytes:
    """The same domain booting UEFI, as KubeVirt writes ``<os>`` for an EFI bootloader
    (the firmware decides the MMIO settings)."""
    return launcher_efi(xml, code)


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
    """What the mmio and p2p-clique options own: <cpu><maxphysaddr>, the pdpe1gb
    feature, and the pref64-reserve / x-nv-gpudirect-clique properties in <qemu:override>;
    What link and nccl-topo own: x-speed / x-width, and the fw_cfg NCCL entry (with a
    <sysinfo type='fwcfg'> left empty by it)."""
    from pcitopo.guest.cliques import CLIQUE_PROPERTY
    from pcitopo.guest.mmio import FEATURE_1G_PAGES, PREF64_RESERVE
    from pcitopo.libvirt.links import X_SPEED, X_WIDTH
    from pcitopo.nccl.topoxml import FWCFG_NAME

    for si in root.findall("sysinfo[@type='fwcfg']"):
        for e in si.findall(f"entry[@name='{FWCFG_NAME}']"):
            si.remove(e)
        if len(si) == 0:
            root.remove(si)

    for el in root.findall("cpu/maxphysaddr") + root.findall(f"cpu/feature[@name='{FEATURE_1G_PAGES}']"):
        el.getparent().remove(el)
    for ov in root.findall(f"{Q}override"):
        for dev in ov.findall(f"{Q}device"):
            for fe in dev.findall(f"{Q}frontend"):
                for p in fe.findall(f"{Q}property"):
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
            if el.get("mode") == "subsystem":  # libvirt's default, written out
                del el.attrib["mode"]
            for drv in el.findall("driver"):
                if not drv.attrib and len(drv) == 0:
                    el.remove(drv)
        out.append(etree.tostring(el, method="c14n", exclusive=True))
    return sorted(out)


def pick(host: Topology, bdfs: Iterable[Bdf], nodes: Sequence[int]) -> list[Bdf]:
    return [b for b in bdfs if host.numa_of(host.function(b)) in nodes]
