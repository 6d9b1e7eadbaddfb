"""The defines of one boot, as virt-launcher's ``allocateHotplugPorts`` runs them
(``pkg/virt-launcher/virtwrap/manager.go``, ``network/nichotplug.go``, main's ``pci/hotplug.go``;
per release :attr:`.releases.Release.hotplug_ports`), with the hook called before each define
and libvirt's own placement (``virsh define`` + ``dumpxml --inactive``, or the simulation
:func:`.libvirt_sim.libvirt_define`) between them; ``pcitopo domain --call N`` prints the Nth
hook input:

- v1.8–v1.9 (``append``): placeholders ``placeholder-0..N-1``, N = max(0, 4 − interfaces)
  (``calculateHotplugPortCountV1``; none without interfaces). With placeholders: define 1 with
  them, read back, the devices of the read-back (interfaces as the spec had them) go into
  define 2. Then, when ``calculateHotplugPortCountV2`` − N > 0, root ports are appended from the
  highest PCI controller index + 1, never above 31 (``appendPCIeRootPortControllers``), into
  one more define. The spec an append works on is the last hook output as KubeVirt re-parsed it
  (``util.ApplySidecarHooks`` copies it into the spec), so without placeholders nothing libvirt
  placed is in it.
- main (``readback``): the same, but the last define is always read back before the append,
  and ``DisableHotplugOnOccupiedRootPorts`` sets ``hotplug='off'`` on root ports whose
  ``target busNr`` holds a device other than an interface.
- v1.6–v1.7 (``placeholders``): max(16 − PCI devices, 6) placeholders (``calculateHotplugPortCount``),
  no append.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from lxml import etree

from pcitopo.libvirt.domain import ROOT_PORT, parse_int

from pcitopo.kubevirt.launcher.libvirt_sim import libvirt_define
from pcitopo.kubevirt.launcher.release_groups import Release
from pcitopo.kubevirt.launcher.reparse import reparse
from pcitopo.kubevirt.launcher.xmlstyle import to_kubevirt_bytes

Hook = Callable[[bytes], bytes]
Define = Callable[[bytes], bytes]  # define, then the inactive XML libvirt reads back

MAX_PCI_BUS_INDEX = 31  # manager.go maxPCIBusIndex
# manager.go: hotplug{LargeMemory}{DefaultTotalPorts,MinRequiredFreePorts}, above 2 GiB.
LARGE_MEMORY = 2 * 1024**3
PORTS_LARGE, MIN_FREE_LARGE, PORTS_SMALL, MIN_FREE_SMALL = 16, 6, 8, 3
V1_SLOTS = 4  # calculateHotplugPortCountV1


def pci_address_count(xml: bytes | etree._Element) -> int:
    """converter/pci-placement.go CountPCIDevices: every device iteratePCIAddresses visits
    (interfaces, virtio disks, PCI hostdevs, every controller but pci-root, pcie-root and
    pcie-expander-bus (the usb one of model none too), inputs on virtio, watchdogs, rng,
    memballoon; the video is not among them), each without an address or with a PCI one."""
    root = etree.fromstring(xml) if isinstance(xml, bytes) else xml
    devices = root.find("devices")
    n = len(devices.findall("interface")) + len(devices.findall("hostdev[@type='pci']"))
    n += sum(1 for d in devices.findall("disk") if d.find("target") is not None and d.find("target").get("bus") == "virtio")
    n += sum(1 for c in devices.findall("controller") if c.get("model") not in ("pci-root", "pcie-root", "pcie-expander-bus")
             and (c.find("address") is None or c.find("address").get("type") in (None, "", "pci")))
    n += sum(1 for i in devices.findall("input") if i.get("bus") == "virtio")
    n += len(devices.findall("watchdog")) + len(devices.findall("rng")) + len(devices.findall("memballoon"))
    return n


def _memory_bytes(root: etree._Element) -> int:
    mem = root.find("memory")
    unit = {"b": 1, "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3}[mem.get("unit", "KiB")]
    return int(mem.text) * unit


def port_count_v2(xml: bytes) -> int:
    """manager.go calculateHotplugPortCountV2 (v1.6–v1.7's calculateHotplugPortCount)."""
    root = etree.fromstring(xml)
    total, least = (PORTS_LARGE, MIN_FREE_LARGE) if _memory_bytes(root) > LARGE_MEMORY else (PORTS_SMALL, MIN_FREE_SMALL)
    return max(total - pci_address_count(root), least)


def port_count_v1(interfaces: int) -> int:
    """manager.go calculateHotplugPortCountV1 for a VMI with ``interfaces`` interfaces
    (``spec.domain.devices.interfaces``: SR-IOV ones count, though they become hostdevs)."""
    return 0 if interfaces == 0 else max(0, V1_SLOTS - interfaces)


def vmi_interfaces(vmi: dict) -> int:
    return len(vmi["spec"]["domain"].get("devices", {}).get("interfaces") or [])


def with_placeholders(xml: bytes, count: int) -> bytes:
    """nichotplug.go AppendPlaceholderInterfacesToTheDomain."""
    root = etree.fromstring(xml)
    devices = root.find("devices")
    for i in range(count):
        iface = etree.SubElement(devices, "interface", type="ethernet")
        etree.SubElement(iface, "target", dev=f"placeholder-{i}", managed="no")
        etree.SubElement(iface, "model", type="virtio-non-transitional")
        etree.SubElement(iface, "alias", name=f"placeholder-{i}")
    return to_kubevirt_bytes(root)


def devices_from_readback(spec: bytes, readback: bytes) -> bytes:
    """nichotplug.go: the read-back's devices, its interfaces swapped for the spec's."""
    root, back = etree.fromstring(spec), etree.fromstring(readback)
    devices = back.find("devices")
    for iface in devices.findall("interface"):
        devices.remove(iface)
    for iface in root.find("devices").findall("interface"):
        devices.append(iface)
    root.replace(root.find("devices"), devices)
    return to_kubevirt_bytes(root)


def append_root_ports(xml: bytes, count: int) -> bytes:
    """manager.go appendPCIeRootPortControllers: bare root ports from the highest PCI controller
    index + 1, none above index 31."""
    root = etree.fromstring(xml)
    devices = root.find("devices")
    pci = [c for c in devices.findall("controller") if c.get("type") == "pci"]
    nxt = max((parse_int(c.get("index"), "index") for c in pci), default=0) + 1
    for i in range(count):
        if nxt + i > MAX_PCI_BUS_INDEX:
            break
        devices.append(etree.Element("controller", type="pci", index=str(nxt + i), model=ROOT_PORT))
    return to_kubevirt_bytes(root)


def disable_hotplug_on_occupied(xml: bytes) -> bytes:
    """main's pci/hotplug.go DisableHotplugOnOccupiedRootPorts: ``hotplug='off'`` on root ports
    whose ``target busNr`` is the bus of a device other than an interface. libvirt writes no
    busNr on root ports, so on a real read-back this marks none."""
    root = etree.fromstring(xml)
    devices = root.find("devices")
    buses = set()
    for el in devices:
        if el.tag in ("interface", "controller") or not isinstance(el.tag, str):
            continue
        a = el.find("address")
        if a is not None and a.get("type") == "pci":
            buses.add(parse_int(a.get("bus"), "bus"))
    for c in devices.findall("controller"):
        if c.get("type") == "pci" and c.get("model") not in (ROOT_PORT, "pcie-root", "pci-root", "pcie-expander-bus"):
            a = c.find("address")
            if a is not None:
                buses.add(parse_int(a.get("bus"), "bus"))
    for c in devices.findall(f"controller[@model='{ROOT_PORT}']"):
        t = c.find("target")
        if t is not None and t.get("busNr") is not None and int(t.get("busNr")) in buses:
            t.set("hotplug", "off")
    return to_kubevirt_bytes(root)


@dataclass
class Boot:
    """What one boot's sequence saw: each hook input and output, each read-back."""

    hook_inputs: list[bytes] = field(default_factory=list)
    hook_outputs: list[bytes] = field(default_factory=list)
    readbacks: list[bytes] = field(default_factory=list)

    @property
    def last(self) -> bytes:
        return self.readbacks[-1]


def _define(boot: Boot, spec: bytes, hook: Hook, define: Define, release: Release) -> bytes:
    """SetDomainSpecStrWithHooks: the hook, then libvirt; returns the spec as KubeVirt keeps it
    (the hook's output re-parsed into api.DomainSpec). The hook gets the spec as KubeVirt's struct
    marshals it (``pkg/hooks/manager.go``): a read-back's devices re-parsed too
    (``util.GetDomainSpecWithFlags`` reads libvirt's XML into the struct)."""
    spec = to_kubevirt_bytes(reparse(spec, release))
    boot.hook_inputs.append(spec)
    out = hook(spec)
    boot.hook_outputs.append(out)
    boot.readbacks.append(define(out))
    return to_kubevirt_bytes(reparse(out, release))


def boot_defines(first: bytes, hook: Hook, release: Release, define: Define = libvirt_define,
                 interfaces: int | None = None) -> Boot:
    """Every define of one boot (``allocateHotplugPorts``) for the first hook input ``first`` of
    a VMI with ``interfaces`` interfaces (default: the domain's ``<interface>`` count)."""
    boot = Boot()
    spec = to_kubevirt_bytes(reparse(first, release))
    if release.hotplug_ports == "placeholders":
        count = port_count_v2(spec)
        placeholders, extra = count, 0
    else:
        n = len(etree.fromstring(spec).findall("devices/interface")) if interfaces is None else interfaces
        placeholders = port_count_v1(n)
        extra = max(0, port_count_v2(spec) - placeholders)
    if placeholders:
        _define(boot, with_placeholders(spec, placeholders), hook, define, release)
        spec = devices_from_readback(spec, boot.last)
    spec = _define(boot, spec, hook, define, release)
    if release.hotplug_ports == "placeholders":
        return boot
    if release.hotplug_ports == "readback":
        if not placeholders:
            spec = devices_from_readback(spec, boot.last)
        spec = disable_hotplug_on_occupied(append_root_ports(spec, extra))
        _define(boot, spec, hook, define, release)
    elif extra:
        _define(boot, append_root_ports(spec, extra), hook, define, release)
    return boot
