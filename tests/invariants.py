"""Checkers for the bus, index, chassis and placement rules, written against the
output XML alone (not against the planner's data structures), and an independent guest-tree
derivation for the host-class = guest-class property.

Rules (docs/SOURCES.md, "Bus and slot accounting" and "Domain XML as KubeVirt hands it over",
has their public sources; written out here independently of src/pcitopo/guest/buses.py):
- PCI controller indexes are unique and leave no gaps (libvirt fills gaps with root ports);
  index 0 is pcie-root.
- pcie-expander-bus only on pcie-root; root ports only on pcie-root or an expander bus;
  upstream ports only on root or downstream ports; downstream ports only on upstream ports.
- Endpoints never directly on an expander bus or an upstream port; below a root or downstream
  port only at slot 0 (so is anything else below such a port); nothing at slot 0 of pcie-root.
- No two devices share a guest (bus, slot, function); a multi-function slot has function 0
  with ``multifunction='on'``.
- Every root and downstream port has a distinct chassis (libvirt's default chassis is the
  index; QEMU's ``slot`` property is never set by libvirt, so every port's (chassis, slot) is
  (chassis, 0) and QEMU's "(chassis, slot) unique" means "chassis unique").
- Every expander bus has a busNr in 1..254, all distinct; the range up to the next higher
  busNr (or 255) holds its root bus plus one bus per bridge below it; everything on pcie-root
  (bus 0 plus one bus per bridge not below an expander bus) fits below the lowest busNr.
- Every ``<target><node>`` names an existing ``<cpu><numa><cell id>``.
- Every controller we create carries an alias starting ``ua-pcitopo-``; the ones we create
  carry everything KubeVirt's re-parse drops (``<model name>``, chassis/port).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from lxml import etree

from pcitopo.libvirt.domain import (
    DOWNSTREAM,
    OUR_ALIAS_PREFIX,
    PCIE_ROOT,
    PXB,
    QEMU_MODEL_NAME,
    ROOT_PORT,
    UPSTREAM,
    parse_int,
)
from pcitopo.model.tree import Bdf, NumaNode, PciFunction, Topology
from pcitopo.paths.classify import PairClass, classify, nccl_device, nccl_path, pairs

BRIDGE_CLASS = 0x060400
# What QEMU presents in the guest (a TI switch and a Red Hat root port: never Broadcom).
_GUEST_IDS = {ROOT_PORT: (0x1B36, 0x000C), UPSTREAM: (0x104C, 0x8232), DOWNSTREAM: (0x104C, 0x8233)}
# Models that are bridges in the guest (each takes a bus number).
_BRIDGE_MODELS = {ROOT_PORT, UPSTREAM, DOWNSTREAM, "pci-bridge", "dmi-to-pci-bridge", "pcie-to-pci-bridge"}


@dataclass
class Ctl:
    index: int
    model: str
    alias: str | None
    parent: int | None
    slot: int | None
    function: int | None
    multifunction: bool
    bus_nr: int | None
    node: int | None
    chassis: int | None
    port: str | None
    model_name: str | None
    el: etree._Element = field(repr=False)


@dataclass
class Dev:
    """Any non-controller device with a guest PCI address (hostdevs included)."""

    tag: str
    parent: int
    slot: int
    function: int
    multifunction: bool
    source: Bdf | None  # hostdevs only


@dataclass
class Parsed:
    controllers: dict[int, Ctl]
    devices: list[Dev]
    cells: set[int]
    acpi: bool
    hostdev_sources: list[Bdf]
    unaddressed_hostdevs: list[Bdf]


def _int(v: str | None) -> int | None:
    return None if v is None else parse_int(v, "value")


def parse(xml: bytes) -> tuple[Parsed, list[str]]:
    root = etree.fromstring(xml, etree.XMLParser(resolve_entities=False, no_network=True))
    errors: list[str] = []
    devices = root.find("devices")
    controllers: dict[int, Ctl] = {}
    devs: list[Dev] = []
    sources: list[Bdf] = []
    unaddressed: list[Bdf] = []
    for el in devices:
        if not isinstance(el.tag, str):
            continue
        addr = el.find("address")
        a = addr if addr is not None and addr.get("type") == "pci" else None
        parent = _int(a.get("bus", "0")) if a is not None else None
        slot = _int(a.get("slot", "0")) if a is not None else None
        fn = _int(a.get("function", "0")) if a is not None else None
        mf = a is not None and a.get("multifunction") == "on"
        if el.tag == "controller" and el.get("type") == "pci":
            t = el.find("target")
            node = el.find("target/node")
            m = el.find("model")
            alias = el.find("alias")
            c = Ctl(
                index=_int(el.get("index")), model=el.get("model") or "", alias=alias.get("name") if alias is not None else None,
                parent=parent, slot=slot, function=fn, multifunction=mf,
                bus_nr=_int(t.get("busNr")) if t is not None and t.get("busNr") else None,
                node=_int(node.text) if node is not None else None,
                chassis=_int(t.get("chassis")) if t is not None and t.get("chassis") else None,
                port=t.get("port") if t is not None else None,
                model_name=m.get("name") if m is not None else None, el=el,
            )
            if c.index in controllers:
                errors.append(f"duplicate pci controller index {c.index}")
            controllers[c.index] = c
            continue
        source = None
        if el.tag == "hostdev" and el.get("type") == "pci":
            s = el.find("source/address")
            source = Bdf(_int(s.get("domain", "0")), _int(s.get("bus")), _int(s.get("slot")), _int(s.get("function", "0")))
            sources.append(source)
            if a is None:
                unaddressed.append(source)
        if a is not None:
            devs.append(Dev(el.tag, parent, slot, fn, mf, source))
    cells = {_int(c.get("id")) for c in root.findall("cpu/numa/cell") if c.get("id") is not None}
    return Parsed(controllers, devs, cells, root.find("features/acpi") is not None, sources, unaddressed), errors


def _bridges_below(p: Parsed, index: int) -> int:
    """Bus numbers the bridges below controller ``index`` take (pxbs are roots of their own)."""
    n = 0
    for c in p.controllers.values():
        if c.parent == index and c.index != index and c.model != PXB:
            n += (1 if c.model in _BRIDGE_MODELS else 0) + _bridges_below(p, c.index)
    return n


def check_rules(xml: bytes, *, hotplug_reserve: bool = True, require_addresses: bool = True,
                tolerated_gaps: frozenset[int] = frozenset()) -> list[str]:
    """Every violation of the rules above in ``xml`` (empty when it is fine).

    ``hotplug_reserve``: count the bare root ports KubeVirt appends after the last call (while
    the highest index is below 32) against pcie-root's buses (use False on a domain that
    already had them added, see strategies.as_booted). ``tolerated_gaps``: index gaps not to
    report (a known bug being tracked by its own xfail test); libvirt fills them with root
    ports on pcie-root, which the check of the booted domain still counts."""
    p, errors = parse(xml)
    ctl = p.controllers
    if not ctl:
        return errors
    idx = sorted(ctl)
    missing = sorted(set(range(idx[-1] + 1)) - set(idx) - tolerated_gaps)
    if missing or idx[0] != 0:
        errors.append(f"pci controller indexes have gaps or start above 0: missing {missing[:8]}, lowest {idx[0]}")
    if 0 not in ctl or ctl[0].model != PCIE_ROOT:
        if any(c.model == PXB for c in ctl.values()):
            errors.append("expander buses but no pcie-root at index 0")
    # -- placement ------------------------------------------------------------------------
    where: Counter = Counter()
    allowed_parents = {PXB: {PCIE_ROOT}, ROOT_PORT: {PCIE_ROOT, PXB}, UPSTREAM: {ROOT_PORT, DOWNSTREAM}, DOWNSTREAM: {UPSTREAM}}
    by_slot: dict[tuple[int, int], list[tuple[int, bool]]] = {}
    for c in ctl.values():
        if c.model == PCIE_ROOT:
            continue
        ours = (c.alias or "").startswith(OUR_ALIAS_PREFIX)
        if c.parent is None:
            # A root port without an address goes on pcie-root (libvirt picks the slot): fine,
            # and counted below against pcie-root's buses. Anything else needs its address.
            if (ours or require_addresses) and c.model != ROOT_PORT:
                errors.append(f"controller {c.index} ({c.model}) has no pci address")
            continue
        where[(c.parent, c.slot, c.function)] += 1
        by_slot.setdefault((c.parent, c.slot), []).append((c.function, c.multifunction))
        parent = ctl.get(c.parent)
        if parent is None:
            errors.append(f"controller {c.index} ({c.model}) plugs into index {c.parent}, which does not exist")
            continue
        if c.model in allowed_parents and parent.model not in allowed_parents[c.model]:
            errors.append(f"{c.model} {c.index} sits on {parent.model} {parent.index}")
        if parent.model in (ROOT_PORT, DOWNSTREAM) and c.slot != 0:
            errors.append(f"{c.model} {c.index} at slot {c.slot} of {parent.model} {parent.index}")
        if parent.model == PCIE_ROOT and c.slot == 0:
            errors.append(f"{c.model} {c.index} at slot 0 of pcie-root (the host bridge's)")
    for d in p.devices:
        what = f"{d.tag}" + (f" {d.source}" if d.source else "")
        where[(d.parent, d.slot, d.function)] += 1
        by_slot.setdefault((d.parent, d.slot), []).append((d.function, d.multifunction))
        parent = ctl.get(d.parent)
        if parent is None:
            if d.parent != 0:
                errors.append(f"{what} plugs into index {d.parent}, which does not exist")
            continue
        if parent.model in (PXB, UPSTREAM):
            errors.append(f"endpoint {what} sits directly on {parent.model} {parent.index}")
        if parent.model in (ROOT_PORT, DOWNSTREAM) and d.slot != 0:
            errors.append(f"endpoint {what} at slot {d.slot} of {parent.model} {parent.index}")
        if parent.model == PCIE_ROOT and d.slot == 0:
            errors.append(f"endpoint {what} at slot 0 of pcie-root")
    for key, n in where.items():
        if n > 1:
            errors.append(f"{n} devices share guest address bus {key[0]} slot {key[1]} function {key[2]}")
    for (bus, slot), fns in by_slot.items():
        if len(fns) > 1 and not any(f == 0 and mf for f, mf in fns):
            # Re-parsed domains lose multifunction; only complain about slots we own.
            parent = ctl.get(bus)
            if parent is not None and (parent.alias or "").startswith(OUR_ALIAS_PREFIX):
                errors.append(f"slot {slot} of controller {bus} holds functions {sorted(f for f, _ in fns)} "
                              "without multifunction='on' on function 0")
    for d in p.unaddressed_hostdevs:
        errors.append(f"hostdev {d} has no guest address")
    # -- chassis --------------------------------------------------------------------------
    chassis: Counter = Counter()
    for c in ctl.values():
        if c.model in (ROOT_PORT, DOWNSTREAM):
            chassis[c.chassis if c.chassis is not None else c.index] += 1
    for ch, n in chassis.items():
        if n > 1:
            errors.append(f"chassis {ch} used by {n} root/downstream ports (QEMU: Can't add chassis slot)")
    # -- bus numbers -----------------------------------------------------------------------
    pxbs = sorted((c for c in ctl.values() if c.model == PXB), key=lambda c: (c.bus_nr is None, c.bus_nr or 0))
    nrs = [c.bus_nr for c in pxbs if c.bus_nr is not None]
    for c in pxbs:
        if c.bus_nr is None:
            errors.append(f"expander bus {c.index} has no busNr (libvirt would leave it 2 buses)")
        elif not 1 <= c.bus_nr <= 254:
            errors.append(f"expander bus {c.index} busNr {c.bus_nr} outside 1..254")
    if len(set(nrs)) != len(nrs):
        errors.append(f"expander buses share a busNr: {sorted(nrs)}")
    numbered = [c for c in pxbs if c.bus_nr is not None]
    for i, c in enumerate(numbered):
        end = numbered[i + 1].bus_nr - 1 if i + 1 < len(numbered) else 255
        need = 1 + _bridges_below(p, c.index)
        if end - c.bus_nr + 1 < need:
            errors.append(f"expander bus {c.index} (busNr {c.bus_nr}) has buses {c.bus_nr}..{end} but its tree needs {need}")
    if numbered and 0 in ctl:
        root_needs = 1 + _bridges_below(p, 0)
        unaddressed = sum(1 for c in ctl.values() if c.parent is None and c.model in _BRIDGE_MODELS)
        root_needs += unaddressed  # libvirt puts them on pcie-root
        if hotplug_reserve:
            root_needs += max(0, 31 - max(ctl))
        if root_needs > numbered[0].bus_nr:
            errors.append(f"pcie-root needs {root_needs} buses but the lowest busNr is {numbered[0].bus_nr}")
    # -- NUMA -----------------------------------------------------------------------------
    for c in ctl.values():
        if c.node is not None and c.node not in p.cells:
            errors.append(f"controller {c.index} names guest cell {c.node}, which does not exist")
    # -- what we create -------------------------------------------------------------------
    for c in ctl.values():
        if not (c.alias or "").startswith(OUR_ALIAS_PREFIX):
            continue
        if c.model_name != QEMU_MODEL_NAME.get(c.model):
            errors.append(f"our controller {c.alias} lacks <model name='{QEMU_MODEL_NAME.get(c.model)}'>")
        if c.model in (ROOT_PORT, DOWNSTREAM) and (c.chassis is None or c.port is None):
            errors.append(f"our controller {c.alias} lacks target chassis/port")
        if c.model == PXB and c.bus_nr is None:
            errors.append(f"our expander bus {c.alias} lacks busNr")
    return errors


def check_created_aliases(before: bytes, after: bytes) -> list[str]:
    """Every controller in ``after`` that is not in ``before`` (as it was, element for element)
    must be ours; every controller that vanished must be ours or a foreign expander bus, switch
    port or expander-bus root port (KubeVirt's PCINUMAAwareTopology layout, taken over)."""
    def controllers(xml: bytes) -> dict[bytes, tuple[int, str, str | None, int | None]]:
        p, _ = parse(xml)
        out = {}
        for c in p.controllers.values():
            out[etree.tostring(c.el, method="c14n", exclusive=True, with_tail=False)] = (c.index, c.model, c.alias, c.parent)
        return out

    b, a = controllers(before), controllers(after)
    pb, _ = parse(before)
    errors = []
    for key, (index, model, alias, _parent) in a.items():
        if key not in b and not (alias or "").startswith(OUR_ALIAS_PREFIX) and model != PCIE_ROOT:
            errors.append(f"controller {index} ({model}, alias {alias}) was created or changed without our alias prefix")
    for key, (index, model, alias, parent) in b.items():
        if key in a or (alias or "").startswith(OUR_ALIAS_PREFIX):
            continue
        on_pxb = parent is not None and parent in pb.controllers and pb.controllers[parent].model == PXB
        if not (model in (PXB, UPSTREAM, DOWNSTREAM) or (model == ROOT_PORT and on_pxb)):
            errors.append(f"foreign controller {index} ({model}) was removed or changed")
    return errors


# -- the guest tree, derived independently of src/pcitopo/guest/view.py ----------------------------------

class _Loader:
    def __init__(self, functions: dict[Bdf, PciFunction], nodes: Mapping[int, NumaNode]):
        self.name = "guest (tests/invariants.py)"
        self._f = functions
        self._n = nodes

    def load(self, bdf: Bdf) -> PciFunction | None:
        return self._f.get(bdf)

    def all_bdfs(self) -> Iterable[Bdf]:
        return list(self._f)

    def numa_nodes(self) -> Mapping[int, NumaNode]:
        return self._n


def guest_topology(xml: bytes, host: Topology) -> tuple[Topology, dict[Bdf, Bdf]]:
    """The guest PCI tree as firmware numbers it: each expander bus is a root bus numbered
    busNr (NUMA = its <node> when the domain has ACPI), pcie-root is bus 0, and every bridge
    takes the next bus number depth first. Endpoints carry their host ids."""
    p, _ = parse(xml)
    kids: dict[int, list[tuple[int, int, object]]] = {}
    for c in p.controllers.values():
        if c.parent is not None and c.model != PCIE_ROOT:
            kids.setdefault(c.parent, []).append((c.slot, c.function, c))
    for d in p.devices:
        kids.setdefault(d.parent, []).append((d.slot, d.function, d))
    functions: dict[Bdf, PciFunction] = {}
    h2g: dict[Bdf, Bdf] = {}

    def walk(index: int, bus: int, path: tuple[str, ...], node: int, nxt: list[int]) -> None:
        for slot, fn, item in sorted(kids.get(index, []), key=lambda x: (x[0], x[1])):
            bdf = Bdf(0, bus, slot, fn)
            if isinstance(item, Ctl):
                if item.model == PXB:
                    continue
                v, d = _GUEST_IDS.get(item.model, (0x1B36, 0x0001))
                functions[bdf] = PciFunction(bdf, path + (str(bdf),), v, d, BRIDGE_CLASS, numa_node=node)
                sec = nxt[0]
                nxt[0] += 1
                walk(item.index, sec, path + (str(bdf),), node, nxt)
            elif item.source is not None:
                hf = host.function(item.source)
                functions[bdf] = PciFunction(bdf, path + (str(bdf),), hf.vendor, hf.device, hf.class_code,
                                             subsystem_vendor=hf.subsystem_vendor, subsystem_device=hf.subsystem_device,
                                             numa_node=node)
                h2g[hf.bdf] = bdf

    walk(0, 0, ("pci0000:00",), -1, [1])
    for c in sorted((c for c in p.controllers.values() if c.model == PXB and c.bus_nr is not None), key=lambda c: c.bus_nr):
        node = c.node if (p.acpi and c.node is not None) else -1
        walk(c.index, c.bus_nr, (f"pci0000:{c.bus_nr:02x}",), node, [c.bus_nr + 1])
    return Topology(_Loader(functions, {i: NumaNode(i, None) for i in p.cells})), h2g


def broadcom_collapse(host_class: PairClass, guest_class: PairClass) -> bool:
    """The one documented difference: a two-level Broadcom complex mirrored as one switch, so
    NVML's PXB reads PIX where NCCL (which flattens it on the host too) says PIX on both."""
    return (host_class.nccl == guest_class.nccl and host_class.nccl.value == "PIX"
            and host_class.nvml.value == "PXB" and guest_class.nvml.value == "PIX")


def numa_divergent(host: Topology, bdf: Bdf) -> bool:
    """True when NCCL's CPU node for ``bdf`` (the raw ``numa_node`` of its top-most PCI node,
    -1 when the file is missing or says -1) differs from the node the model infers for the
    device (``Topology.numa_of``: the first known value on the way up), which the planner
    uses. Known divergence, tracked by test_missing_numa_node_keeps_host_class."""
    f = host.function(bdf)
    return nccl_path(host, f).cpu != host.numa_of(nccl_device(host, f))


def crowded_port(host: Topology, placed: Iterable[Bdf]) -> set[Bdf]:
    """Placed functions that share their host port (or root-bus slot) with more than eight
    placed functions: the planner splits them over sibling guest ports. Known loss of
    fidelity, tracked by test_more_than_eight_functions_keep_host_class."""
    groups: dict[object, list[Bdf]] = {}
    for b in placed:
        f = host.function(b)
        key = f.parent_bdf if f.parent_bdf is not None else (f.root_complex, b.slot)
        groups.setdefault(key, []).append(b)
    return {b for members in groups.values() if len(members) > 8 for b in members}


def class_differences(xml: bytes, host: Topology, tolerate_numa_divergence: bool = False,
                      tolerate_crowded_ports: bool = False) -> list[str]:
    """Pairs of placed hostdevs whose guest class differs from the host class (NCCL always;
    NVML except the Broadcom collapse). The ``tolerate_*`` flags skip pairs that differ only
    because of a known bug (each pinned by its own strict xfail test)."""
    guest, h2g = guest_topology(xml, host)
    p, _ = parse(xml)
    out = []
    placed = [b for b in p.hostdev_sources if b in h2g]
    crowded = crowded_port(host, placed) if tolerate_crowded_ports else set()
    for a, b in pairs(placed):
        hc = classify(host, a, b)
        gc = classify(guest, h2g[a], h2g[b])
        if hc.nccl != gc.nccl or (hc.nvml != gc.nvml and not broadcom_collapse(hc, gc)):
            if tolerate_numa_divergence and (numa_divergent(host, a) or numa_divergent(host, b)):
                continue
            if a in crowded or b in crowded:
                continue
            out.append(f"{a}-{b}: host NCCL {hc.nccl.value}/NVML {hc.nvml.value}, guest NCCL {gc.nccl.value}/NVML {gc.nvml.value}")
    return out


def owned_projection(xml: bytes) -> tuple:
    """What the rewrite owns, in a form that survives re-serialisation: our controllers (all of
    their content) and every PCI hostdev's guest address, keyed by host source."""
    p, _ = parse(xml)
    ours = sorted(
        etree.tostring(c.el, method="c14n", exclusive=True, with_tail=False).replace(b"\n", b"").replace(b"\t", b"")
        for c in p.controllers.values() if (c.alias or "").startswith(OUR_ALIAS_PREFIX)
    )
    placements = sorted(
        (str(d.source), d.parent, d.slot, d.function, d.multifunction) for d in p.devices if d.source is not None
    )
    return tuple(ours), tuple(placements)


__all__ = ["check_rules", "check_created_aliases", "class_differences", "crowded_port", "guest_topology", "numa_divergent",
           "owned_projection", "parse"]
