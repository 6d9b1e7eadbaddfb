"""The mirror planner: a pure function of (host model, domain facts) → guest layout.

The guest tree is the host tree restricted to the assigned devices:
- one pcie-expander-bus per host root complex, on the guest cell mapped to its host NUMA node;
- one pcie-root-port per host root port used (a synthetic one for an endpoint on a root bus);
- one upstream port with one downstream port per used child for each host switch, where a
  Broadcom two-level complex that NCCL flattens becomes one virtual switch (the same pass the
  classifier uses) and a genuine nesting stays nested;
- endpoints at slot 0 of their port; the functions under one host port share one guest slot.
Every rule below lives once: alias naming (:func:`alias_for`), NUMA mapping (:func:`map_numa`),
takeover (:func:`controllers_to_remove`), the bare root ports on pcie-root left for hotplug
(:func:`plan`, :func:`_root_ports_in_use`); what it all costs in buses, slots, indexes and chassis
numbers lives in :mod:`pcitopo.guest.buses`. :class:`_Emitter` writes the layout, its state explicit.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

from pcitopo.errors import DomainError, PlanError, quoted
from pcitopo.guest import buses
from pcitopo.guest.facts import ControllerFact, DomainFacts, GuestController, HostdevFact, HotplugPorts, Placement, Plan
from pcitopo.libvirt.domain import DOWNSTREAM, OUR_ALIAS_PREFIX, PCIE_ROOT, PXB, ROOT_PORT, UPSTREAM, GuestAddress, parse_cpuset
from pcitopo.model.address import SLOTS_PER_BUS
from pcitopo.model.tree import Bdf, PciFunction, Role, Topology, root_complex_sort_key
from pcitopo.nccl.price import port_link
from pcitopo.paths.classify import nccl_switch_rep

# -- the mirror tree (host-side shapes, before indexes) -----------------------------------------

@dataclass
class _Port:
    """A guest port (root or downstream) and what hangs below it."""

    key: str
    host: PciFunction | None
    functions: list[PciFunction] = field(default_factory=list)
    switch: _Switch | None = None


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
        for (_us, ds), rep in zip(pairs, reps):
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


# -- takeover -----------------------------------------------------------------------------------

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
    seen, devices = _assigned_devices(host, facts)
    numa_map, numa_source, notes = map_numa(host, facts)
    if not facts.acpi:
        notes.append("the domain has no <features><acpi/>: the guest ignores every <node> and shows numa_node -1")
    rcs = build_mirror(host, devices)
    removed, kept = _kept_controllers(facts)
    # Order: root complexes by host order, ports by host BDF: the guest reads like the host.
    ordered_rcs = sorted(rcs.values(), key=lambda r: root_complex_sort_key(r.name))
    held, occupied = _root_ports_in_use(facts, removed)
    libvirt_ports = buses.root_port_devices(facts.unplaced_pcie, facts.unplaced_conventional)
    wanted = buses.hotplug_wanted(facts.kubevirt_pci_devices, facts.memory)
    budget = buses.budget(
        [_pxb_buses(rc) for rc in ordered_rcs],
        kept_indexes={c.index for c in kept},
        kept_bridges=sum(1 for c in kept if c.model != PCIE_ROOT),
        unplaced_pcie=facts.unplaced_pcie,
        unplaced_conventional=facts.unplaced_conventional,
        held=held,
        # libvirt fills empty root ports before it adds any: one more per device it places,
        # and per device on a root port not ours (none after a define: libvirt put it in ours)
        free_wanted=wanted + len(occupied - held) + libvirt_ports,
    )
    hotplug = HotplugPorts(wanted, max(0, min(wanted, budget.free_ports - libvirt_ports)), budget.free_ports)
    root_slots = buses.RootSlots(
        used={a.slot for a in facts.other_addresses if a.bus == 0}
        | {c.address.slot for c in kept if c.address is not None and c.address.bus == 0},
        previous={c.alias: c.address.slot for c in facts.controllers if c.ours and c.address is not None and c.address.bus == 0},
    )
    chassis = buses.ChassisPool(
        c.chassis if c.chassis is not None else c.index for c in kept if c.model in (ROOT_PORT, DOWNSTREAM)
    )
    em = _Emitter(seen, iter(budget.indexes), chassis, notes)
    for rc, bus_nr in zip(ordered_rcs, budget.bus_nrs):
        node = _guest_cell(rc, numa_map, notes)
        alias = alias_for("pxb", rc.name.removeprefix("pci"))
        em.emit_root_complex(rc, alias, root_slots.take(alias), bus_nr, node)
    em.emit_spares(budget.spares)
    return Plan(
        controllers=sorted(em.controllers, key=lambda c: c.index),
        placements=sorted(em.placements, key=lambda p: p.key),
        removed=sorted(removed),
        numa_map=numa_map,
        numa_source=numa_source,
        notes=notes,
        added_pcie_root=not any(c.model == PCIE_ROOT for c in kept),
        hotplug=hotplug,
    )


def _root_ports_in_use(facts: DomainFacts, removed: set[int]) -> tuple[frozenset[int], set[int]]:
    """(our bare root ports on pcie-root that hold a device, every root port on pcie-root that
    does): libvirt put the devices it placed there, so ours keep their index on every call."""
    on_root = {c.index: c for c in facts.controllers
               if c.model == ROOT_PORT and (c.address is None or c.address.bus == 0)}
    buses_used = [a.bus for a in facts.other_addresses]
    buses_used += [c.address.bus for c in facts.controllers if c.address is not None and c.index not in removed]
    occupied = {b for b in buses_used if b in on_root}
    return frozenset(i for i in occupied if on_root[i].ours), occupied


def _assigned_devices(host: Topology, facts: DomainFacts) -> tuple[dict[Bdf, HostdevFact], list[PciFunction]]:
    """The host function behind every hostdev, each assigned once and an endpoint."""
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
    return seen, devices


def _kept_controllers(facts: DomainFacts) -> tuple[set[int], list[ControllerFact]]:
    """(indexes removed, controllers kept); a foreign expander bus that stays is refused."""
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
    return removed, kept


def _guest_cell(rc: _RootComplex, numa_map: dict[int, int], notes: list[str]) -> int | None:
    """The guest cell of a root complex's expander bus (its devices' most common host node)."""
    host_node, _ = rc.numa.most_common(1)[0]
    if len(rc.numa) > 1:
        notes.append(f"devices below {rc.name} report different NUMA nodes {sorted(rc.numa)}; using {host_node}")
    node = numa_map.get(host_node) if host_node >= 0 else None
    if host_node >= 0 and node is None and numa_map:
        notes.append(f"host NUMA node {host_node} ({rc.name}) backs no guest cell: its devices show numa_node -1")
    if host_node < 0:
        notes.append(f"{rc.name} has no NUMA node on the host (numa_node -1)")
    return node


def _chunks(port: _Port) -> list[list[PciFunction]]:
    """The functions below a host port, at most 8 per guest slot (one slot per port)."""
    return buses.slot_chunks(sorted(port.functions, key=lambda f: f.bdf))


def _port_buses(port: _Port, on_pxb: bool) -> int:
    below = None if port.switch is None else sum(_port_buses(p, False) for p in port.switch.ports.values())
    return buses.port_buses(len(_chunks(port)), on_pxb, below)


def _pxb_buses(rc: _RootComplex) -> int:
    """An expander bus's share of the bus budget: its root bus plus one per bridge below it."""
    return 1 + sum(_port_buses(p, True) for p in rc.root_ports.values())


@dataclass
class _Emitter:
    """Writes the guest controllers and placements for the mirror tree, depth first.

    Its state is all here: the hostdevs by source, the indexes left to hand out (in the order the
    budget counted them), the chassis pool, and the notes the plan returns."""

    hostdevs: dict[Bdf, HostdevFact]
    indexes: Iterator[int]
    chassis: buses.ChassisPool
    notes: list[str]
    controllers: list[GuestController] = field(default_factory=list)
    placements: list[Placement] = field(default_factory=list)

    def emit_root_complex(self, rc: _RootComplex, alias: str, slot: int, bus_nr: int, node: int | None) -> None:
        index = next(self.indexes)
        self.controllers.append(
            GuestController(model=PXB, index=index, alias=alias, parent=0, slot=slot, bus_nr=bus_nr, node=node)
        )
        buses.fill_slots(
            sorted(rc.root_ports),
            lambda key, first: self.emit_port(rc.root_ports[key], ROOT_PORT, index, first, "rp"),
            f"{rc.name}: more than {SLOTS_PER_BUS} root ports needed on one expander bus",
        )

    def emit_switch(self, sw: _Switch, parent: int) -> None:
        index = next(self.indexes)
        self.controllers.append(
            GuestController(model=UPSTREAM, index=index, alias=alias_for("us", str(sw.host.bdf)), parent=parent, slot=0)
        )
        buses.fill_slots(
            sorted(sw.ports),
            lambda key, first: self.emit_port(sw.ports[key], DOWNSTREAM, index, first, "ds"),
            f"switch {sw.host.bdf}: more than {SLOTS_PER_BUS} downstream ports needed",
        )

    def emit_port(self, port: _Port, model: str, parent: int, slot: int, kind: str) -> int:
        """Create the guest port for a host port and everything below it; returns slots used."""
        chunks = _chunks(port)
        host_name = port.key if port.host is None else str(port.host.bdf)
        if len(chunks) > 1:
            self.notes.append(
                f"{len(port.functions)} functions below host port {port.key}: split over {len(chunks)} guest ports of one switch"
            )
        link = None
        if model == ROOT_PORT and port.host is not None:
            link = port_link(port.host, port.switch.host if port.switch is not None and len(chunks) == 1 else None)
        if model == ROOT_PORT and len(chunks) > 1:
            self.emit_split_root_port(chunks, parent, slot, kind, host_name, link)
            return 1
        for n, chunk in enumerate(chunks):
            index = self.new_port(model, parent, slot + n, kind, host_name, n, link)
            if chunk:
                self.place_functions(index, chunk)
            if n == 0 and port.switch is not None:
                self.emit_switch(port.switch, index)
        return len(chunks)

    def emit_split_root_port(self, chunks: list[list[PciFunction]], parent: int, slot: int, kind: str,
                             host_name: str, link: tuple[str | None, str | None] | None) -> None:
        """More than 8 functions cannot share one slot: a switch below the root port keeps them
        PIX to each other, as they are on the host."""
        rp = self.new_port(ROOT_PORT, parent, slot, kind, host_name, 0, link)
        us = next(self.indexes)
        self.controllers.append(GuestController(model=UPSTREAM, index=us, alias=alias_for("us", host_name), parent=rp, slot=0))
        for n, chunk in enumerate(chunks):
            self.place_functions(self.new_port(DOWNSTREAM, us, n, "ds", host_name, n), chunk)

    def new_port(self, model: str, parent: int, slot: int, kind: str, host_name: str, n: int,
                 link: tuple[str | None, str | None] | None = None) -> int:
        index = next(self.indexes)
        self.controllers.append(
            GuestController(
                model=model, index=index, alias=alias_for(kind, host_name, n), parent=parent, slot=slot,
                chassis=self.chassis.take(index), port=buses.root_port_number(slot) if model == ROOT_PORT else slot,
                link=link,
            )
        )
        return index

    def place_functions(self, port_index: int, funcs: list[PciFunction]) -> None:
        ordered = sorted(funcs, key=lambda f: f.bdf)
        multi = len(ordered) > 1
        for fn, f in enumerate(ordered):
            hd = self.hostdevs[f.bdf]
            self.placements.append(
                Placement(hd.key, f.bdf, hd.alias, GuestAddress(port_index, 0, fn), multifunction=multi and fn == 0)
            )

    def emit_spares(self, spares: tuple[int, ...]) -> None:
        """Our bare root ports on pcie-root: index gaps, hotplug capacity, and the ones libvirt
        put devices in at an earlier define (libvirt picks their slot)."""
        for index in spares:
            self.controllers.append(GuestController(model=ROOT_PORT, index=index, alias=alias_for("spare", str(index)),
                                                    parent=0, slot=-1, chassis=self.chassis.take(index), port=0))
