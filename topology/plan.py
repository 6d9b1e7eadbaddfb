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
from .errors import DomainError, PlanError
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
    # PCI devices libvirt will still have to place (each costs a root port, i.e. a bus on pcie.0)
    unplaced_devices: int
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
    slot: int
    function: int = 0
    multifunction: bool = False
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
    host_cpus = {nid: parse_cpuset(n.cpulist or "") for nid, n in host.numa_nodes().items()}
    pins = dict(facts.vcpupins)
    for cell in sorted(cells.values(), key=lambda c: c.id):
        votes: Counter = Counter()
        for vcpu in parse_cpuset(cell.cpus or ""):
            for cpu in parse_cpuset(pins.get(vcpu, "")):
                for nid, cpus in host_cpus.items():
                    if cpu in cpus:
                        votes[nid] += 1
        if votes:
            node = votes.most_common(1)[0][0]
            mapping.setdefault(node, cell.id)
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


# -- the planner --------------------------------------------------------------------------------

def plan(host: Topology, facts: DomainFacts) -> Plan:
    notes: list[str] = []
    seen: dict[Bdf, HostdevFact] = {}
    devices: list[PciFunction] = []
    for hd in facts.hostdevs:
        if hd.source in seen:
            raise DomainError(f"hostdev {hd.source} is assigned twice ({seen[hd.source].alias} and {hd.alias})")
        seen[hd.source] = hd
        f = host.find(hd.source)
        if f is None:
            raise DomainError(f"hostdev {hd.alias or ''} source {hd.source} is not a PCI function on this host ({host.name})")
        if f.is_bridge:
            raise DomainError(f"hostdev {hd.source} is a PCI bridge; only endpoints can be assigned")
        devices.append(f)

    numa_map, numa_source, numa_notes = map_numa(host, facts)
    notes += numa_notes
    if not facts.acpi:
        notes.append("the domain has no <features><acpi/>: the guest ignores every <node> and shows numa_node -1")

    rcs = build_mirror(host, devices)

    # Which existing controllers go: ours from earlier calls, and foreign expander buses,
    # switch ports and pxb root ports left empty once the hostdevs move (KubeVirt's
    # PCINUMAAwareTopology layout). Root ports on pcie-root stay: other devices or hotplug.
    by_index = {c.index: c for c in facts.controllers}
    if len(by_index) != len(facts.controllers):
        dup = [i for i, n in Counter(c.index for c in facts.controllers).items() if n > 1]
        raise DomainError(f"duplicate pci controller index {dup[0]}")
    # Hostdevs are all moving, so they hold none of their old controllers.
    users: Counter = Counter()
    for a in facts.other_addresses:
        users[a.bus] += 1
    removed: set[int] = {c.index for c in facts.controllers if c.ours}
    for c in facts.controllers:
        if c.address is not None and c.index not in removed:
            users[c.address.bus] += 1
    changed = True
    while changed:
        changed = False
        for c in facts.controllers:
            if c.index in removed or c.model == PCIE_ROOT:
                continue
            parent = by_index.get(c.address.bus) if c.address else None
            on_pxb = parent is not None and parent.model == PXB
            removable = c.model in (PXB, UPSTREAM, DOWNSTREAM) or (c.model == ROOT_PORT and on_pxb)
            if removable and users[c.index] == 0:
                removed.add(c.index)
                if c.address is not None:
                    users[c.address.bus] -= 1
                changed = True
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
    def bridges(port: _Port) -> int:
        n = 1 + _extra_ports(port)
        if port.switch is not None:
            n += 1 + sum(bridges(p) for p in port.switch.ports.values())
        return n

    sizes = [1 + sum(bridges(p) for p in rc.root_ports.values()) for rc in ordered_rcs]
    kept_indexes = {c.index for c in kept}
    has_root = any(c.model == PCIE_ROOT for c in kept)
    n_ours = sum(_count_controllers(rc) for rc in ordered_rcs)
    indexes = allocate_indexes(kept_indexes | {0}, n_ours)
    highest = max([0, *kept_indexes, *indexes])
    hotplug_reserve = max(0, KUBEVIRT_HOTPLUG_INDEX_LIMIT - 1 - highest)
    pcie_root_bridges = sum(1 for c in kept if c.model != PCIE_ROOT)
    pcie_root_needed = 1 + pcie_root_bridges + facts.unplaced_devices + hotplug_reserve
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

    def emit_port(port: _Port, model: str, parent: int, slot: int, kind: str) -> list[int]:
        """Create the port (and siblings when more than 8 functions must fit), recurse."""
        chunks = [port.functions[i : i + MAX_FUNCTIONS_PER_SLOT] for i in range(0, len(port.functions), MAX_FUNCTIONS_PER_SLOT)] or [[]]
        made = []
        for n, chunk in enumerate(chunks):
            index = next(next_index)
            host_name = port.key if port.host is None else str(port.host.bdf)
            controllers.append(
                GuestController(
                    model=model,
                    index=index,
                    alias=alias_for(kind, host_name, n),
                    parent=parent,
                    slot=slot + n,
                    chassis=chassis_for(index),
                    port=(slot + n) << 3 if model == ROOT_PORT else slot + n,
                    mirrors=f"{kind} {host_name}" if port.host is not None else f"endpoint {host_name} on a root bus",
                )
            )
            made.append(index)
            if chunk:
                place_functions(index, chunk)
            if n == 0 and port.switch is not None:
                emit_switch(port.switch, index)
        if len(chunks) > 1:
            notes.append(f"{len(port.functions)} functions below host port {port.key}: split over {len(chunks)} guest ports")
        return made

    def emit_switch(sw: _Switch, parent: int) -> None:
        index = next(next_index)
        controllers.append(
            GuestController(model=UPSTREAM, index=index, alias=alias_for("us", str(sw.host.bdf)), parent=parent, slot=0,
                            mirrors=f"switch {sw.host.bdf} ({sw.host.ids})")
        )
        slot = 0
        for key in sorted(sw.ports):
            p = sw.ports[key]
            made = emit_port(p, DOWNSTREAM, index, slot, "ds")
            slot += len(made)
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
            made = emit_port(rc.root_ports[key], ROOT_PORT, index, rp_slot, "rp")
            rp_slot += len(made)
            if rp_slot > SLOTS_PER_BUS:
                raise PlanError(f"{rc.name}: more than {SLOTS_PER_BUS} root ports needed on one expander bus")

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


def _extra_ports(port: _Port) -> int:
    """Sibling ports needed beyond the first when more than 8 functions share a host port."""
    return max(0, (len(port.functions) - 1) // MAX_FUNCTIONS_PER_SLOT)


def _count_controllers(rc: _RootComplex) -> int:
    def port_count(p: _Port) -> int:
        n = 1 + _extra_ports(p)
        if p.switch is not None:
            n += 1 + sum(port_count(q) for q in p.switch.ports.values())
        return n

    return 1 + sum(port_count(p) for p in rc.root_ports.values())
