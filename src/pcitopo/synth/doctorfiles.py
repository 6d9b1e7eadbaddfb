"""What ``pcitopo doctor`` reads, for synthetic hosts: config space with ACS/ATS,
``driver_override``, IOMMU groups with their type, IOMMU units; and planted faults. (The
``resource`` files, with real BAR sizes per device id, are :mod:`pcitopo.synth`'s; it plants
the ``bar-unassigned`` fault named here.)

Kept apart from :mod:`pcitopo.synth` (which calls :class:`DoctorFiles` from its builder) so the
host-readiness layer can move with the synthesiser as one piece. The fixture README lists which
values follow public facts and which are guesses.

A clean synthetic host is what the doctor calls ready: every ACS-capable bridge above a GPU or
NIC has ACS control SV|RR|CR|UF|DT (0x5d), every other one the kernel's default SV|RR|CR|UF
(0x1d); ConnectX functions have ATS enabled; BARs are assigned; groups are translated (DMA-FQ).
``fault=NAME[,NAME]`` on a ``.topo`` line plants the faults in :data:`FAULTS` on that line.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Protocol

from pcitopo.host.configspace import (
    ACS_CR,
    ACS_DT,
    ACS_RR,
    ACS_SV,
    ACS_UF,
    ATS_ENABLE,
    EXT_CAP_ACS,
    EXT_CAP_ATS,
    HEADER_BYTES,
    LEGACY_BYTES,
    PCIE_BYTES,
)
from pcitopo.host.sources import MemoryTree
from pcitopo.host.sysfs import IOMMU_CLASS_DIR, IOMMU_GROUPS_DIR
from pcitopo.model.tree import Bdf


class Look(Protocol):
    """What this module reads of a :class:`pcitopo.synth.Look` (declared here so the two
    modules do not import each other)."""

    vendor: int
    device: int
    class_code: int
    sub_vendor: int
    sub_device: int
    omit: frozenset[str]
    faults: frozenset[str]
    override: str | None
    iommu_type: str | None

    @property
    def is_bridge(self) -> bool: ...


class DeviceSpec(Protocol):
    """What this module reads of a :class:`pcitopo.synth.DeviceSpec`."""

    @property
    def look(self) -> Look: ...

    @property
    def children(self) -> Sequence[DeviceSpec]: ...


class HostSpec(Protocol):
    """What :func:`iommu_off` reads of a :class:`pcitopo.synth.HostSpec`."""

    def devices(self) -> Iterator[Any]: ...


FAULTS = {
    "acs-dt-off": "ACS control 0x1d, the kernel's default: Direct Translated P2P off",
    "acs-rr-off": "ACS control with DT but without RR (0x59): peer requests bypass the IOMMU",
    "ats-off": "ATS capability present but not enabled",
    "no-ats": "no ATS capability (ConnectX firmware with ATS_ENABLED=false)",
    "bar-unassigned": "the largest BAR left unassigned (start 0, size kept)",
    "config-short": "config readable only to 64 bytes (what an unprivileged reader gets)",
    "config-truncated": "config cut at 300 bytes",
    "config-loop": "the extended capability list points back at itself",
    "config-past-end": "ACS capability header at 0xffc: its control register lies past 4096",
}
GROUP_TYPES = ("DMA", "DMA-FQ", "identity")
DEFAULT_GROUP_TYPE = "DMA-FQ"

ACS_KERNEL_DEFAULT = ACS_SV | ACS_RR | ACS_CR | ACS_UF  # 0x1d
ACS_GDR = ACS_KERNEL_DEFAULT | ACS_DT  # 0x5d

# Extended capability ids used only to make realistic chains.
_AER, _VC, _ARI, _SRIOV, _SECPCIE = 0x0001, 0x0002, 0x000E, 0x0010, 0x0019

def _fault_config(config: bytes, faults: frozenset[str]) -> bytes:
    if "config-short" in faults:
        return config[:HEADER_BYTES]
    if "config-truncated" in faults:
        return config[:300]
    data = bytearray(config)
    if "config-loop" in faults:
        # the header at 0x100 names 0x100 as the next capability
        data[0x100:0x104] = (_AER | 1 << 16 | 0x100 << 20).to_bytes(4, "little")
    if "config-past-end" in faults:
        data[0x100:0x104] = (_AER | 1 << 16 | 0xFFC << 20).to_bytes(4, "little")
        data[0xFFC:0x1000] = (EXT_CAP_ACS | 1 << 16).to_bytes(4, "little")
    return bytes(data)


def _is_gdr_endpoint(look: Look) -> bool:
    """A GPU (3D controller) or a network controller: what GPUDirect RDMA pairs."""
    return look.class_code >> 8 == 0x0302 or look.class_code >> 16 == 0x02


def leads_to_gdr_device(dev: DeviceSpec) -> bool:
    """Whether a GPU or NIC sits anywhere below this line."""
    return any(_is_gdr_endpoint(c.look) or leads_to_gdr_device(c) for c in dev.children)


def minimal_config(look: Look, kind: str, gdr_path: bool) -> bytes:
    """Config space for one function, with extended capabilities at realistic offsets
    (ConnectX-7's ATS at 0x480 as NVIDIA's VM guide shows it; other offsets are guesses)."""
    faults = look.faults
    if "link" in look.omit or {"max_link_speed", "max_link_width"} <= look.omit:
        base = build_config(look.vendor, look.device, look.class_code, bridge=look.is_bridge,
                            sub_vendor=look.sub_vendor, sub_device=look.sub_device)
        return _fault_config(base[:LEGACY_BYTES], faults)  # conventional PCI: no extended space
    acs = ACS_GDR if gdr_path else ACS_KERNEL_DEFAULT
    if "acs-dt-off" in faults:
        acs &= ~ACS_DT
    if "acs-rr-off" in faults:
        acs = (acs | ACS_DT) & ~ACS_RR
    caps: list[tuple[int, int, bytes]]
    if kind in ("rp", "ds"):
        acs_at = 0x220 if kind == "rp" else 0x148
        caps = [(0x100, _AER, b""), (acs_at, EXT_CAP_ACS, b"\x7f\x00" + acs.to_bytes(2, "little"))]
    elif look.vendor == 0x15B3 and not look.is_bridge:
        caps = [(0x100, _AER, b""), (0x150, _ARI, b""), (0x180, _SRIOV, b""), (0x1C0, _SECPCIE, b""),
                (0x230, EXT_CAP_ACS, b"\x00\x00\x00\x00")]
        if "no-ats" not in faults:
            ats = 0 if "ats-off" in faults else ATS_ENABLE
            caps.append((0x480, EXT_CAP_ATS, b"\x20\x00" + ats.to_bytes(2, "little")))
    elif look.vendor == 0x10DE and look.class_code >> 16 == 0x03:
        caps = [(0x100, _VC, b""), (0x420, _AER, b""), (0x900, _SECPCIE, b"")]
    else:
        caps = [(0x100, _AER, b"")]
    cfg = build_config(look.vendor, look.device, look.class_code, bridge=look.is_bridge,
                       sub_vendor=look.sub_vendor, sub_device=look.sub_device, ext_caps=caps)
    return _fault_config(cfg, faults)


class DoctorFiles:
    """Per-build state for the doctor's files: IOMMU groups and units. (``resource`` is written
    by :mod:`pcitopo.synth` with real sizes per device id; it plants ``bar-unassigned``.)"""

    def __init__(self) -> None:
        self.groups: dict[int, list[tuple[str, str]]] = {}  # group -> [(bdf, function dir)]
        self.types: dict[int, str] = {}
        self.units: set[str] = set()

    def add_function(self, tree: MemoryTree, d: str, bdf: Bdf, look: Look, kind: str,
                     group: int | None, gdr_path: bool) -> None:
        tree.add_file(f"{d}/config", minimal_config(look, kind, gdr_path))
        tree.add_file(f"{d}/driver_override", f"{look.override or '(null)'}\n")
        if group is None or "iommu_group" in look.omit:
            return
        self.groups.setdefault(group, []).append((str(bdf), d))
        if look.iommu_type:
            self.types[group] = look.iommu_type
        else:
            self.types.setdefault(group, DEFAULT_GROUP_TYPE)
        self.units.add(d.split("/")[1])  # one IOMMU unit per root complex (Intel: one DMAR per stack)

    def finish(self, tree: MemoryTree) -> None:
        for group, members in sorted(self.groups.items()):
            gdir = f"{IOMMU_GROUPS_DIR}/{group}"
            tree.add_file(f"{gdir}/type", self.types[group] + "\n")
            for bdf, d in members:
                tree.add_link(f"{gdir}/devices/{bdf}", "../../../../" + d)
        for i, _rc in enumerate(sorted(self.units)):
            tree.add_dir(f"devices/virtual/iommu/dmar{i}")
            tree.add_link(f"{IOMMU_CLASS_DIR}/dmar{i}", f"../../devices/virtual/iommu/dmar{i}")


def check_faults(names: Iterable[str]) -> str | None:
    """None if every name is a known fault, else the reason."""
    bad = [n for n in names if n not in FAULTS]
    return None if not bad else f"unknown fault {bad[0]!r} (known: {', '.join(FAULTS)})"


def build_config(vendor: int, device: int, class_code: int, *, bridge: bool,
                 sub_vendor: int = 0, sub_device: int = 0,
                 ext_caps: list[tuple[int, int, bytes]] = ()) -> bytes:
    """A 4096-byte PCIe config space: the type 0/1 header and extended capabilities given as
    (offset, id, body after the 4-byte header), linked in the order given."""
    data = bytearray(PCIE_BYTES)
    data[0:4] = (vendor | device << 16).to_bytes(4, "little")
    data[6:8] = (0x0010).to_bytes(2, "little")  # status: capability list present
    data[8:12] = (class_code << 8).to_bytes(4, "little")  # revision 0
    data[0x0E] = 0x01 if bridge else 0x00
    if not bridge:
        data[0x2C:0x30] = (sub_vendor | sub_device << 16).to_bytes(4, "little")
    data[0x34] = 0x40  # capabilities pointer: a PCI Express capability at 0x40
    data[0x40:0x44] = (0x10 | 0x0002 << 16).to_bytes(4, "little")  # cap id 0x10, version 2
    caps = list(ext_caps)
    for i, (off, cap_id, body) in enumerate(caps):
        nxt = caps[i + 1][0] if i + 1 < len(caps) else 0
        data[off:off + 4] = (cap_id | 1 << 16 | nxt << 20).to_bytes(4, "little")
        data[off + 4:off + 4 + len(body)] = body
    return bytes(data)


def iommu_off(spec: HostSpec, unprivileged: bool = True) -> HostSpec:
    """The same host as a node with the IOMMU off, captured as the trial user captured it:
    no IOMMU groups or units (the kernel makes none without an IOMMU), GPUs and NICs bound to no
    driver (vfio-pci refuses a device in no group; the vendor drivers were kept off), and, with
    ``unprivileged``, config space cut at 64 bytes (a capture without CAP_SYS_ADMIN). Changes
    ``spec`` in place and returns it."""
    from dataclasses import replace

    for d in spec.devices():
        look = replace(d.look, omit=d.look.omit | {"iommu_group"})
        if _is_gdr_endpoint(look):
            look = replace(look, driver=None)
        if unprivileged:
            look = replace(look, faults=look.faults | {"config-short"})
        d.look = look
    return spec
