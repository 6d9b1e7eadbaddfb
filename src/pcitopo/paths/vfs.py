"""SR-IOV VFs grouped under their physical function.

A VF sits beside its PF in the PCI tree (below the same port, in sysfs a sibling with a
``physfn`` link), so its path class to any other device is its PF's: NCCL merges a NIC's VFs
into the PF's node (``nccl_device``), and the bridges NVML counts are the PF's bridges. Listing
every VF as a row of its own therefore only repeats the PF's row, and pairing every VF with every
other VF grows with the square of the VF count (4,096 VFs: 8.4 million pairs). A listed VF whose
PF is also listed is shown under that PF instead, and only the PFs (plus any VF listed without
its PF) are paired: the output grows with the number of PFs.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from pcitopo.model.tree import Bdf, PciFunction, Topology
from pcitopo.paths.pairing import pcie_root


@dataclass(frozen=True)
class VfGroups:
    """``heads``: the devices that get matrix rows and pairs, in the order given.
    ``vfs``: for each head that is a PF, its listed VFs in BDF order."""

    heads: list[Bdf]
    vfs: dict[Bdf, list[Bdf]] = field(default_factory=dict)

    def vfs_of(self, bdf: Bdf) -> list[Bdf]:
        return self.vfs.get(bdf, [])


def group_vfs(topo: Topology, bdfs: Iterable[Bdf]) -> VfGroups:
    listed = list(dict.fromkeys(bdfs))
    present = set(listed)
    heads: list[Bdf] = []
    vfs: dict[Bdf, list[Bdf]] = {}
    for b in listed:
        pf = topo.function(b).physfn
        if pf is not None and pf in present:
            vfs.setdefault(pf, []).append(b)
        else:
            heads.append(b)
    return VfGroups(heads, {pf: sorted(v) for pf, v in vfs.items()})


def vf_json(f: PciFunction) -> dict:
    """What an operator needs per VF: its address, the driver it is bound to (vfio-pci for
    passthrough), its IOMMU group and its pcieRoot (DRA drivers publish VFs one by one);
    everything else is the PF's."""
    return {"bdf": str(f.bdf), "driver": f.driver, "iommu_group": f.iommu_group, "pcie_root": pcie_root(f)}


def vf_summary(topo: Topology, vfs: list[Bdf]) -> str:
    """One legend line's tail: ``, 769 VFs 0000:19:00.1-0000:1c:00.1 (vfio-pci)``."""
    if not vfs:
        return ""
    drivers = sorted({topo.function(v).driver or "no driver" for v in vfs})
    span = str(vfs[0]) if len(vfs) == 1 else f"{vfs[0]}-{vfs[-1]}"
    noun = "VF" if len(vfs) == 1 else "VFs"
    return f", {len(vfs)} {noun} {span} ({', '.join(drivers)})"


def with_vfs(topo: Topology, device: dict, vfs: list[Bdf]) -> dict:
    """A device's JSON object, plus ``"vfs"`` when VFs of it are listed (absent otherwise, so a
    listing without VFs reads exactly as before)."""
    if vfs:
        device["vfs"] = [vf_json(topo.function(v)) for v in vfs]
    return device
