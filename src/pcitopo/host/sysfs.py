"""The lazy sysfs reader: which files it reads, and the host model it builds from a source.

:class:`SysfsReader` is the only code that knows sysfs file names; fixtures, captures and live
hosts go through exactly the same reader, whatever source (:mod:`pcitopo.host.sources`) holds
the bytes.
"""

from __future__ import annotations

import os

from pcitopo.errors import MalformedBdfError, SysfsError
from pcitopo.host.sources import MAX_ATTR_BYTES, PCI_DEVICES_DIR, Source, Unreadable, open_source, resolve
from pcitopo.model.bars import Bar, parse_resource
from pcitopo.model.cpuinfo import ADDRESS_SIZES_MEMBER, HostWidth, local_width, recorded_width
from pcitopo.model.tree import Bdf, Link, NumaNode, PciFunction, Topology, is_bdf

# The attribute files the reader uses: one list, shared by the reader and `pcitopo capture`.
REQUIRED_ATTRS = ("vendor", "device", "class")
OPTIONAL_ATTRS = (
    "subsystem_vendor",
    "subsystem_device",
    "numa_node",
    "max_link_speed",
    "max_link_width",
    "current_link_speed",
    "current_link_width",
    "local_cpulist",
)
LINK_ATTRS = ("driver", "iommu_group", "physfn")
# Multi-line attribute files the reader uses: the BARs (src/pcitopo/model/bars.py, the MMIO budget).
# Kept apart from OPTIONAL_ATTRS, whose files are one line each.
RESOURCE_ATTRS = ("resource",)
# Read only for NVLink-switch management candidates (src/pcitopo/model/nvswitch_mgmt.py): the VPD image
# (root-readable; bounded like any attribute) and which class children a function registered.
VPD_ATTR = "vpd"
CLASS_DIRS = ("infiniband", "net")
NODE_ATTRS = ("cpulist",)

# -- pcitopo doctor: what the host-readiness checks read, besides the above --------------------
# Per function: config space (64 bytes unprivileged, 4096 as root), BARs, the driver override.
CONFIG_ATTR = "config"
DOCTOR_ATTRS = (CONFIG_ATTR, *RESOURCE_ATTRS, "driver_override")
# kernel/iommu_groups/<N>/devices/<BDF> (links) and .../type; class/iommu/<unit> (links).
IOMMU_GROUPS_DIR = "kernel/iommu_groups"
IOMMU_GROUP_ATTRS = ("type",)
IOMMU_CLASS_DIR = "class/iommu"
# -- end pcitopo doctor ------------------------------------------------------------------------

# Every per-function file `pcitopo capture` keeps (links and the VPD image are handled apart):
# the one list, so a capture reads like the host for the reader, the MMIO budget and the doctor.
CAPTURED_ATTRS = tuple(dict.fromkeys(REQUIRED_ATTRS + OPTIONAL_ATTRS + RESOURCE_ATTRS + DOCTOR_ATTRS))

NODE_DIR = "devices/system/node"

class SysfsReader:
    """Reads PCI functions and NUMA nodes from a source. The only code that knows sysfs names."""

    @property
    def label(self) -> str:
        return getattr(self.source, "label", self.source.name)

    def __init__(self, source: Source):
        self.source = source
        self.name = source.name
        self.warnings: list[str] = []
        # readlink answers for resolve(): every device's path repeats the same prefixes
        # (bus/pci/devices, devices/pci0000:15/0000:15:01.0, ...), read once here.
        self._links: dict[str, str | None] = {}

    def readlink(self, rel: str) -> str | None:
        """``source.readlink``, remembered for the life of this reader (like the functions it
        loads: sysfs device links do not change while the device exists)."""
        try:
            return self._links[rel]
        except KeyError:
            target = self._links[rel] = self.source.readlink(rel)
            return target

    def _warn(self, msg: str) -> None:
        if msg not in self.warnings:
            self.warnings.append(msg)

    def _text(self, rel: str, required: bool) -> str | None:
        data = self.source.read(rel)
        if data is None:
            if required:
                raise SysfsError(f"{self.name}: required attribute {rel} is missing")
            return None
        if isinstance(data, Unreadable):
            if required:
                raise SysfsError(f"{self.name}: required attribute {rel} is unreadable ({data.why})")
            self._warn(f"{rel}: unreadable ({data.why}), ignored")
            return None
        if len(data) > MAX_ATTR_BYTES:
            if required:
                raise SysfsError(f"{self.name}: {rel} is larger than a sysfs attribute")
            self._warn(f"{rel}: larger than a sysfs attribute, ignored")
            return None
        return data.decode("utf-8", "replace").strip()

    def _int(self, rel: str, base: int, required: bool = False) -> int | None:
        text = self._text(rel, required)
        if text is None:
            return None
        try:
            return int(text, base)
        except ValueError:
            if required:
                raise SysfsError(f"{self.name}: {rel} holds {text[:40]!r}, not a number") from None
            self._warn(f"{rel}: {text[:40]!r} is not a number, ignored")
            return None

    def _bars(self, rel: str) -> tuple[Bar, ...] | None:
        """A function's ``resource`` file; absent or malformed → None (with a warning)."""
        text = self._text(rel, False)
        if text is None:
            return None
        try:
            return parse_resource(text)
        except SysfsError as e:
            self._warn(f"{rel}: {e.reason}, ignored")
            return None

    def _link_name(self, rel: str) -> str | None:
        target = self.source.readlink(rel)
        return target.rstrip("/").rsplit("/", 1)[-1] if target else None

    def load(self, bdf: Bdf) -> PciFunction | None:
        link = f"{PCI_DEVICES_DIR}/{bdf}"
        if self.readlink(link) is None and self.source.listdir(link) is None:
            return None
        real = resolve(self, link)
        comps = real.split("/")
        if len(comps) < 3 or comps[0] != "devices" or comps[-1] != str(bdf):
            raise SysfsError(f"{self.name}: {link} resolves to {real}, not a device directory")
        # The root complex is the first non-BDF component above the chain of BDFs (NCCL's walk
        # stops at the same place); anything above it (ACPI, VMBus wrappers) is not PCI.
        i = len(comps) - 1
        while i > 0 and is_bdf(comps[i]):
            i -= 1
        if i == len(comps) - 1 or i == 0:
            raise SysfsError(f"{self.name}: {real} has no root complex above {bdf}")
        path = tuple(comps[i:])
        base = real
        vendor = self._int(f"{base}/vendor", 16, required=True)
        device = self._int(f"{base}/device", 16, required=True)
        class_code = self._int(f"{base}/class", 16, required=True)
        numa = self._int(f"{base}/numa_node", 10)
        physfn_name = self._link_name(f"{base}/physfn")
        physfn = None
        if physfn_name is not None:
            try:
                physfn = Bdf.parse(physfn_name)
            except MalformedBdfError:
                self._warn(f"{base}/physfn: {physfn_name!r} is not a PCI address, ignored")
        group = self._link_name(f"{base}/iommu_group")
        return PciFunction(
            bdf=bdf,
            path=path,
            vendor=vendor,
            device=device,
            class_code=class_code,
            subsystem_vendor=self._int(f"{base}/subsystem_vendor", 16),
            subsystem_device=self._int(f"{base}/subsystem_device", 16),
            numa_node=numa if numa is not None and numa >= 0 else -1,
            link=Link(
                max_speed=self._text(f"{base}/max_link_speed", False),
                max_width=self._int(f"{base}/max_link_width", 10),
                current_speed=self._text(f"{base}/current_link_speed", False),
                current_width=self._int(f"{base}/current_link_width", 10),
            ),
            driver=self._link_name(f"{base}/driver"),
            iommu_group=int(group) if group and group.isdigit() else None,
            physfn=physfn,
            local_cpulist=self._text(f"{base}/local_cpulist", False),
            bars=self._bars(f"{base}/resource"),
        )

    def host_width(self) -> HostWidth:
        """The width of the host this source describes (see src/pcitopo/model/cpuinfo.py); the caller
        (``Topology.host_width``) keeps it."""
        return source_width(self.source)

    def read_vpd(self, bdf: Bdf) -> bytes | None:
        """The function's VPD image, or None when absent or unreadable (not root)."""
        data = self.source.read(f"{resolve(self, f'{PCI_DEVICES_DIR}/{bdf}')}/{VPD_ATTR}")
        return data[:MAX_ATTR_BYTES] if isinstance(data, bytes) else None

    def read_class_dirs(self, bdf: Bdf) -> tuple[str, ...]:
        """Which of ``infiniband/`` and ``net/`` the function has (a driver registered an RDMA
        device or a network interface on it)."""
        base = resolve(self, f"{PCI_DEVICES_DIR}/{bdf}")
        return tuple(d for d in CLASS_DIRS if self.source.listdir(f"{base}/{d}") is not None)

    def read_rdma_names(self, bdf: Bdf) -> tuple[str, ...]:
        """The RDMA devices the function registered (``infiniband/mlx5_0``: the names
        ``nvidia-smi topo -m`` and NCCL_IB_HCA use), sorted; empty when it has none (a NIC on
        vfio-pci, a capture that did not keep them)."""
        base = resolve(self, f"{PCI_DEVICES_DIR}/{bdf}")
        return tuple(sorted(self.source.listdir(f"{base}/{CLASS_DIRS[0]}") or ()))

    def all_bdfs(self) -> list[Bdf]:
        names = self.source.listdir(PCI_DEVICES_DIR)
        if names is None:
            raise SysfsError(f"{self.name}: {PCI_DEVICES_DIR} is not a directory")
        out = []
        for n in names:
            if is_bdf(n):
                out.append(Bdf.parse(n))
            else:
                self._warn(f"{PCI_DEVICES_DIR}/{n}: not a PCI address, ignored")
        return out

    def numa_nodes(self) -> dict[int, NumaNode]:
        nodes: dict[int, NumaNode] = {}
        for n in self.source.listdir(NODE_DIR) or []:
            if n.startswith("node") and n[4:].isdigit():
                nodes[int(n[4:])] = NumaNode(int(n[4:]), self._text(f"{NODE_DIR}/{n}/cpulist", False))
        return dict(sorted(nodes.items()))


def source_width(source: Source) -> HostWidth:
    """Recorded in the source (a capture) → that; a capture file without it → unknown; else this
    machine's /proc/cpuinfo or $PCITOPO_CPUINFO (a live /sys, a sysfs directory, a fixture)."""
    data = source.read(ADDRESS_SIZES_MEMBER)
    if isinstance(data, bytes):
        return recorded_width(data, getattr(source, "label", source.name))
    if isinstance(data, Unreadable):
        return HostWidth(None, f"{source.name}: {ADDRESS_SIZES_MEMBER} {data.why}")
    if not getattr(source, "cpu_is_local", True):
        return HostWidth(None, f"not recorded in {getattr(source, 'label', source.name)} (captured from a directory without "
                         "--phys-bits, or by an older pcitopo; capture again to record it)")
    return local_width()


def open_host(path: str | os.PathLike = "/sys") -> Topology:
    """The host model for a sysfs directory, a capture tarball, or a fixture directory."""
    return Topology(SysfsReader(open_source(path)))
