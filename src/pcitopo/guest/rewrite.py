"""The one function every entry point calls: domain XML + host model → rewritten domain XML + report.

parse (hardened) → facts → plan (pure) → edit the tree with lxml → derive the guest tree from the
output alone → classify host and guest pairs with the same classifier → report.
"""

from __future__ import annotations

import copy
from collections import Counter
from dataclasses import dataclass, field
from enum import StrEnum

from lxml import etree

from pcitopo.errors import DomainError
from pcitopo.guest.buses import root_ports_added
from pcitopo.guest.cells import MissingCells, missing_cells

# The MMIO budget and P2P cliques are decided in their own modules; the rewrite only applies them.
from pcitopo.guest.cliques import CliquePlan
from pcitopo.guest.facts import ControllerFact, DomainFacts, GuestController, HostdevFact, HotplugPorts, Plan
from pcitopo.guest.mmio import MmioBudget, apply_mmio_settings
from pcitopo.guest.ncclfile import NcclFile, write_nccl_file
from pcitopo.guest.plan import plan
from pcitopo.guest.view import GuestLayout, GuestView, LayoutController, guest_view, layout_controller, layout_of
from pcitopo.libvirt import document
from pcitopo.libvirt.domain import (
    DOWNSTREAM,
    HOSTDEV_MODE,
    PCIE_ROOT,
    PXB,
    QEMU_NS,
    ROOT_PORT,
    UPSTREAM,
    DomainView,
    GuestAddress,
    PciController,
    pci_controller_element,
    read_guest_address,
    write_guest_address,
)
from pcitopo.libvirt.fwcfg import encode, set_entries as set_fwcfg_entries
from pcitopo.libvirt.links import apply_links, oldest_qemu
from pcitopo.libvirt.machine import memory_bytes
from pcitopo.model.cpuinfo import HostWidth
from pcitopo.model.keep import recent
from pcitopo.model.tree import Bdf, Topology
from pcitopo.nccl.topoxml import FWCFG_NAME
from pcitopo.paths.classify import PairClass, classify, nccl_device, nccl_path, pairs


class Why(StrEnum):
    """Why a pair's guest class differs from the host's (the value is the report text)."""

    NOT_PLACED = "not placed in the guest"
    BROADCOM_COLLAPSE = (
        "Broadcom two-level complex collapsed into one virtual switch, as NCCL flattens it (nvidia-smi on the host says PXB)"
    )
    NO_ACPI = "no <features><acpi/>: the guest sees no NUMA, so SYS/NODE collapse"
    NO_CELLS = "no guest NUMA cells tied to host nodes: cross-node pairs cannot show SYS"
    # Devices whose host node backs no guest cell (the pod's CPUs are elsewhere): the NUMA line
    # (``Report.missing_cells``) names them and the fix.
    MISSING_CELLS = "a device's host NUMA node has no guest cell (see the NUMA line)"
    # A host shape no guest can express; ``PairReport.detail`` says which.
    UNEXPRESSIBLE = "no guest can show this"
    UNEXPECTED = "unexpected difference (planner bug: please report with `pcitopo capture`)"


@dataclass(frozen=True)
class PlacedDevice:
    host: Bdf
    alias: str | None
    guest: Bdf | None
    role: str
    host_node: int
    guest_cell: int | None


@dataclass(frozen=True)
class PairReport:
    a: Bdf
    b: Bdf
    host: PairClass
    guest: PairClass | None
    why: Why | None
    detail: str | None = None  # what exactly, for Why.UNEXPRESSIBLE

    @property
    def reason(self) -> str | None:
        """The reason as the report prints it: the why, and its detail if any."""
        if self.why is None:
            return None
        return f"{self.why}: {self.detail}" if self.detail else str(self.why)

    @property
    def nccl_same(self) -> bool:
        return self.guest is not None and self.guest.nccl == self.host.nccl

    @property
    def nvml_same(self) -> bool:
        return self.guest is not None and self.guest.nvml == self.host.nvml


@dataclass
class Report:
    placed: list[PlacedDevice] = field(default_factory=list)
    created: Counter = field(default_factory=Counter)
    removed: int = 0
    numa_map: dict[int, int] = field(default_factory=dict)
    numa_source: str = "none"
    notes: list[str] = field(default_factory=list)
    pairs: list[PairReport] = field(default_factory=list)
    # The NVLink fabric verdict (pcitopo.paths.partitions.NvlinkVerdict) when the caller checked one.
    nvlink: object | None = None
    # The pairing check's (policy, pcitopo.paths.pairing.PairingVerdict) when the caller ran it.
    pairing: tuple[str, object] | None = None
    # the 64-bit MMIO budget and settings, P2P cliques, typed firmware warnings
    mmio: MmioBudget | None = None
    cliques: CliquePlan | None = None
    warnings: list = field(default_factory=list)
    # root ports given the host's link (link: auto); GPUs and NICs in the fw_cfg NCCL file
    link_ports: int = 0
    nccl_topo_devices: int = 0
    # placed devices on host nodes without a guest cell, and the fix (pcitopo.guest.cells)
    missing_cells: MissingCells | None = None
    # the bare root ports left for hotplug (pcitopo.guest.facts.HotplugPorts)
    hotplug: HotplugPorts | None = None

    @property
    def fidelity_lost(self) -> list[PairReport]:
        """Pairs whose guest class differs from the host's for a reason that is neither the
        documented Broadcom collapse (NVML PXB → PIX where NCCL already says PIX) nor a host
        shape no guest can express (reported, with the reason, but not counted as lost)."""
        return [
            p for p in self.pairs
            if (not p.nccl_same or (not p.nvml_same and not broadcom_collapse(p.host, p.guest)))
            and p.why is not Why.UNEXPRESSIBLE
        ]

    def summary(self) -> dict:
        return {
            "devices_placed": len(self.placed),
            "pxbs": self.created.get(PXB, 0),
            "root_ports": self.created.get(ROOT_PORT, 0),
            "switches": self.created.get(UPSTREAM, 0),
            "downstream_ports": self.created.get(DOWNSTREAM, 0),
            "controllers_removed": self.removed,
            "numa": self.numa_source,
            "fidelity_lost": len(self.fidelity_lost),
            "notes": list(self.notes),
            "mmio": self.mmio.summary() if self.mmio is not None else None,
            "p2p_cliques": len(self.cliques.members) if self.cliques is not None else 0,
            "warnings": [f"{w.kind}: {w.reason}" for w in self.warnings],
            "link_ports": self.link_ports,
            "nccl_topo_devices": self.nccl_topo_devices,
            "numa_cells": self.missing_cells.line if self.missing_cells is not None else None,
            "hotplug_ports": self.hotplug.kept if self.hotplug is not None else None,
            "hotplug_ports_lost": self.hotplug.lost if self.hotplug is not None else 0,
        }


@dataclass(frozen=True)
class RewriteResult:
    xml: bytes
    report: Report
    guest: GuestView
    input_xml: bytes
    # NCCL's topology file for the predicted guest (xmlfix --nccl-topo; in the domain's fw_cfg
    # under nccl-topo: fwcfg)
    nccl_topo: NcclFile = field(default_factory=NcclFile)

    @property
    def changed(self) -> bool:
        """Whether the rewrite changed anything beyond formatting (xmlfix --check asks; the
        sidecar never does, so the two canonicalisations stay off the per-call path)."""
        return _canonical(self.xml) != _canonical(self.input_xml)


def broadcom_collapse(host: PairClass, guest: PairClass | None) -> bool:
    """The one documented difference: a Broadcom two-level complex mirrored as one virtual
    switch, the way NCCL flattens it. NCCL's class is unchanged; nvidia-smi's PXB reads PIX."""
    return guest is not None and host.nccl == guest.nccl and (host.nvml.value, guest.nvml.value) == ("PXB", "PIX")


def domain_facts(view: DomainView) -> DomainFacts:
    hostdevs = tuple(
        HostdevFact(i, hd.source, hd.alias, hd.address) for i, hd in enumerate(view.pci_hostdevs())
    )
    controllers = tuple(
        ControllerFact(c.index, c.model, c.alias, c.address, c.bus_nr, c.chassis) for c in view.pci_controllers()
    )
    others: list[GuestAddress] = []
    for el in view.devices:
        if not isinstance(el.tag, str):
            continue
        if (el.tag == "hostdev" and el.get("type") == "pci") or (el.tag == "controller" and el.get("type") == "pci"):
            continue
        a = read_guest_address(el)
        if a is not None:
            others.append(a)
    pcie, conventional = view.unplaced_pci_devices()
    view_cells = tuple(view.numa_cells())
    return DomainFacts(
        hostdevs=hostdevs,
        controllers=controllers,
        other_addresses=tuple(others),
        unplaced_pcie=pcie,
        unplaced_conventional=conventional,
        cells=view_cells,
        memnodes=tuple(view.memnodes()),
        vcpupins=tuple(view.vcpupins()),
        acpi=view.has_acpi(),
        kubevirt_pci_devices=view.kubevirt_pci_devices(),
        memory=memory_bytes(view.root),
    )


def _controller_element(c: GuestController) -> etree._Element:
    return pci_controller_element(
        c.index, c.model, alias=c.alias, bus_nr=c.bus_nr, node=c.node, chassis=c.chassis, port=c.port or 0,
        # spares (slot -1) get their pcie-root slot from libvirt
        address=GuestAddress(c.parent, c.slot, 0) if c.slot >= 0 else None,
    )


@dataclass(frozen=True)
class Written:
    """The plan's controllers as written for a document indented by one unit, and each as the
    guest layout reads it (read off these elements, which every call copies in as they are)."""

    elements: tuple[etree._Element, ...]
    layout: tuple[LayoutController, ...]


def controller_elements(p: Plan, unit: str) -> Written:
    """The plan's controllers as written, indented for a document indented by ``unit``: built
    once per plan, copied into each call's domain."""
    out = []
    for c in p.controllers:
        el = _controller_element(c)
        document.indent_subtree(el, 2, unit)
        out.append(el)
    return Written(tuple(out), tuple(layout_controller(PciController(el)) for el in out))


def apply_plan(view: DomainView, p: Plan, written: Written) -> tuple[Counter, set[str], dict[etree._Element, LayoutController]]:
    """``written``: :func:`controller_elements` of ``p`` for this document (copied in). Returns
    the controllers created by model, the hostdev spellings normalised, and the copies made,
    each with its layout (``layout_of``'s ``known``)."""
    devices = view.devices
    removed = set(p.removed)
    for c in view.pci_controllers():
        if c.index in removed:
            document.remove_element(c.el)
    anchor = None
    for el in devices:
        if isinstance(el.tag, str) and el.tag == "controller":
            anchor = el
    if p.added_pcie_root:
        root = pci_controller_element(0, PCIE_ROOT)
        if anchor is None and len(devices):
            devices[0].addprevious(root)
            root.tail = devices.text
        else:
            document.append_child(devices, root, after=anchor)
        anchor = root
    created = Counter(c.model for c in p.controllers)
    copies = {copy.deepcopy(template): read for template, read in zip(written.elements, written.layout)}
    document.append_children(devices, copies, after=anchor)
    hostdevs = view.pci_hostdevs()
    # Formatted as libvirt formats them, so the output validates against libvirt's schema.
    normalised: set[str] = set()
    for pl in p.placements:
        hd = hostdevs[pl.key]
        write_guest_address(hd.el, pl.address, pl.multifunction)
        normalised.update(hd.format_as_libvirt())
    return created, normalised, copies


# What follows from a host model and one allocation, kept per model for the last few
# allocations (src/pcitopo/model/keep.py): a VM boot's repeated defines, and equal allocations,
# are answered from here. Each is keyed by all it reads besides the model.
PLANS = recent()  # DomainFacts -> Plan
ELEMENTS = recent()  # (DomainFacts, indent unit) -> the plan's controllers as written
VERDICTS = recent()  # (GuestLayout, hostdevs, no cells, acpi) -> placed devices and judged pairs
NCCL_FILES = recent()  # (GuestLayout, placed devices) -> NCCL's topology file


def rewrite_domain(domain_xml: bytes, host: Topology, *, mmio: bool = True, p2p_clique: bool = True,
                   host_phys_bits: int | HostWidth | None = None, link: bool = True,
                   nccl_topo: bool = True) -> RewriteResult:
    """``mmio``/``p2p_clique``/``link``/``nccl_topo``: the hook options of the same names
    (``auto``/``fwcfg`` = True); ``host_phys_bits``: the host CPU's address width
    (``host.host_width()``, which says where it came from, or a bare number; None: unknown, not
    checked)."""
    tree = document.parse_domain(domain_xml)
    view = DomainView(tree)
    view.check_q35()
    facts = domain_facts(view)
    p = PLANS(host).get(facts, lambda: plan(host, facts))  # a pure function of the two
    unit = document.indent_unit(tree)
    created, normalised, copies = apply_plan(view, p, ELEMENTS(host).get((facts, unit), lambda: controller_elements(p, unit)))
    # The placed domain's PCI layout, read once: the MMIO budget and the guest tree both follow
    # from it (what comes after changes no controller, hostdev address or NUMA cell).
    layout = layout_of(tree, copies)
    # what libvirt will still place is what it was before the plan (it moves only PCI controllers and hostdevs)
    added = root_ports_added(facts.unplaced_pcie, facts.unplaced_conventional, max((c.index for c in layout.controllers), default=0),
                             p.hotplug.free if p.hotplug is not None else 0)
    # MMIO settings and P2P cliques go on the placed domain: they depend on where devices sit
    budget, cliques = apply_mmio_settings(view.root, host, layout, [(hd.source, hd.alias) for hd in facts.hostdevs], mmio=mmio,
                                          p2p_clique=p2p_clique, host_bits=host_phys_bits, added_ports=added)
    link_ports = apply_links(view.root, {c.alias: c.link for c in p.controllers if link and c.link is not None})
    report = Report(
        created=created,
        removed=len(p.removed),
        numa_map=dict(p.numa_map),
        numa_source=p.numa_source,
        notes=list(p.notes),
        hotplug=p.hotplug,
    )
    # The MMIO budget replaces a <pcihole64> note: pcihole64 only sizes pcie.0's window
    report.mmio, report.cliques = budget, cliques
    if budget is not None:
        report.notes += budget.notes
        report.warnings += budget.warnings
    if cliques is not None:
        report.notes += cliques.notes
    # every PCI hostdev, placed or not: KubeVirt's Plugins pipeline cannot read one without mode
    moded = sum(hd.give_mode() for hd in view.pci_hostdevs())
    if moded:
        report.notes.append(f"{moded} hostdev(s) given libvirt's default mode='{HOSTDEV_MODE}' (KubeVirt leaves it "
                            f"out; its Plugins pipeline refuses a hostdev without it, kubevirt#18861)")
    if normalised:
        report.notes.append(f"hostdevs written as libvirt formats them (its schema has no room for what KubeVirt "
                            f"sent): dropped {', '.join(sorted(normalised))}")
    guest = verify(layout, host, facts, report)
    report.link_ports = link_ports
    placed = tuple(d.host for d in report.placed)
    # the file follows from the guest's layout and the placed devices alone: one per allocation
    nccl = NCCL_FILES(host).get((guest.layout, placed), lambda: write_nccl_file(host, guest.topology, guest.host_to_guest, placed))
    set_fwcfg_entries(view.root, lambda name: name == FWCFG_NAME, {FWCFG_NAME: encode(nccl.data)} if nccl_topo and nccl.data else {})
    report.nccl_topo_devices = nccl.devices if nccl_topo else 0
    report.notes += link_notes(link_ports, p.controllers if link else [], nccl if nccl_topo else None, created.get(UPSTREAM, 0))
    # KubeVirt's re-parse loses the root's xmlns:qemu: declare it there again, so every call's
    # output reads the same (last: it may give the tree a new root element)
    document.declare_on_root(tree, "qemu", QEMU_NS)
    return RewriteResult(document.serialize(tree, domain_xml), report, guest, domain_xml, nccl)


def link_notes(link_ports: int, controllers: list[GuestController], nccl: NcclFile | None, switches: int) -> list[str]:
    """What the report says about link speeds: what the root ports and the NCCL file carry, or
    what NCCL will misjudge without them."""
    out = []
    if link_ports:
        need = oldest_qemu(c.link for c in controllers if c.link is not None)
        out.append(f"{link_ports} root port(s) report the host's link speed and width (x-speed/x-width)"
                   + (f"; {need[0]} GT/s needs QEMU {need[1]} or later" if need else ""))
    if nccl is not None and nccl.data:
        out.append(f"NCCL's topology file for this guest ({nccl.gpus} GPU(s) and {nccl.nics} NIC(s), the host's link speeds) is "
                   f"passed through fw_cfg as {FWCFG_NAME}: install it in the guest on every boot (docs/GUEST.md)")
        out += nccl.notes
    elif switches:
        out.append(
            "QEMU's emulated switch upstream ports report a 2.5 GT/s x1 link: path classes are the host's, but "
            "NCCL's bandwidth estimate for paths from a switch up to the CPU is low (PIX paths, GPU to its own NIC, "
            "do not cross that link)"
        )
    return out


def verify(layout: GuestLayout, host: Topology, facts: DomainFacts, report: Report) -> GuestView:
    """Derive the guest tree from the output alone (its ``layout``) and judge every pair of
    placed devices with the same classifier as the host."""
    guest = guest_view(layout, host)
    report.notes += guest.notes
    hostdevs = tuple((hd.source, hd.alias) for hd in facts.hostdevs)
    no_cells = not report.numa_map
    placed, judged = VERDICTS(host).get((guest.layout, hostdevs, no_cells, facts.acpi),
                                        lambda: _judge(host, guest, hostdevs, no_cells, facts.acpi))
    report.placed = list(placed)
    report.pairs += judged
    report.missing_cells = missing_cells(placed, report.numa_map, host.numa_nodes())
    return guest


def _judge(host: Topology, guest: GuestView, hostdevs: tuple[tuple[Bdf, str | None], ...], no_cells: bool,
           acpi: bool) -> tuple[tuple[PlacedDevice, ...], tuple[PairReport, ...]]:
    placed = []
    for source, alias in hostdevs:
        f = host.function(source)
        gbdf = guest.host_to_guest.get(f.bdf)
        cell = None
        if gbdf is not None:
            gf = guest.topology.function(gbdf)
            cell = gf.numa_node if gf.numa_node >= 0 else None
        placed.append(PlacedDevice(f.bdf, alias, gbdf, host.role(f).value, host.numa_of(f), cell))
    # with cells for some host nodes, the devices of the others show numa_node -1 in the guest
    cell_less = set() if no_cells else {d.host for d in placed if d.host_node >= 0 and d.guest_cell is None}
    judged = []
    for a, b in pairs([d.host for d in placed]):
        hc = classify(host, a, b)
        ga, gb = guest.host_to_guest.get(a), guest.host_to_guest.get(b)
        gc = classify(guest.topology, ga, gb) if ga is not None and gb is not None else None
        why, detail = None, None
        if gc is None:
            why = Why.NOT_PLACED
        elif gc != hc:
            why = _why_differs(hc, gc, no_cells, acpi, bool(cell_less & {a, b}))
            odd = [f for f in (host.function(a), host.function(b)) if _numa_divergent(host, f)]
            if odd:
                f = odd[0]
                why = Why.UNEXPRESSIBLE
                detail = (f"above {f.bdf} the host reports numa_node "
                          f"{nccl_path(host, f).cpu} where NCCL looks (the top-most PCI node), while its "
                          f"root complex {f.root_complex} is on node {host.numa_of(f)}; an expander bus has one guest cell")
        judged.append(PairReport(a, b, hc, gc, why, detail))
    return tuple(placed), tuple(judged)


def _numa_divergent(host: Topology, f) -> bool:
    """NCCL's CPU for a device (raw numa_node of its top-most PCI node) is not the node the
    model (and so the planner) places it on: firmware left numa_node out or at -1 somewhere."""
    return nccl_path(host, f).cpu != host.numa_of(nccl_device(host, f))


def _why_differs(hc: PairClass, gc: PairClass, no_cells: bool, acpi: bool, cell_less: bool) -> Why:
    """``cell_less``: an end of the pair is on a host node that backs no guest cell."""
    # The Broadcom collapse is judged first: it happens with or without NUMA cells.
    if broadcom_collapse(hc, gc):
        return Why.BROADCOM_COLLAPSE
    if not acpi:
        return Why.NO_ACPI
    if no_cells:
        return Why.NO_CELLS
    if cell_less:
        return Why.MISSING_CELLS
    return Why.UNEXPECTED


def _canonical(xml: bytes) -> bytes:
    try:
        return etree.tostring(etree.fromstring(xml, etree.XMLParser(remove_blank_text=True, resolve_entities=False)), method="c14n")
    except etree.XMLSyntaxError:
        raise DomainError("output XML does not parse (internal error)") from None


__all__ = ["PairReport", "RewriteResult", "Report", "Why", "rewrite_domain"]
