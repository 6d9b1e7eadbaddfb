"""GPUDirect P2P cliques for PCIe GPUs.

QEMU's vfio-pci property ``x-nv-gpudirect-clique=<0-15>`` (``hw/vfio/pci-quirks.c``,
``vfio_add_nv_gpudirect_cap``) adds a vendor capability telling NVIDIA's guest driver which
assigned GPUs may do PCIe peer-to-peer with each other: GPUs with the same id form one clique.
It is a GPU-to-GPU hint only (no effect on NVLink or on GPU-NIC RDMA), and on Hopper and newer
it needs QEMU 8.1 or later.

Who shares a clique: PCIe GPUs below one host switch (the topmost switch under their root
port, so a Broadcom two-level complex is one clique). GPUs that share only a root complex are
left out: whether P2P works there depends on the root ports' ACS settings, which an
unprivileged reader cannot see (the PCIe extended capabilities are beyond the 64 bytes of
``config`` it may read). SXM GPUs (a board in the NVLink table) get no clique: their peer
traffic goes over NVLink. Delivered as ``<qemu:override>`` on the hostdev aliases, re-emitted
on every call (KubeVirt's domain struct does not keep it); earlier values are replaced.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lxml import etree

from pcitopo.libvirt.overrides import Property, set_properties
from pcitopo.model.tree import Bdf, Role, Topology
from pcitopo.paths.classify import NvlinkOracle

CLIQUE_PROPERTY = "x-nv-gpudirect-clique"
MAX_CLIQUES = 16  # the property takes 0-15


@dataclass
class CliquePlan:
    by_alias: dict[str, int] = field(default_factory=dict)
    members: dict[int, tuple[Bdf, ...]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def top_switch(host: Topology, bdf: Bdf) -> Bdf | None:
    """The upstream port of the topmost switch above a function, None if it has none."""
    for a in host.ancestry(host.function(bdf)):
        if host.role(a) == Role.UPSTREAM_PORT:
            return a.bdf
    return None


def plan_cliques(host: Topology, hostdevs: list[tuple[Bdf, str | None]]) -> CliquePlan:
    """``hostdevs`` = (host BDF, hostdev alias) of every assigned PCI function."""
    out = CliquePlan()
    oracle = NvlinkOracle(host)
    groups: dict[Bdf, list[tuple[Bdf, str | None]]] = {}
    for bdf, alias in hostdevs:
        f = host.function(bdf)
        if host.role(f) != Role.GPU or f.is_vf or oracle.board(f) is not None:
            continue
        sw = top_switch(host, bdf)
        if sw is not None:
            groups.setdefault(sw, []).append((bdf, alias))
    n = 0
    for sw in sorted(groups):
        gpus = groups[sw]
        if len(gpus) < 2:
            continue
        if n == MAX_CLIQUES:
            out.notes.append(f"more than {MAX_CLIQUES} P2P cliques: GPUs below {sw} and later get none")
            break
        unnamed = [str(b) for b, a in gpus if not a]
        if unnamed:
            out.notes.append(f"GPU(s) {', '.join(unnamed)} have no alias: no P2P clique can be set on them")
        named = [(b, a) for b, a in gpus if a]
        if len(named) < 2:
            continue
        for _, a in named:
            out.by_alias[a] = n
        out.members[n] = tuple(b for b, _ in named)
        n += 1
    return out


def apply_cliques(root: etree._Element, plan: CliquePlan) -> None:
    """Set the clique property on exactly the planned aliases; remove it from every other."""
    wanted = {a: [Property(CLIQUE_PROPERTY, "unsigned", str(n))] for a, n in plan.by_alias.items()}
    set_properties(root, lambda alias, name: name == CLIQUE_PROPERTY, wanted)


__all__ = ["CLIQUE_PROPERTY", "CliquePlan", "apply_cliques", "plan_cliques", "top_switch"]
