"""`pcitopo capture`: snapshot exactly what the reader needs from a host, nothing else.

The result is a deterministic ``.tar.gz`` that :func:`pcitopo.host.sysfs.open_host` reads back into
the same model, so an operator can attach a host to a bug report and anyone can replay it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import BinaryIO

from pcitopo.errors import SysfsError
from pcitopo.host.configspace import HEADER_BYTES
from pcitopo.host.sources import (
    LEFT_OUT,
    MAX_ATTR_BYTES,
    PCI_DEVICES_DIR,
    WHOLE_MEMBER,
    DirSource,
    MemoryTree,
    Source,
    Unreadable,
    is_live_sysfs,
    is_whole,
    open_source,
    resolve,
)
from pcitopo.host.sysfs import (
    CAPTURED_ATTRS,
    CLASS_DIRS,
    CONFIG_ATTR,
    IOMMU_CLASS_DIR,
    IOMMU_GROUP_ATTRS,
    IOMMU_GROUPS_DIR,
    LINK_ATTRS,
    NODE_ATTRS,
    NODE_DIR,
    RESOURCE_ATTRS,
    VPD_ATTR,
)
from pcitopo.model.cpuinfo import ADDRESS_SIZES_MEMBER, HostWidth, local_width, recorded_width

# The files whose absence the check and the doctor cannot make up for, and what each costs
# (one warning line per kind; ``driver`` only for the functions that should have one).
MISSING_COSTS = {
    CONFIG_ATTR: "the doctor cannot read their config space",
    RESOURCE_ATTRS[0]: "their BARs cannot be sized, so xmlfix --check says unknown for MMIO",
    "numa_node": "their NUMA node is unknown",
    "iommu_group": f"{LEFT_OUT['iommu_group']}; xmlfix --check says unknown for them",
    "driver": f"{LEFT_OUT['driver']}; xmlfix --check says unknown for them",
}
DRIVER_CLASSES = ("0x02", "0x03")  # NICs and GPUs: what a GPU node binds a driver (or vfio-pci) to


@dataclass(frozen=True, slots=True)
class CaptureSummary:
    functions: int
    numa_nodes: int
    entries: int
    skipped: tuple[str, ...]
    host_bits: int | None = None  # the CPU's physical-address width recorded (None: not recorded)
    # functions whose config space the source gave only its first 64 bytes of (read without
    # CAP_SYS_ADMIN): the PCIe extended capabilities (ACS, ATS) are not in the capture
    config_cut: int = 0
    # one line per kind of file some functions lack (MISSING_COSTS), for the operator
    missing: tuple[str, ...] = ()


def capture_tree(source: Source, phys_bits: int | None = None) -> tuple[MemoryTree, CaptureSummary]:
    """``phys_bits``: the node's CPU address width when the source cannot tell (a directory)."""
    tree = MemoryTree(f"capture of {source.name}")
    skipped: list[str] = []
    lacking: dict[str, int] = {}
    names = source.listdir(PCI_DEVICES_DIR)
    if names is None:
        raise SysfsError(f"{source.name}: {PCI_DEVICES_DIR} is not a directory")
    functions = cut = 0
    for name in sorted(names):
        link = f"{PCI_DEVICES_DIR}/{name}"
        target = source.readlink(link)
        if target is None:
            skipped.append(f"{link}: not a symlink")
            continue
        real = resolve(source, link)
        tree.add_link(link, target)
        tree.add_dir(real)
        functions += 1
        for attr in CAPTURED_ATTRS:
            data = source.read(f"{real}/{attr}")
            if data is None:
                lacking[attr] = lacking.get(attr, 0) + (attr in MISSING_COSTS)
                continue
            if isinstance(data, Unreadable):
                skipped.append(f"{real}/{attr}: {data.why}")
                continue
            tree.add_file(f"{real}/{attr}", data)
            cut += attr == CONFIG_ATTR and len(data) <= HEADER_BYTES
        for attr in LINK_ATTRS:
            t = source.readlink(f"{real}/{attr}")
            if t is not None:
                tree.add_link(f"{real}/{attr}", t)
            elif attr in MISSING_COSTS and (attr != "driver" or _wants_driver(source, real)):
                lacking[attr] = lacking.get(attr, 0) + 1
        _capture_vpd(source, tree, real)
        _capture_class_dirs(source, tree, real)
    _capture_iommu(source, tree, skipped)  # the doctor's IOMMU checks, offline
    nodes = 0
    for n in sorted(source.listdir(NODE_DIR) or []):
        if not (n.startswith("node") and n[4:].isdigit()):
            continue
        nodes += 1
        tree.add_dir(f"{NODE_DIR}/{n}")
        for attr in NODE_ATTRS:
            data = source.read(f"{NODE_DIR}/{n}/{attr}")
            if isinstance(data, bytes):
                tree.add_file(f"{NODE_DIR}/{n}/{attr}", data)
    width = _capture_width(source, tree, skipped, phys_bits)
    if is_whole(source):  # a live sysfs, or a capture of one: what it lacks, its host lacks
        tree.add_file(WHOLE_MEMBER, "captured from a live sysfs: a missing driver or iommu_group link is absent on the host\n")
    missing = tuple(f"{n} {'GPU or NIC' if attr == 'driver' else 'PCI'} function(s) of {functions} have no {attr}: "
                    f"{MISSING_COSTS[attr]}" for attr, n in lacking.items() if n)
    return tree, CaptureSummary(functions, nodes, len(tree), tuple(skipped), width, cut, missing=missing)


def _wants_driver(source: Source, real: str) -> bool:
    cls = _read_ids(source, real, ("class",))
    return cls is not None and cls[0].startswith(DRIVER_CLASSES)


def _capture_width(source: Source, tree: MemoryTree, skipped: list[str], phys_bits: int | None) -> int | None:
    """The host CPU's ``address sizes`` line (the MMIO check's host width, src/pcitopo/model/cpuinfo.py),
    so a capture replayed on another machine is judged with its own host's width. Taken only
    from what describes the node: ``phys_bits`` (``--phys-bits``), the record of a capture being
    captured again, or this machine's /proc/cpuinfo when the source is a live sysfs. A directory
    cannot tell whose tree it is: its width stays unknown."""
    recorded = source.read(ADDRESS_SIZES_MEMBER)
    if phys_bits is not None:
        width = HostWidth(phys_bits, "given by --phys-bits", f"address sizes\t: {phys_bits} bits physical")
    elif isinstance(recorded, bytes):
        width = recorded_width(recorded, source.name)
    elif isinstance(source, DirSource) and is_live_sysfs(source.root):
        width = local_width()
    else:
        width = HostWidth(None, f"{source.name} is not a live sysfs: its CPU is not this machine's; give --phys-bits N")
    if width.bits is None:
        skipped.append(f"{ADDRESS_SIZES_MEMBER}: host CPU address width unknown ({width.origin})")
        return None
    tree.add_file(ADDRESS_SIZES_MEMBER, f"{width.line or f'address sizes : {width.bits} bits physical'}\n")
    return width.bits


def _read_ids(source: Source, real: str, attrs: tuple[str, ...]) -> tuple[str, ...] | None:
    vals = [source.read(f"{real}/{a}") for a in attrs]
    if not all(isinstance(x, bytes) for x in vals):
        return None
    return tuple(x.decode("ascii", "replace").strip().lower() for x in vals)  # type: ignore[union-attr]


def _capture_vpd(source: Source, tree: MemoryTree, real: str) -> None:
    """For ConnectX-7 functions only (src/pcitopo/model/nvswitch_mgmt.py): the VPD image when
    readable (root)."""
    if _read_ids(source, real, ("vendor", "device")) != ("0x15b3", "0x1021"):
        return
    vpd = source.read(f"{real}/{VPD_ATTR}")
    if isinstance(vpd, bytes) and vpd:
        tree.add_file(f"{real}/{VPD_ATTR}", vpd[:MAX_ATTR_BYTES])


def _capture_class_dirs(source: Source, tree: MemoryTree, real: str) -> None:
    """For network and InfiniBand controllers (class 0x02xxxx): the class children
    (``infiniband/``, ``net/``) with their entries' names: the RDMA device name the legends
    show (``mlx5_0``) and what tells a compute NIC from an NVLink-switch manager."""
    cls = _read_ids(source, real, ("class",))
    if cls is None or not cls[0].startswith("0x02"):
        return
    for d in CLASS_DIRS:
        names = source.listdir(f"{real}/{d}")
        if names is not None:
            tree.add_dir(f"{real}/{d}")
            for n in names:
                tree.add_dir(f"{real}/{d}/{n}")


def _capture_iommu(source: Source, tree: MemoryTree, skipped: list[str]) -> None:
    """For the doctor: the IOMMU groups (their type and member links) and the IOMMU
    units (class/iommu links), so a captured host can be doctored offline."""
    for g in sorted(source.listdir(IOMMU_GROUPS_DIR) or []):
        gdir = f"{IOMMU_GROUPS_DIR}/{g}"
        tree.add_dir(gdir)
        for attr in IOMMU_GROUP_ATTRS:
            data = source.read(f"{gdir}/{attr}")
            if isinstance(data, bytes):
                tree.add_file(f"{gdir}/{attr}", data)
            elif isinstance(data, Unreadable):
                skipped.append(f"{gdir}/{attr}: {data.why}")
        for m in sorted(source.listdir(f"{gdir}/devices") or []):
            t = source.readlink(f"{gdir}/devices/{m}")
            if t is not None:
                tree.add_link(f"{gdir}/devices/{m}", t)
    for unit in sorted(source.listdir(IOMMU_CLASS_DIR) or []):
        t = source.readlink(f"{IOMMU_CLASS_DIR}/{unit}")
        if t is not None:
            tree.add_link(f"{IOMMU_CLASS_DIR}/{unit}", t)


def capture(sysfs: str | os.PathLike | Source, out: str | os.PathLike, stdout: BinaryIO | None = None,
            phys_bits: int | None = None) -> CaptureSummary:
    """Capture ``sysfs`` (a path, or a source already open: a tree built from a ``.topo``) into
    the file ``out``; ``out == "-"`` writes to ``stdout`` (a binary stream, e.g.
    ``sys.stdout.buffer``), refusing a terminal. ``phys_bits``: the node's CPU address width,
    recorded whatever the source (``pcitopo capture --phys-bits``)."""
    source = sysfs if hasattr(sysfs, "listdir") else open_source(sysfs)  # type: ignore[arg-type]
    tree, summary = capture_tree(source, phys_bits)
    try:
        if os.fspath(out) == "-":
            if stdout is None or stdout.isatty():
                raise SysfsError("refusing to write a gzip tarball to a terminal: redirect stdout (-o - > node.tar.gz)")
            stdout.write(tree.tarball_bytes())
            stdout.flush()
        else:
            tree.write_tarball(out)
    except OSError as e:
        raise SysfsError(f"cannot write {os.fspath(out)}: {e.strerror or e}") from None
    return summary
