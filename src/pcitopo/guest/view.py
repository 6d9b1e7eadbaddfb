"""The guest's PCI tree, derived from a domain XML alone (plus the host's ids for endpoints).

It is a :class:`Topology` like the host's, so the same classifier judges it. Bus numbers are
predicted the way guest firmware assigns them: each expander bus's root bus is its ``busNr``,
and below it every bridge takes the next free bus number in depth-first order of slot/function.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from lxml import etree

from pcitopo.libvirt.domain import DOWNSTREAM, PXB, ROOT_PORT, UPSTREAM, DomainView, GuestAddress, NumaCell, PciController
from pcitopo.model.keep import PerModel, Recent, recent
from pcitopo.model.tree import Bdf, NumaNode, PciFunction, Topology

# What QEMU's emulated parts present in the guest (never Broadcom, so NCCL never flattens them).
GUEST_IDS = {
    ROOT_PORT: (0x1B36, 0x000C),
    UPSTREAM: (0x104C, 0x8232),
    DOWNSTREAM: (0x104C, 0x8233),
}
BRIDGE_CLASS = 0x060400


class LayoutController(NamedTuple):
    """What the guest tree takes of a ``<controller type='pci'>``."""

    index: int
    model: str
    address: GuestAddress | None
    bus_nr: int | None
    node: int | None
    alias: str | None = None  # the MMIO budget's root ports are ours by their alias


@dataclass(frozen=True)
class GuestLayout:
    """All the guest's PCI tree follows from, read off a domain: its PCI controllers, the guest
    address and host source of each PCI hostdev, its NUMA cells and whether it has ACPI.
    Read once per call off the placed domain (:func:`layout_of`); hashable: the tree derived
    from a layout is kept per host model (:data:`VIEWS`)."""

    acpi: bool
    controllers: tuple[LayoutController, ...]
    hostdevs: tuple[tuple[GuestAddress | None, Bdf], ...]
    cells: tuple[NumaCell, ...]


@dataclass
class GuestView:
    topology: Topology
    host_to_guest: dict[Bdf, Bdf] = field(default_factory=dict)
    # guest cell of each expander bus root (None: no <node> or no ACPI)
    cells: dict[str, int | None] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    layout: GuestLayout | None = None


class _StaticLoader:
    def __init__(self, name: str, functions: dict[Bdf, PciFunction], nodes: dict[int, NumaNode]):
        self.name = name
        self._functions = functions
        self._nodes = nodes

    def load(self, bdf: Bdf) -> PciFunction | None:
        return self._functions.get(bdf)

    def all_bdfs(self) -> Iterable[Bdf]:
        return list(self._functions)

    def numa_nodes(self) -> Mapping[int, NumaNode]:
        return self._nodes


def layout_controller(c: PciController) -> LayoutController:
    return LayoutController(c.index, c.model, c.address, c.bus_nr, c.node, c.alias)


def layout_of(tree: etree._ElementTree, known: Mapping[etree._Element, LayoutController] | None = None) -> GuestLayout:
    """The layout of the domain ``tree``. ``known``: controller elements of this tree read
    already (the rewrite's, copied in from elements it read when it wrote them), by element."""
    view = DomainView(tree)
    known = known or {}
    return GuestLayout(
        view.has_acpi(),
        tuple(known.get(c.el) or layout_controller(c) for c in view.pci_controllers()),
        tuple((h.address, h.source) for h in view.pci_hostdevs()),
        tuple(view.numa_cells()),
    )


# The guest tree of each layout, per host model, for the last few allocations.
VIEWS: PerModel[Recent[GuestLayout, GuestView]] = recent()


def guest_view(layout: GuestLayout, host: Topology) -> GuestView:
    """The guest's tree as a domain of this ``layout`` makes it (shared between calls with the
    same layout on the same host model: not to be changed)."""
    return VIEWS(host).get(layout, lambda: _derive(layout, host))


def _derive(layout: GuestLayout, host: Topology) -> GuestView:
    ctrls = {c.index: c for c in layout.controllers}
    children: dict[int, list[tuple[GuestAddress, LayoutController | tuple[GuestAddress | None, Bdf]]]] = {}
    for c in ctrls.values():
        if c.address is not None:
            children.setdefault(c.address.bus, []).append((c.address, c))
    for hd in layout.hostdevs:
        if hd[0] is not None:
            children.setdefault(hd[0].bus, []).append((hd[0], hd))
    functions: dict[Bdf, PciFunction] = {}
    host_to_guest: dict[Bdf, Bdf] = {}
    cells: dict[str, int | None] = {}
    notes: list[str] = []

    def walk(index: int, bus: int, path: tuple[str, ...], node: int, counter: list[int]) -> None:
        for addr, item in sorted(children.get(index, []), key=lambda x: (x[0].slot, x[0].function)):
            bdf = Bdf(0, bus, addr.slot, addr.function)
            if isinstance(item, LayoutController):
                if item.model == PXB:
                    continue  # its own root bus, walked separately
                vendor, device = GUEST_IDS.get(item.model, (0x1B36, 0x0001))
                functions[bdf] = PciFunction(bdf, path + (str(bdf),), vendor, device, BRIDGE_CLASS, numa_node=node)
                secondary = counter[0]
                counter[0] += 1
                walk(item.index, secondary, path + (str(bdf),), node, counter)
            else:
                hf = host.find(item[1])
                if hf is None:
                    notes.append(f"hostdev {item[1]} is not on the host; left out of the guest model")
                    continue
                functions[bdf] = PciFunction(
                    bdf, path + (str(bdf),), hf.vendor, hf.device, hf.class_code,
                    subsystem_vendor=hf.subsystem_vendor, subsystem_device=hf.subsystem_device,
                    numa_node=node, link=hf.link,
                )
                host_to_guest[hf.bdf] = bdf

    walk(0, 0, ("pci0000:00",), -1, [1])
    pxbs = [(c.bus_nr, c) for c in ctrls.values() if c.model == PXB]
    for bus_nr, pxb in sorted(pxbs, key=lambda x: x[0] or 0):
        if bus_nr is None:
            notes.append(f"expander bus index {pxb.index} has no busNr: its guest bus numbers cannot be predicted")
            continue
        cell = pxb.node if layout.acpi else None
        rc = f"pci0000:{bus_nr:02x}"
        cells[rc] = cell
        walk(pxb.index, bus_nr, (rc,), cell if cell is not None else -1, [bus_nr + 1])
    nodes = {c.id: NumaNode(c.id, c.cpus) for c in layout.cells}
    return GuestView(Topology(_StaticLoader("guest", functions, nodes)), host_to_guest, cells, notes, layout)
