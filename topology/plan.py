"""The mirror planner: a pure function of (host model, domain facts) → guest layout.

The guest tree is the host tree restricted to the assigned devices:
- one pcie-expander-bus per host root complex, on the guest cell mapped to its host NUMA node;
- one pcie-root-port per host root port used (a synthetic one for an endpoint on a root bus);
- one upstream port with one downstream port per used child for each host switch, where a
  Broadcom two-level complex that NCCL flattens becomes one virtual switch (the same pass the
  classifier uses) and a genuine nesting stays nested;
- endpoints at slot 0 of their port; the functions under one host port share one guest slot.
Every rule below lives once: alias naming (:func:`alias_for`), bus budgeting
(:func:`budget_buses`), NUMA mapping (:func:`map_numa`), index allocation (:func:`allocate_indexes`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from .classify import nccl_switch_rep
from .domain import (
    DOWNSTREAM,
    OUR_ALIAS_PREFIX,
    PCIE_ROOT,
    PXB,
    ROOT_PORT,
    UPSTREAM,
    GuestAddress,
    NumaCell,
    parse_cpuset,
)
from .errors import DomainError, PlanError, quoted
from .model import Bdf, PciFunction, Role, Topology, root_complex_sort_key

BUS_COUNT = 256
MAX_FUNCTIONS_PER_SLOT = 8
SLOTS_PER_BUS = 32
# KubeVirt appends bare pcie-root-ports for hotplug while the highest PCI index is below this.
KUBEVIRT_HOTPLUG_INDEX_LIMIT = 32
# pcie-root slots we never take: 0 host bridge, 1 primary VGA, 0x1f ICH9 LPC/SATA/SMBus.
RESERVED_ROOT_SLOTS = frozenset({0x00, 0x01, 0x1F})
PXB_SLOT_ORDER = tuple(range(0x10, 0x1F)) + tuple(range(0x02, 0x10))


# -- facts in -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class HostdevFact:
    key: int
    source: Bdf
    alias: str | None
    address: GuestAddress | None


@dataclass(frozen=True)
class ControllerFact:
    index: int
    model: str
    alias: str | None
    address: GuestAddress | None
    bus_nr: int | None
    chassis: int | None

    @property
    def ours(self) -> bool:
        return (self.alias or "").startswith(OUR_ALIAS_PREFIX)


@dataclass(frozen=True)
class DomainFacts:
    hostdevs: tuple[HostdevFact, ...]
    controllers: tuple[ControllerFact, ...]
    # guest addresses of every other addressed element (disks, NICs, videos, ...)
    other_addresses: tuple[GuestAddress, ...]
    # devices libvirt will still have to place on pcie-root: PCIe ones (a root port each) and
    # conventional PCI ones (behind a pcie-to-pci-bridge in a root port, 31 per bridge)
    unplaced_pcie: int
    unplaced_conventional: int
    cells: tuple[NumaCell, ...]
    memnodes: tuple[tuple[int, str], ...]
    vcpupins: tuple[tuple[int, str], ...]
    acpi: bool


# -- layout out ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class GuestController:
    model: str
    index: int
    alias: str
    parent: int
    slot: int  # on the parent's bus; -1: no address (libvirt picks a pcie-root slot)
    bus_nr: int | None = None
    node: int | None = None
    chassis: int | None = None
    port: int | None = None
    mirrors: str = ""  # what on the host this stands for, for people


@dataclass(frozen=True)
class Placement:
    key: int
    source: Bdf
    alias: str | None
    address: GuestAddress
    multifunction: bool


@dataclass
class Plan:
    controllers: list[GuestController]
    placements: list[Placement]
    removed: list[int]  # indexes of controllers to delete (ours from earlier calls, taken-over ones)
    numa_map: dict[int, int]  # host NUMA node → guest cell
    numa_source: str
    notes: list[str] = field(default_factory=list)
    pcie_root_buses_needed: int = 0
    added_pcie_root: bool = False


# -- the mirror tree (host-side shapes, before indexes) -----------------------------------------

@dataclass
class _Port:
    """A guest port (root or downstream) and what hangs below it."""

    key: str
    host: PciFunction | None
    functions: list[PciFunction] = field(default_factory=list)
    switch: "_Switch | None" = None


@dataclass
class _Switch:
    key: str
    host: PciFunction
    ports: dict[str, _Port] = field(default_factory=dict)


@dataclass
class _RootComplex:
    name: str
    root_ports: dict[str, _Port] = field(default_factory=dict)
    numa: Counter = field(default_factory=Counter)


def alias_for(kind: str, host_name: str, extra: int = 0) -> str:
    """The one alias rule: ua-pcitopo-<kind>-<host element>, [a-z0-9-] only."""
    safe = host_name.lower().replace(":", "-").replace(".", "-")
    return f"{OUR_ALIAS_PREFIX}{kind}-{safe}" + (f"-{extra}" if extra else "")


def build_mirror(host: Topology, devices: list[PciFunction]) -> dict[str, _RootComplex]:
    rcs: dict[str, _RootComplex] = {}
    for f in devices:
        rc = rcs.setdefault(f.root_complex, _RootComplex(f.root_complex))
        rc.numa[host.numa_of(f)] += 1
        ancestry = host.ancestry(f)
        if not ancestry or host.role(ancestry[0]) != Role.ROOT_PORT:
            # An endpoint on the root bus: the guest needs a root port for it (pxbs take only
            # root ports); PHB to everything else either way.
            key = f"rciep-{f.bdf.domain:04x}-{f.bdf.bus:02x}-{f.bdf.slot:02x}"
            port = rc.root_ports.setdefault(key, _Port(key, None))
            port.functions.append(f)
            continue
        rp = ancestry[0]
        port = rc.root_ports.setdefault(str(rp.bdf), _Port(str(rp.bdf), rp))
        # Below the root port the ancestry alternates upstream, downstream port.
        below = ancestry[1:]
        pairs = [(below[i], below[i + 1]) for i in range(0, len(below) - 1, 2)]
        if len(below) % 2:
            raise PlanError(f"{f.bdf}: unexpected bridge shape below {rp.bdf} (an upstream port without a downstream port)")
        reps = nccl_switch_rep([us for us, _ in pairs])
        current_switch: _Switch | None = None
        for (us, ds), rep in zip(pairs, reps):
            if current_switch is not None and current_switch.key == str(rep):
                # A Broadcom level-1 virtual switch NCCL folds into its parent: the parent's
                # downstream port and this upstream port vanish; this downstream port joins the parent.
                del current_switch.ports[port.key]
            else:
                if port.switch is None:
                    port.switch = _Switch(str(rep), host.function(rep))
                elif port.switch.key != str(rep):
                    raise PlanError(f"{f.bdf}: two switches below one port {port.key}")
                current_switch = port.switch
            port = current_switch.ports.setdefault(str(ds.bdf), _Port(str(ds.bdf), ds))
        port.functions.append(f)
    return rcs


# -- NUMA ---------------------------------------------------------------------------------------

def map_numa(host: Topology, facts: DomainFacts) -> tuple[dict[int, int], str, list[str]]:
    """Host NUMA node → guest cell: from <numatune><memnode> (guestMappingPassthrough), else
    from vCPU pinning, else nothing (and we never invent cells)."""
    notes: list[str] = []
    cells = {c.id: c for c in facts.cells}
    if not cells:
        return {}, "none", ["the domain has no guest NUMA cells: expander buses get no <node>, devices show numa_node -1"]
    mapping: dict[int, int] = {}
    for cell, nodeset in sorted(facts.memnodes):
        if cell not in cells:
            notes.append(f"memnode for cell {cell} names no existing cell; ignored")
            continue
        nodes = parse_cpuset(nodeset)
        if len(nodes) > 1:
            notes.append(f"guest cell {cell} spans host nodes {nodeset}: they will look like one node")
        for n in sorted(nodes):
            if n in mapping and mapping[n] != cell:
                notes.append(f"host node {n} backs guest cells {mapping[n]} and {cell}; using {mapping[n]}")
                continue
            mapping[n] = cell
    if mapping:
        return mapping, "numatune memnode", notes
    # Fall back to vCPU pinning: the host node holding most of a cell's pinned CPUs.
    node_of_cpu: dict[int, int] = {}
    for nid, n in host.numa_nodes().items():
        try:
            for cpu in parse_cpuset(n.cpulist or ""):
                node_of_cpu[cpu] = nid
        except DomainError:
            notes.append(f"host NUMA node {nid} has an unreadable cpulist; ignored for pinning")
    pins = dict(facts.vcpupins)
    parsed: dict[str, set[int]] = {}
    for cell in sorted(cells.values(), key=lambda c: c.id):
        pinned: set[int] = set()
        for cpuset in {pins[v] for v in parse_cpuset(cell.cpus or "") if v in pins}:
            if cpuset not in parsed:
                parsed[cpuset] = parse_cpuset(cpuset)
            pinned |= parsed[cpuset]
        votes = Counter(node_of_cpu[c] for c in pinned if c in node_of_cpu)
        if votes:
            mapping.setdefault(votes.most_common(1)[0][0], cell.id)
    if mapping:
        return mapping, "vcpu pinning", notes
    notes.append("no memnode map and no vCPU pinning tie guest cells to host nodes: expander buses get no <node>")
    return {}, "none", notes


# -- indexes, buses, slots -------------------------------------------------------------------

def allocate_indexes(kept: set[int], count: int) -> list[int]:
    """The lowest ``count`` indexes not kept, ascending: fills gaps so none remain."""
    out, i = [], 1
    while len(out) < count:
        if i not in kept:
            out.append(i)
        i += 1
    return out


def pcie_root_buses_for(facts: DomainFacts) -> int:
    """Buses below pcie-root that libvirt's own placements will take after our call."""
    bridges = -(-facts.unplaced_conventional // 31)
    return facts.unplaced_pcie + 2 * bridges


def budget_buses(pxb_sizes: list[int], pcie_root_needed: int) -> list[int]:
    """busNr per expander bus (in order), packed at the top of the 256 buses so pcie-root keeps
    everything below the lowest one. Each pxb reserves its root bus plus one bus per bridge."""
    total = sum(pxb_sizes)
    lowest = BUS_COUNT - total
    if lowest < pcie_root_needed or (pxb_sizes and lowest < 1):
        raise PlanError(
            f"out of PCI buses: the mirrored hierarchy needs {total} and pcie-root needs {pcie_root_needed}, "
            f"but a PCI domain has {BUS_COUNT}"
        )
    out, nr = [], lowest
    for size in pxb_sizes:
        out.append(nr)
        nr += size
    return out


def controllers_to_remove(facts: DomainFacts) -> set[int]:
    """Ours from earlier calls, plus foreign expander buses, switch ports and pxb root ports
    left empty once the hostdevs move (KubeVirt's PCINUMAAwareTopology layout). Root ports on
    pcie-root stay: they carry other devices or are hotplug capacity. A worklist, so a chain of
    N empty controllers costs O(N), not a pass per removal."""
    by_index = {c.index: c for c in facts.controllers}
    removed = {c.index for c in facts.controllers if c.ours}
    users: Counter = Counter()  # hostdevs are all moving: they hold none of their old controllers
    for a in facts.other_addresses:
        users[a.bus] += 1
    for c in facts.controllers:
        if c.address is not None and c.index not in removed:
            users[c.address.bus] += 1

    def removable(c: ControllerFact) -> bool:
        if c.index in removed or c.model == PCIE_ROOT or users[c.index]:
            return False
        parent = by_index.get(c.address.bus) if c.address else None
        on_pxb = parent is not None and parent.model == PXB
        return c.model in (PXB, UPSTREAM, DOWNSTREAM) or (c.model == ROOT_PORT and on_pxb)

    work = [c for c in facts.controllers if removable(c)]
    while work:
        c = work.pop()
        if not removable(c):
            continue
        removed.add(c.index)
        if c.address is not None:
            users[c.address.bus] -= 1
            parent = by_index.get(c.address.bus)
            if parent is not None and removable(parent):
                work.append(parent)
    return removed


# -- the planner --------------------------------------------------------------------------------

def plan(host: Topology, facts: DomainFacts) -> Plan:
    notes: list[str] = []
    seen: dict[Bdf, HostdevFact] = {}
    devices: list[PciFunction] = []
    for hd in facts.hostdevs:
        if hd.source in seen:
            raise DomainError(f"hostdev {hd.source} is assigned twice ({quoted(seen[hd.source].alias)} and {quoted(hd.alias)})")
        seen[hd.source] = hd
        f = host.find(hd.source)
        if f is None:
            raise DomainError(f"hostdev {quoted(hd.alias or '')} source {hd.source} is not a PCI function on this host ({host.name})")
        if f.is_bridge:
            raise DomainError(f"hostdev {hd.source} is a PCI bridge; only endpoints can be assigned")
        devices.append(f)

    numa_map, numa_source, numa_notes = map_numa(host, facts)
    notes += numa_notes
    if not facts.acpi:
        notes.append("the domain has no <features><acpi/>: the guest ignores every <node> and shows numa_node -1")

    rcs = build_mirror(host, devices)

    dup = [i for i, n in Counter(c.index for c in facts.controllers).items() if n > 1]
    if dup:
        raise DomainError(f"duplicate pci controller index {dup[0]}")
    removed = controllers_to_remove(facts)
    kept = [c for c in facts.controllers if c.index not in removed]
    for c in kept:
        if c.model == PXB:
            raise PlanError(
                f"pcie-expander-bus index {c.index} (not ours) still carries other devices; "
                "cannot budget bus numbers around it"
            )

    # Order: root complexes by host order, ports by host BDF: the guest reads like the host.
    ordered_rcs = sorted(rcs.values(), key=lambda r: root_complex_sort_key(r.name))

    # Bus budget: each pxb = its root bus + one per bridge below it.
    sizes = [1 + sum(_port_bridges(p, ROOT_PORT) for p in rc.root_ports.values()) for rc in ordered_rcs]
    kept_indexes = {c.index for c in kept}
    has_root = any(c.model == PCIE_ROOT for c in kept)
    n_ours = sum(sizes)  # one controller per bus: each pxb and each bridge below it
    indexes = allocate_indexes(kept_indexes | {0}, n_ours)
    highest = max([0, *kept_indexes, *indexes])
    # Indexes left free below the highest (taking over a layout larger than ours) would be
    # filled by libvirt with root ports on pcie-root; we add those spares ourselves, counted.
    spares = sorted(set(range(1, highest + 1)) - kept_indexes - set(indexes))
    hotplug_reserve = max(0, KUBEVIRT_HOTPLUG_INDEX_LIMIT - 1 - highest)
    pcie_root_bridges = sum(1 for c in kept if c.model != PCIE_ROOT) + len(spares)
    pcie_root_needed = 1 + pcie_root_bridges + pcie_root_buses_for(facts) + hotplug_reserve
    bus_nrs = budget_buses(sizes, pcie_root_needed)

    # pcie-root slots for the expander buses: sticky (same alias, same slot), else lowest free.
    used_root_slots = {a.slot for a in facts.other_addresses if a.bus == 0}
    used_root_slots |= {c.address.slot for c in kept if c.address is not None and c.address.bus == 0}
    previous_slot = {
        c.alias: c.address.slot for c in facts.controllers if c.ours and c.address is not None and c.address.bus == 0
    }

    reserved_chassis = {c.chassis if c.chassis is not None else c.index for c in kept if c.model in (ROOT_PORT, DOWNSTREAM)}

    controllers: list[GuestController] = []
    placements: list[Placement] = []
    next_index = iter(indexes)
    used_chassis = set(reserved_chassis)

    def chassis_for(index: int) -> int:
        # chassis = index, as libvirt defaults it; on a clash take a free number from the top,
        # away from the low indexes libvirt will give root ports it adds after us.
        c = index
        if c in used_chassis:
            c = next(x for x in range(255, 0, -1) if x not in used_chassis)
        used_chassis.add(c)
        return c

    def place_functions(port_index: int, funcs: list[PciFunction]) -> None:
        ordered = sorted(funcs, key=lambda f: f.bdf)
        multi = len(ordered) > 1
        for fn, f in enumerate(ordered):
            hd = seen[f.bdf]
            placements.append(
                Placement(hd.key, f.bdf, hd.alias, GuestAddress(port_index, 0, fn), multifunction=multi and fn == 0)
            )

    def new_port(model: str, parent: int, slot: int, kind: str, host_name: str, n: int, mirrors: str) -> int:
        index = next(next_index)
        controllers.append(
            GuestController(
                model=model, index=index, alias=alias_for(kind, host_name, n), parent=parent, slot=slot,
                chassis=chassis_for(index), port=slot << 3 if model == ROOT_PORT else slot, mirrors=mirrors,
            )
        )
        return index

    def emit_port(port: _Port, model: str, parent: int, slot: int, kind: str) -> int:
        """Create the guest port for a host port and everything below it; returns slots used."""
        chunks = _chunks(port)
        host_name = port.key if port.host is None else str(port.host.bdf)
        mirrors = f"{kind} {host_name}" if port.host is not None else f"endpoint {host_name} on a root bus"
        if len(chunks) > 1:
            notes.append(f"{len(port.functions)} functions below host port {port.key}: split over {len(chunks)} guest ports of one switch")
        if model == ROOT_PORT and len(chunks) > 1:
            # More than 8 functions cannot share one slot: a switch below the root port keeps
            # them PIX to each other, as they are on the host.
            rp = new_port(ROOT_PORT, parent, slot, kind, host_name, 0, mirrors)
            us = next(next_index)
            controllers.append(GuestController(model=UPSTREAM, index=us, alias=alias_for("us", host_name), parent=rp,
                                               slot=0, mirrors=f"switch for the functions below {host_name}"))
            for n, chunk in enumerate(chunks):
                place_functions(new_port(DOWNSTREAM, us, n, "ds", host_name, n, mirrors), chunk)
            return 1
        for n, chunk in enumerate(chunks):
            index = new_port(model, parent, slot + n, kind, host_name, n, mirrors)
            if chunk:
                place_functions(index, chunk)
            if n == 0 and port.switch is not None:
                emit_switch(port.switch, index)
        return len(chunks)

    def emit_switch(sw: _Switch, parent: int) -> None:
        index = next(next_index)
        controllers.append(
            GuestController(model=UPSTREAM, index=index, alias=alias_for("us", str(sw.host.bdf)), parent=parent, slot=0,
                            mirrors=f"switch {sw.host.bdf} ({sw.host.ids})")
        )
        slot = 0
        for key in sorted(sw.ports):
            slot += emit_port(sw.ports[key], DOWNSTREAM, index, slot, "ds")
            if slot > SLOTS_PER_BUS:
                raise PlanError(f"switch {sw.host.bdf}: more than {SLOTS_PER_BUS} downstream ports needed")

    for rc, bus_nr in zip(ordered_rcs, bus_nrs):
        host_node, _ = rc.numa.most_common(1)[0]
        if len(rc.numa) > 1:
            notes.append(f"devices below {rc.name} report different NUMA nodes {sorted(rc.numa)}; using {host_node}")
        node = numa_map.get(host_node) if host_node >= 0 else None
        if host_node >= 0 and node is None and numa_map:
            notes.append(f"host NUMA node {host_node} ({rc.name}) backs no guest cell: its devices show numa_node -1")
        if host_node < 0:
            notes.append(f"{rc.name} has no NUMA node on the host (numa_node -1)")
        alias = alias_for("pxb", rc.name.removeprefix("pci"))
        slot = previous_slot.get(alias)
        if slot is None or slot in used_root_slots:
            free = [s for s in PXB_SLOT_ORDER if s not in used_root_slots and s not in RESERVED_ROOT_SLOTS]
            if not free:
                raise PlanError("no free slot on pcie-root for another expander bus")
            slot = free[0]
        used_root_slots.add(slot)
        index = next(next_index)
        controllers.append(
            GuestController(model=PXB, index=index, alias=alias, parent=0, slot=slot, bus_nr=bus_nr, node=node,
                            mirrors=f"root complex {rc.name} (host NUMA {host_node})")
        )
        rp_slot = 0
        for key in sorted(rc.root_ports):
            rp_slot += emit_port(rc.root_ports[key], ROOT_PORT, index, rp_slot, "rp")
            if rp_slot > SLOTS_PER_BUS:
                raise PlanError(f"{rc.name}: more than {SLOTS_PER_BUS} root ports needed on one expander bus")

    for index in spares:
        controllers.append(GuestController(model=ROOT_PORT, index=index, alias=alias_for("spare", str(index)), parent=0,
                                           slot=-1, chassis=chassis_for(index), port=0,
                                           mirrors="spare root port on pcie-root (fills an index gap)"))
    controllers.sort(key=lambda c: c.index)
    return Plan(
        controllers=controllers,
        placements=sorted(placements, key=lambda p: p.key),
        removed=sorted(removed),
        numa_map=numa_map,
        numa_source=numa_source,
        notes=notes,
        pcie_root_buses_needed=pcie_root_needed,
        added_pcie_root=not has_root,
    )


def _chunks(port: _Port) -> list[list[PciFunction]]:
    """The functions below a host port, at most 8 per guest slot (one slot per port)."""
    fs = sorted(port.functions, key=lambda f: f.bdf)
    return [fs[i : i + MAX_FUNCTIONS_PER_SLOT] for i in range(0, len(fs), MAX_FUNCTIONS_PER_SLOT)] or [[]]


def _port_bridges(port: _Port, model: str) -> int:
    """Buses (= controllers) a host port costs in the guest: the port, or one per chunk of 8
    functions (below a root port those chunks hang off a switch of their own), plus its switch."""
    k = len(_chunks(port))
    if port.switch is not None:
        return 1 + 1 + sum(_port_bridges(p, DOWNSTREAM) for p in port.switch.ports.values())
    if model == ROOT_PORT and k > 1:
        return 1 + 1 + k
    return k
