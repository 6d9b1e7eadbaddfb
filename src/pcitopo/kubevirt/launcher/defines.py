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

from collections.abc import Callable
from dataclasses import dataclass, field

from pcitopo.kubevirt.launcher.release_groups import Release
from pcitopo.kubevirt.launcher.reparse import reparse
from pcitopo.libvirt.define_sim import libvirt_define
from pcitopo.libvirt.device_elements import (
    address_of,
    append_ethernet_interface,
    append_pci_controller,
    device_elements,
    device_list,
    pci_controllers,
    take_devices,
    target_attr,
    target_of,
)
from pcitopo.libvirt.domain import ROOT_PORT, parse_int
from pcitopo.libvirt.machine import memory_bytes
from pcitopo.libvirt.marshal import Element, parse_plain, to_kubevirt_bytes

Hook = Callable[[bytes], bytes]
Define = Callable[[bytes], bytes]  # define, then the inactive XML libvirt reads back

MAX_PCI_BUS_INDEX = 31  # manager.go maxPCIBusIndex
# manager.go: hotplug{LargeMemory}{DefaultTotalPorts,MinRequiredFreePorts}, above 2 GiB.
LARGE_MEMORY = 2 * 1024**3
PORTS_LARGE, MIN_FREE_LARGE, PORTS_SMALL, MIN_FREE_SMALL = 16, 6, 8, 3
V1_SLOTS = 4  # calculateHotplugPortCountV1


def _address_type(el: Element) -> str | None:
    a = address_of(el)
    return None if a is None else a.get("type")


def pci_address_count(xml: bytes | Element) -> int:
    """converter/pci-placement.go CountPCIDevices: every device iteratePCIAddresses visits
    (interfaces, virtio disks, PCI hostdevs, every controller but pci-root, pcie-root and
    pcie-expander-bus (the usb one of model none too), inputs on virtio, watchdogs, rng,
    memballoon; the video is not among them), each without an address or with a PCI one."""
    root = parse_plain(xml) if isinstance(xml, bytes) else xml
    n = 0
    for d in device_list(root):
        if d.tag in ("interface", "watchdog", "rng", "memballoon"):
            n += 1
        elif d.tag == "hostdev":
            n += d.get("type") == "pci"
        elif d.tag == "disk":
            n += target_attr(d, "bus") == "virtio"
        elif d.tag == "controller":
            n += d.get("model") not in ("pci-root", "pcie-root", "pcie-expander-bus") and _address_type(d) in (None, "", "pci")
        elif d.tag == "input":
            n += d.get("bus") == "virtio"
    return n


def port_count_v2(xml: bytes) -> int:
    """manager.go calculateHotplugPortCountV2 (v1.6–v1.7's calculateHotplugPortCount)."""
    root = parse_plain(xml)
    total, least = (PORTS_LARGE, MIN_FREE_LARGE) if memory_bytes(root) > LARGE_MEMORY else (PORTS_SMALL, MIN_FREE_SMALL)
    return max(total - pci_address_count(root), least)


def port_count_v1(interfaces: int) -> int:
    """manager.go calculateHotplugPortCountV1 for a VMI with ``interfaces`` interfaces
    (``spec.domain.devices.interfaces``: SR-IOV ones count, though they become hostdevs)."""
    return 0 if interfaces == 0 else max(0, V1_SLOTS - interfaces)


def vmi_interfaces(vmi: dict) -> int:
    return len(vmi["spec"]["domain"].get("devices", {}).get("interfaces") or [])


def with_placeholders(xml: bytes, count: int) -> bytes:
    """nichotplug.go AppendPlaceholderInterfacesToTheDomain."""
    root = parse_plain(xml)
    for i in range(count):
        append_ethernet_interface(root, f"placeholder-{i}", "virtio-non-transitional", f"placeholder-{i}")
    return to_kubevirt_bytes(root)


def devices_from_readback(spec: bytes, readback: bytes) -> bytes:
    """nichotplug.go: the read-back's devices, its interfaces swapped for the spec's."""
    root = parse_plain(spec)
    take_devices(root, parse_plain(readback), "interface")
    return to_kubevirt_bytes(root)


def append_root_ports(xml: bytes, count: int) -> bytes:
    """manager.go appendPCIeRootPortControllers: bare root ports from the highest PCI controller
    index + 1, none above index 31."""
    root = parse_plain(xml)
    nxt = max((parse_int(c.get("index"), "index") for c in pci_controllers(root)), default=0) + 1
    for i in range(count):
        if nxt + i > MAX_PCI_BUS_INDEX:
            break
        append_pci_controller(root, nxt + i, ROOT_PORT)
    return to_kubevirt_bytes(root)


def disable_hotplug_on_occupied(xml: bytes) -> bytes:
    """main's pci/hotplug.go DisableHotplugOnOccupiedRootPorts: ``hotplug='off'`` on root ports
    whose ``target busNr`` is the bus of a device other than an interface. libvirt writes no
    busNr on root ports, so on a real read-back this marks none."""
    root = parse_plain(xml)
    buses = set()
    for el in device_list(root):
        if el.tag in ("interface", "controller"):
            continue
        address = address_of(el)
        if address is not None and address.get("type") == "pci":
            buses.add(parse_int(address.get("bus"), "bus"))
    for c in pci_controllers(root):
        if c.get("model") not in (ROOT_PORT, "pcie-root", "pci-root", "pcie-expander-bus"):
            a = address_of(c)
            if a is not None:
                buses.add(parse_int(a.get("bus"), "bus"))
    for c in device_elements(root, "controller"):
        t = target_of(c) if c.get("model") == ROOT_PORT else None
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
        n = len(device_elements(parse_plain(spec), "interface")) if interfaces is None else interfaces
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
