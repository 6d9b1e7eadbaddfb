"""`pcitopo capture`: snapshot exactly what the reader needs from a host, nothing else.

The result is a deterministic ``.tar.gz`` that :func:`topology.host.sysfs.open_host` reads back into
the same model, so an operator can attach a host to a bug report and anyone can replay it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import BinaryIO

from ..errors import SysfsError
from ..model.cpuinfo import ADDRESS_SIZES_MEMBER
from .sources import MAX_ATTR_BYTES, MemoryTree, PCI_DEVICES_DIR, Source, Unreadable, open_source, resolve
from .sysfs import (
    CAPTURED_ATTRS,
    CLASS_DIRS,
    IOMMU_CLASS_DIR,
    IOMMU_GROUPS_DIR,
    IOMMU_GROUP_ATTRS,
    LINK_ATTRS,
    NODE_ATTRS,
    NODE_DIR,
    VPD_ATTR,
    source_width,
)


@dataclass(frozen=True, slots=True)
class CaptureSummary:
    functions: int
    numa_nodes: int
    entries: int
    skipped: tuple[str, ...]
    host_bits: int | None = None  # the CPU's physical-address width recorded (None: not recorded)


def capture_tree(source: Source) -> tuple[MemoryTree, CaptureSummary]:
    tree = MemoryTree(f"capture of {source.name}")
    skipped: list[str] = []
    names = source.listdir(PCI_DEVICES_DIR)
    if names is None:
        raise SysfsError(f"{source.name}: {PCI_DEVICES_DIR} is not a directory")
    functions = 0
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
                continue
            if isinstance(data, Unreadable):
                skipped.append(f"{real}/{attr}: {data.why}")
                continue
            tree.add_file(f"{real}/{attr}", data)
        for attr in LINK_ATTRS:
            t = source.readlink(f"{real}/{attr}")
            if t is not None:
                tree.add_link(f"{real}/{attr}", t)
        _capture_mgmt_signals(source, tree, real)
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
    width = _capture_width(source, tree, skipped)
    return tree, CaptureSummary(functions, nodes, len(tree), tuple(skipped), width)


def _capture_width(source: Source, tree: MemoryTree, skipped: list[str]) -> int | None:
    """The host CPU's ``address sizes`` line (the MMIO check's host width, topology/model/cpuinfo.py),
    so a capture replayed on another machine is judged with its own host's width."""
    width = source_width(source)
    if width.bits is None:
        skipped.append(f"{ADDRESS_SIZES_MEMBER}: host CPU address width unknown ({width.origin})")
        return None
    tree.add_file(ADDRESS_SIZES_MEMBER, f"{width.line or f'address sizes : {width.bits} bits physical'}\n")
    return width.bits


def _capture_mgmt_signals(source: Source, tree: MemoryTree, real: str) -> None:
    """For ConnectX-7 functions only (topology/model/nvswitch_mgmt.py): the VPD image when readable
    (root) and the class children (``infiniband/``, ``net/``) with their entries' names."""
    ids = [source.read(f"{real}/{a}") for a in ("vendor", "device")]
    if not all(isinstance(x, bytes) for x in ids):
        return
    if tuple(x.decode("ascii", "replace").strip().lower() for x in ids) != ("0x15b3", "0x1021"):
        return
    vpd = source.read(f"{real}/{VPD_ATTR}")
    if isinstance(vpd, bytes) and vpd:
        tree.add_file(f"{real}/{VPD_ATTR}", vpd[:MAX_ATTR_BYTES])
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


def capture(sysfs: str | os.PathLike, out: str | os.PathLike, stdout: BinaryIO | None = None) -> CaptureSummary:
    """Capture ``sysfs`` into the file ``out``; ``out == "-"`` writes to ``stdout`` (a binary
    stream, e.g. ``sys.stdout.buffer``), refusing a terminal."""
    tree, summary = capture_tree(open_source(sysfs))
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
