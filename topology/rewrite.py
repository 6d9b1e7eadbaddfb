"""The one function every door calls: domain XML + host model → rewritten domain XML + report.

parse (hardened) → facts → plan (pure) → edit the tree with lxml → derive the guest tree from the
output alone → classify host and guest pairs with the same classifier → report.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from lxml import etree

from .classify import PairClass, classify, nccl_device, nccl_path, pairs
from .domain import (
    DOWNSTREAM,
    PCIE_ROOT,
    PXB,
    QEMU_MODEL_NAME,
    ROOT_PORT,
    DomainView,
    GuestAddress,
    append_child,
    indent_subtree,
    indent_unit,
    parse_domain,
    read_guest_address,
    remove_element,
    serialize,
    write_guest_address,
)
from .errors import DomainError
from .guest import GuestView, guest_view
from .model import Bdf, Topology
from .plan import ControllerFact, DomainFacts, GuestController, HostdevFact, Plan, plan

UNEXPRESSIBLE = "no guest can show this"

# Elements libvirt places on a root port of pcie-root when they carry no address.
_PCI_DEVICE_TAGS = frozenset({"interface", "rng", "memballoon", "vsock", "filesystem", "watchdog", "shmem", "sound"})


@dataclass(frozen=True)
class RewriteOptions:
    """Knobs of the rewrite itself (hook-level options such as mode/on-error live in sidecar)."""

    # Write <node> on expander buses when the domain maps host nodes to guest cells.
    guest_numa: bool = True


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
    why: str | None

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
    changed: bool = False

    @property
    def fidelity_lost(self) -> list[PairReport]:
        """Pairs whose guest class differs from the host's for a reason that is neither the
        documented Broadcom collapse (NVML PXB → PIX where NCCL already says PIX) nor a host
        shape no guest can express (reported, with the reason, but not counted as lost)."""
        return [
            p for p in self.pairs
            if (not p.nccl_same or (not p.nvml_same and not _broadcom_collapse(p)))
            and not (p.why or "").startswith(UNEXPRESSIBLE)
        ]

    def summary(self) -> dict:
        return {
            "devices_placed": len(self.placed),
            "pxbs": self.created.get(PXB, 0),
            "root_ports": self.created.get(ROOT_PORT, 0),
            "switches": self.created.get("pcie-switch-upstream-port", 0),
            "downstream_ports": self.created.get(DOWNSTREAM, 0),
            "controllers_removed": self.removed,
            "numa": self.numa_source,
            "pairs": len(self.pairs),
            "pairs_nccl_equal": sum(p.nccl_same for p in self.pairs),
            "pairs_nvml_equal": sum(p.nvml_same for p in self.pairs),
            "fidelity_lost": len(self.fidelity_lost),
            "notes": list(self.notes),
        }


@dataclass(frozen=True)
class RewriteResult:
    xml: bytes
    report: Report
    guest: GuestView


def _broadcom_collapse(p: PairReport) -> bool:
    return (
        p.guest is not None
        and p.host.nvml.value == "PXB"
        and p.guest.nvml.value == "PIX"
        and p.host.nccl.value == "PIX"
        and p.guest.nccl.value == "PIX"
    )


def domain_facts(view: DomainView) -> DomainFacts:
    hostdevs = tuple(
        HostdevFact(i, hd.source, hd.alias, hd.address) for i, hd in enumerate(view.pci_hostdevs())
    )
    controllers = tuple(
        ControllerFact(c.index, c.model, c.alias, c.address, c.bus_nr, c.chassis) for c in view.pci_controllers()
    )
    others: list[GuestAddress] = []
    unplaced = legacy = 0
    for el in view.devices:
        if not isinstance(el.tag, str):
            continue
        if (el.tag == "hostdev" and el.get("type") == "pci") or (el.tag == "controller" and el.get("type") == "pci"):
            continue
        addr_el = el.find("address")
        if addr_el is not None and addr_el.get("type") == "pci":
            a = read_guest_address(el)
            if a is not None:
                others.append(a)
            continue
        if addr_el is None and _needs_pci_slot(el):
            if _conventional_pci(el):
                legacy += 1
            else:
                unplaced += 1
    # libvirt puts conventional PCI devices behind a pcie-to-pci-bridge in a root port: two
    # buses for the first 31 of them.
    unplaced += 2 * -(-legacy // 31)
    view_cells = tuple(view.numa_cells())
    return DomainFacts(
        hostdevs=hostdevs,
        controllers=controllers,
        other_addresses=tuple(others),
        unplaced_devices=unplaced,
        cells=view_cells,
        memnodes=tuple(view.memnodes()),
        vcpupins=tuple(view.vcpupins()),
        acpi=view.has_acpi(),
    )


# Models QEMU offers only as conventional PCI (no PCIe interface) on q35.
_CONVENTIONAL_PCI_MODELS = frozenset({"i6300esb", "e1000", "rtl8139", "ne2k_pci", "pcnet", "es1370", "ac97", "ich6", "lsilogic"})


def _conventional_pci(el: etree._Element) -> bool:
    model = el.get("model") or ""
    m = el.find("model")
    if m is not None:
        model = m.get("type") or model
    return model in _CONVENTIONAL_PCI_MODELS


def _needs_pci_slot(el: etree._Element) -> bool:
    if el.tag in _PCI_DEVICE_TAGS:
        model = el.find("model")
        return not (el.tag == "memballoon" and el.get("model") == "none") and (model is None or model.get("type") != "none")
    if el.tag == "disk":
        t = el.find("target")
        return t is not None and t.get("bus") == "virtio"
    if el.tag == "controller":
        return el.get("type") in ("virtio-serial", "scsi") or (el.get("type") == "usb" and el.get("model") not in (None, "none"))
    if el.tag == "input":
        return el.get("bus") == "virtio"
    return False


def _controller_element(c: GuestController) -> etree._Element:
    el = etree.Element("controller")
    el.set("type", "pci")
    el.set("index", str(c.index))
    el.set("model", c.model)
    etree.SubElement(el, "model").set("name", QEMU_MODEL_NAME[c.model])
    if c.model == PXB:
        target = etree.SubElement(el, "target")
        target.set("busNr", str(c.bus_nr))
        if c.node is not None:
            etree.SubElement(target, "node").text = str(c.node)
    elif c.chassis is not None:
        target = etree.SubElement(el, "target")
        target.set("chassis", str(c.chassis))
        target.set("port", f"0x{c.port or 0:x}")
    etree.SubElement(el, "alias").set("name", c.alias)
    if c.slot >= 0:  # spares get their pcie-root slot from libvirt
        write_guest_address(el, GuestAddress(c.parent, c.slot, c.function), c.multifunction)
    return el


def apply_plan(view: DomainView, p: Plan, options: RewriteOptions) -> tuple[Counter, bool]:
    devices = view.devices
    unit = indent_unit(view.tree)
    removed = set(p.removed)
    for c in view.pci_controllers():
        if c.index in removed:
            remove_element(c.el)
    anchor = None
    for el in devices:
        if isinstance(el.tag, str) and el.tag == "controller":
            anchor = el
    if p.added_pcie_root:
        root = etree.Element("controller")
        root.set("type", "pci")
        root.set("index", "0")
        root.set("model", PCIE_ROOT)
        if anchor is None and len(devices):
            devices[0].addprevious(root)
            root.tail = devices.text
        else:
            append_child(devices, root, after=anchor)
        anchor = root
    created: Counter = Counter()
    for c in p.controllers:
        if not options.guest_numa and c.node is not None:
            c = GuestController(**{**c.__dict__, "node": None})
        el = _controller_element(c)
        indent_subtree(el, 2, unit)
        append_child(devices, el, after=anchor)
        anchor = el
        created[c.model] += 1
    hostdevs = view.pci_hostdevs()
    normalised = False
    for pl in p.placements:
        hd = hostdevs[pl.key]
        write_guest_address(hd.el, pl.address, pl.multifunction)
        src = hd.source_address
        # libvirt's schema has no `type` on a hostdev source address (KubeVirt writes one);
        # we format it the way libvirt does so the output validates.
        if src is not None and "type" in src.attrib:
            del src.attrib["type"]
            normalised = True
    return created, normalised


def rewrite_domain(domain_xml: bytes, host: Topology, options: RewriteOptions | None = None) -> RewriteResult:
    options = options or RewriteOptions()
    tree = parse_domain(domain_xml)
    view = DomainView(tree)
    view.check_q35()
    facts = domain_facts(view)
    p = plan(host, facts)
    created, normalised = apply_plan(view, p, options)
    out = serialize(tree, domain_xml)
    report = Report(
        created=created,
        removed=len(p.removed),
        numa_map=dict(p.numa_map),
        numa_source=p.numa_source,
        notes=list(p.notes),
    )
    if normalised:
        report.notes.append("hostdev source addresses written without type='pci', as libvirt formats them (its schema has no such attribute)")
    guest = verify(tree, host, facts, report)
    report.changed = _canonical(out) != _canonical(domain_xml)
    return RewriteResult(out, report, guest)


def verify(tree: etree._ElementTree, host: Topology, facts: DomainFacts, report: Report) -> GuestView:
    """Derive the guest tree from the output alone and judge every pair of placed devices with
    the same classifier as the host."""
    guest = guest_view(tree, host)
    report.notes += guest.notes
    placed = []
    for hd in facts.hostdevs:
        f = host.function(hd.source)
        gbdf = guest.host_to_guest.get(f.bdf)
        cell = None
        if gbdf is not None:
            gf = guest.topology.function(gbdf)
            cell = gf.numa_node if gf.numa_node >= 0 else None
        placed.append(PlacedDevice(f.bdf, hd.alias, gbdf, host.role(f).value, host.numa_of(f), cell))
    report.placed = placed
    no_cells = not report.numa_map
    for a, b in pairs([d.host for d in placed]):
        hc = classify(host, a, b)
        ga, gb = guest.host_to_guest.get(a), guest.host_to_guest.get(b)
        gc = classify(guest.topology, ga, gb) if ga is not None and gb is not None else None
        why = None
        if gc is None:
            why = "not placed in the guest"
        elif gc != hc:
            why = _why_differs(hc, gc, no_cells, facts.acpi)
            odd = [f for f in (host.function(a), host.function(b)) if _numa_divergent(host, f)]
            if odd:
                f = odd[0]
                why = (f"{UNEXPRESSIBLE}: above {f.bdf} the host reports numa_node "
                       f"{nccl_path(host, f).cpu} where NCCL looks (the top-most PCI node), while its "
                       f"root complex {f.root_complex} is on node {host.numa_of(f)}; an expander bus has one guest cell")
        report.pairs.append(PairReport(a, b, hc, gc, why))
    return guest


def _numa_divergent(host: Topology, f) -> bool:
    """NCCL's CPU for a device (raw numa_node of its top-most PCI node) is not the node the
    model (and so the planner) places it on: firmware left numa_node out or at -1 somewhere."""
    return nccl_path(host, f).cpu != host.numa_of(nccl_device(host, f))


def _why_differs(hc: PairClass, gc: PairClass, no_cells: bool, acpi: bool) -> str:
    # The Broadcom collapse is judged first: it happens with or without NUMA cells.
    if hc.nccl == gc.nccl and hc.nvml.value == "PXB" and gc.nvml.value == "PIX":
        return "Broadcom two-level complex collapsed into one virtual switch, as NCCL flattens it (nvidia-smi on the host says PXB)"
    if not acpi:
        return "no <features><acpi/>: the guest sees no NUMA, so SYS/NODE collapse"
    if no_cells:
        return "no guest NUMA cells tied to host nodes: cross-node pairs cannot show SYS"
    return "unexpected difference (planner bug: please report with `pcitopo capture`)"


def _canonical(xml: bytes) -> bytes:
    try:
        return etree.tostring(etree.fromstring(xml, etree.XMLParser(remove_blank_text=True, resolve_entities=False)), method="c14n")
    except etree.XMLSyntaxError:
        raise DomainError("output XML does not parse (internal error)") from None


__all__ = ["RewriteOptions", "RewriteResult", "Report", "rewrite_domain"]
