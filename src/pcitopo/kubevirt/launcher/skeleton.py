"""The shape of KubeVirt's first ``OnDefineDomain`` input: what every VMI's domain holds before the
manifest's own settings (:mod:`.converter`) are applied.

``pkg/virt-launcher/virtwrap/converter/converter.go`` ``Convert_v1_VirtualMachineInstance_To_api_Domain``
writes, for a q35 VMI with a pod network, a root disk and a cloud-init disk: the ``<namespace>_<name>``
domain name (``api.VMINamespaceKeyFunc``), the masquerade interface (``ua-default``), the guest
agent channel, the usb (model none), scsi and virtio-serial controllers, VGA video with VNC on a
socket, the balloon, the virtio root disk (``ua-<disk name>``), one ``managed='no'`` PCI
``<hostdev>`` per host device with its ``ua-`` alias (``device/hostdevice/hostdev.go``
``createPCIHostDevice``: no ``mode``, no ``<driver>``, no guest address), and with dedicated CPUs
and ``guestMappingPassthrough`` the vCPU pins (``<cputune>``), the guest cells and their
``<numatune><memnode>`` (``converter/vcpu/vcpu.go`` ``numaMapping``).
"""

from __future__ import annotations

from dataclasses import dataclass

from pcitopo.libvirt.domain import QEMU_NS
from pcitopo.libvirt.machine import add_pflash_loader
from pcitopo.libvirt.marshal import Element, parse_plain, root_element, sub, sub_ns, to_kubevirt_bytes
from pcitopo.model.tree import Bdf

KUBEVIRT_NS = "http://kubevirt.io"
GIB = 1024**3
# The machine the struct starts with before the KubeVirt CR's machine type replaces it.
RHEL_MACHINE = "pc-q35-rhel9.6.0"
# KubeVirt's OVMF vars template (pkg/virt-launcher/virtwrap/efi/efi.go).
OVMF_VARS = "/usr/share/edk2/ovmf/OVMF_VARS.fd"


@dataclass(frozen=True)
class Hostdev:
    """One PCI host device as the converter writes it: the host function and its ``ua-`` alias."""

    source: Bdf
    alias: str


@dataclass(frozen=True)
class GuestCell:
    """One guest NUMA cell of ``guestMappingPassthrough``: the host node its memory comes from
    (its ``<memnode>``) and, per vCPU of the cell in order, the pod CPU it is pinned to."""

    node: int
    pins: tuple[int, ...]


@dataclass(frozen=True)
class LauncherSpec:
    """What the first call's shape depends on. ``cells`` empty: no guest NUMA (one implicit cell,
    ``vcpus`` vCPUs, no pins)."""

    name: str
    hostdevs: tuple[Hostdev, ...]
    cells: tuple[GuestCell, ...] = ()
    vcpus: int = 4
    acpi: bool = True
    namespace: str = "default"
    cell_memory: int = 4 * GIB

    @property
    def cell_count(self) -> int:
        return len(self.cells) or 1

    @property
    def vcpu_count(self) -> int:
        return sum(len(c.pins) for c in self.cells) if self.cells else self.vcpus


def launcher_domain(spec: LauncherSpec) -> bytes:
    """The first call's domain for ``spec``, serialised as KubeVirt does."""
    root = root_element("domain", nsmap={"qemu": QEMU_NS}, type="kvm")
    sub(root, "name", f"{spec.namespace}_{spec.name}")
    sub(root, "memory", str(spec.cell_memory * spec.cell_count), unit="b")
    os_el = sub(root, "os")
    sub(os_el, "type", "hvm", arch="x86_64", machine=RHEL_MACHINE)
    sub(os_el, "smbios", mode="sysinfo")
    _devices(sub(root, "devices"), spec.hostdevs)
    sub(root, "clock", offset="utc")
    sub(sub(root, "resource"), "partition", "/machine")
    feats = sub(root, "features")
    if spec.acpi:
        sub(feats, "acpi")
    _cpu_and_numa(root, spec)
    sub(sub(sub(root, "memoryBacking"), "hugepages"), "page", size="1048576", unit="KiB")
    sub(root, "vcpu", str(spec.vcpu_count), placement="static")
    sub(root, "iothreads", "1")
    meta = sub(root, "metadata")
    kv = sub_ns(meta, KUBEVIRT_NS, "kubevirt", declare=True)
    sub_ns(kv, KUBEVIRT_NS, "uid", "0b9f0d4e-6f39-4d0b-9c5e-2f1b9a0d7c11")
    sub_ns(sub_ns(kv, KUBEVIRT_NS, "graceperiod"), KUBEVIRT_NS, "deletionGracePeriodSeconds", "30")
    return to_kubevirt_bytes(root)


def _devices(devices: Element, hostdevs: tuple[Hostdev, ...]) -> None:
    iface = sub(devices, "interface", type="ethernet")
    sub(iface, "source")
    sub(iface, "target", dev="tap0", managed="no")
    sub(iface, "model", type="virtio-non-transitional")
    sub(iface, "mac", address="02:00:00:aa:bb:cc")
    sub(iface, "mtu", size="1500")
    sub(iface, "alias", name="ua-default")
    sub(iface, "rom", enabled="no")
    ch = sub(devices, "channel", type="unix")
    sub(ch, "target", name="org.qemu.guest_agent.0", type="virtio")
    sub(devices, "controller", type="usb", index="0", model="none")
    scsi = sub(devices, "controller", type="scsi", index="0", model="virtio-non-transitional")
    sub(scsi, "driver", iothread="1")
    sub(devices, "controller", type="virtio-serial", index="0", model="virtio-non-transitional")
    sub(sub(devices, "video"), "model", type="vga", heads="1", vram="16384")
    graphics = sub(devices, "graphics", type="vnc")
    sub(graphics, "listen", type="socket", socket="/var/run/kubevirt-private/1234/virt-vnc")
    sub(sub(devices, "memballoon", model="virtio-non-transitional"), "stats", period="10")
    disk = sub(devices, "disk", device="disk", type="file", model="virtio-non-transitional")
    sub(disk, "source", file="/var/run/kubevirt-private/vmi-disks/rootdisk/disk.img")
    sub(disk, "target", bus="virtio", dev="vda")
    sub(disk, "driver", cache="none", error_policy="stop", io="native", name="qemu", type="raw", discard="unmap")
    sub(disk, "alias", name="ua-rootdisk")
    for hd in hostdevs:
        el = sub(devices, "hostdev", type="pci", managed="no")
        b = hd.source
        sub(sub(el, "source"), "address", type="pci", domain=f"0x{b.domain:04x}", bus=f"0x{b.bus:02x}",
            slot=f"0x{b.slot:02x}", function=f"0x{b.function:x}")
        sub(el, "alias", name=hd.alias)


def _cpu_and_numa(root: Element, spec: LauncherSpec) -> None:
    """``<cpu>`` with its topology and cells, ``<numatune>`` and ``<cputune>`` as
    ``numaMapping`` writes them: guest cells numbered in host node order, each cell's vCPUs
    the ones pinned to that node's CPUs."""
    cpu = sub(root, "cpu", mode="host-passthrough")
    per_cell = len(spec.cells[0].pins) if spec.cells else spec.vcpus
    sub(cpu, "topology", sockets=str(spec.cell_count), cores=str(per_cell), threads="1")
    if not spec.cells:
        return
    numa = sub(cpu, "numa")
    lo = 0
    for i, cell in enumerate(spec.cells):
        sub(numa, "cell", id=str(i), cpus=f"{lo}-{lo + len(cell.pins) - 1}", memory=str(spec.cell_memory), unit="b")
        lo += len(cell.pins)
    tune = sub(root, "numatune")
    sub(tune, "memory", mode="strict", nodeset=",".join(str(c.node) for c in spec.cells))
    for i, cell in enumerate(spec.cells):
        sub(tune, "memnode", cellid=str(i), mode="strict", nodeset=str(cell.node))
    cputune = sub(root, "cputune")
    vcpu = 0
    for cell in spec.cells:
        for pin in cell.pins:
            sub(cputune, "vcpupin", vcpu=str(vcpu), cpuset=str(pin))
            vcpu += 1


def with_efi(xml: bytes, code: str) -> bytes:
    """``<os>`` for ``firmware.bootloader.efi`` (secure boot off; ``pkg/virt-launcher/virtwrap/
    converter/converter.go`` with ``efi/efi.go``): the pflash loader ``code`` and the nvram from
    KubeVirt's vars template."""
    root = parse_plain(xml)
    add_pflash_loader(root, code, OVMF_VARS, "/var/run/kubevirt-private/libvirt/qemu/nvram/default_VARS.fd")
    return to_kubevirt_bytes(root)
