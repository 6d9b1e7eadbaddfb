"""Hypothesis strategies over hosts: generated worlds (``.topo`` text built from an abstract tree
of root complexes, ports, switches and endpoints) and the committed fixture hosts, each read back
through the sidecar's own reader (see :mod:`testkit.strategies`)."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field

from hypothesis import strategies as st

from pcitopo.host.sources import MemoryTree
from pcitopo.host.sysfs import SysfsReader, open_host
from pcitopo.model.tree import Bdf, Role, Topology
from pcitopo.synth import build_tree, parse_topo

from .. import FIXTURES

GPU_PRESETS = ("h100", "h200", "b200", "a100-pcie", "l40s")
NIC_PRESETS = ("cx7-ib", "cx7-eth", "cx6-dx", "bf3")
OTHER_PRESETS = ("nvme", "nvswitch-h100")
RCIEP_PRESETS = ("intel-vtd", "amd-iommu")
ROOT_PORT_PRESETS = ("intel-rp", "amd-rp")
# Files `omit=` may leave out (the reader treats all of them as optional).
OMITTABLE = ("subsystem_vendor", "subsystem_device", "numa_node", "max_link_speed", "max_link_width",
             "current_link_speed", "current_link_width", "local_cpulist", "driver", "iommu_group", "link")
MAX_SWITCH_DEPTH = 3
BUS_LIMIT = 256


# -- the abstract host tree (before bus numbers) ----------------------------------------------

@dataclass
class _Node:
    kind: str  # rp us ds br ep
    keys: dict[str, str] = field(default_factory=dict)
    children: list[_Node] = field(default_factory=list)
    tags: set[str] = field(default_factory=set)


@dataclass
class _Rc:
    numa: int
    children: list[_Node]


def _buses(n: _Node) -> int:
    """Buses a subtree takes below the bus it sits on (a bridge with children: one, plus theirs)."""
    if not n.children:
        return 0
    return 1 + sum(_buses(c) for c in n.children)


def _tags(n: _Node) -> set[str]:
    out = set(n.tags)
    for c in n.children:
        out |= _tags(c)
    return out


def _switch_depth(n: _Node) -> int:
    """Upstream ports on the deepest path below ``n`` (two-level Broadcom complexes count 2)."""
    below = max((_switch_depth(c) for c in n.children), default=0)
    return below + (1 if n.kind == "us" else 0)


@st.composite
def _omit(draw) -> dict[str, str]:
    """Occasionally leave optional attribute files out of a function."""
    if draw(st.integers(0, 9)) != 9:
        return {}
    names = draw(st.sets(st.sampled_from(OMITTABLE), min_size=1, max_size=4))
    return {"omit": ",".join(sorted(names))}


@st.composite
def endpoints(draw, mixed_numa: bool = False) -> _Node:
    """A GPU, a NIC (possibly multi-function, possibly with VFs), an NVMe or an NVSwitch."""
    what = draw(st.sampled_from(("gpu", "gpu", "nic", "nic", "other")))
    keys: dict[str, str] = {}
    tags: set[str] = set()
    if what == "gpu":
        keys["preset"] = draw(st.sampled_from(GPU_PRESETS))
    elif what == "nic":
        keys["preset"] = draw(st.sampled_from(NIC_PRESETS))
        functions = draw(st.sampled_from((1, 1, 1, 2, 2, 4)))
        if functions > 1:
            keys["functions"] = str(functions)
            tags.add("multifunction")
        if draw(st.integers(0, 3)) == 3:
            keys["vfs"] = str(draw(st.integers(1, 6)))
            tags.add("vfs")
        if draw(st.booleans()):
            keys["driver"] = "vfio-pci"
    else:
        keys["preset"] = draw(st.sampled_from(OTHER_PRESETS))
        if keys["preset"] == "nvme" and draw(st.integers(0, 4)) == 4:
            keys["functions"] = "2"
            tags.add("multifunction")
    keys.update(draw(_omit()))
    if "omit" in keys:
        tags.add("omit")
    if mixed_numa and draw(st.integers(0, 5)) == 5:
        # Firmware that fills numa_node in for some functions only (the model falls back to
        # the first known value on the way up; see Topology.numa_of).
        keys["numa"] = "-1"
        tags.add("mixed-numa")
    return _Node("ep", keys, tags=tags)


@st.composite
def _port_payload(draw, depth: int, mixed_numa: bool) -> list[_Node]:
    """What hangs below a root or downstream port: nothing, an endpoint, or a switch."""
    choices = ["ep", "ep", "ep", "empty"]
    if depth < MAX_SWITCH_DEPTH:
        choices += ["switch", "switch"]
    pick = draw(st.sampled_from(choices))
    if pick == "empty":
        return []
    if pick == "ep":
        return [draw(endpoints(mixed_numa))]
    return [draw(switches(depth, mixed_numa))]


@st.composite
def switches(draw, depth: int = 0, mixed_numa: bool = False) -> _Node:
    """An upstream port with its downstream ports; ``depth`` switch levels are already above."""
    kinds = ["oem", "gen4"]
    if depth + 2 <= MAX_SWITCH_DEPTH:
        kinds += ["bcm2", "bcm2", "cx"]
    kind = draw(st.sampled_from(kinds))
    ports = draw(st.integers(1, 4))
    if kind == "oem":
        us = _Node("us", {"preset": "pex-gen5-oem"}, tags={"switch"})
        us.children = [_Node("ds", children=draw(_port_payload(depth + 1, mixed_numa))) for _ in range(ports)]
    elif kind == "gen4":
        us = _Node("us", {"preset": "pex-gen4"}, tags={"switch", "gen4"})
        us.children = [_Node("ds", children=draw(_port_payload(depth + 1, mixed_numa))) for _ in range(ports)]
    elif kind == "bcm2":
        # Broadcom Gen5 presenting two levels: virtual switches below a top switch (NCCL
        # flattens them into one; NVML does not).
        us = _Node("us", {"preset": "pex-gen5-top"}, tags={"switch", "bcm2"})
        for _ in range(min(ports, 3)):
            if draw(st.integers(0, 4)) == 4:
                # A top-level downstream port with an endpoint right below it.
                us.children.append(_Node("ds", children=draw(_port_payload(depth + 1, mixed_numa))))
                continue
            virt = _Node("us", {"preset": "pex-gen5-virt"})
            virt.children = [
                _Node("ds", children=draw(_port_payload(depth + 2, mixed_numa)))
                for _ in range(draw(st.integers(1, 3)))
            ]
            us.children.append(_Node("ds", children=[virt]))
    else:
        # ConnectX-7 integrated switch: the NIC on one port, a second bridge pair to the GPU.
        us = _Node("us", {"preset": "cx7-switch"}, tags={"switch", "cx"})
        nic = _Node("ep", {"preset": draw(st.sampled_from(("cx7-ib", "cx7-eth"))), "driver": "vfio-pci"})
        inner = _Node("us", {"preset": "cx7-switch"})
        inner.children = [_Node("ds", children=[_Node("ep", {"preset": draw(st.sampled_from(GPU_PRESETS))})])]
        us.children = [_Node("ds", children=[nic]), _Node("ds", children=[inner])]
        if draw(st.booleans()):
            us.children.append(_Node("ds", children=draw(_port_payload(depth + 1, mixed_numa))))
    return us


@st.composite
def root_ports(draw, mixed_numa: bool = False, bmc: bool = False) -> _Node:
    rp = _Node("rp", {"preset": draw(st.sampled_from(ROOT_PORT_PRESETS))})
    if bmc and draw(st.integers(0, 7)) == 7:
        # A BMC display behind a PCIe-to-PCI bridge: conventional PCI, cannot be mirrored.
        br = _Node("br", {"preset": "aspeed-bridge"}, tags={"bmc"})
        br.children = [_Node("ep", {"preset": "bmc-vga"})]
        rp.children = [br]
        return rp
    rp.children = draw(_port_payload(0, mixed_numa))
    return rp


@st.composite
def root_complexes(draw, numa: int, mixed_numa: bool = False, bmc: bool = False) -> _Rc:
    children: list[_Node] = []
    if draw(st.integers(0, 3)) == 3:
        children.append(_Node("ep", {"preset": draw(st.sampled_from(RCIEP_PRESETS))}, tags={"rciep"}))
    children += draw(st.lists(root_ports(mixed_numa, bmc), min_size=1, max_size=3))
    return _Rc(numa, children)


# -- worlds ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class World:
    """A host: its description (None for committed fixtures), its model, and what can be assigned."""

    name: str
    topo: str | None
    host: Topology
    assignable: tuple[Bdf, ...]  # non-bridge functions the mirror can place
    unplaceable: tuple[Bdf, ...]  # functions behind a PCIe-to-PCI bridge (PlanError by design)
    tags: frozenset[str] = frozenset()

    def __repr__(self) -> str:  # what hypothesis prints for a falsifying example
        return f"World({self.name!r}, tags={sorted(self.tags)})" + (f"\n--- host.topo ---\n{self.topo}" if self.topo else "")


def render_topo(nodes: Sequence[int], rcs: Sequence[_Rc], cpus_per_node: int = 8) -> str:
    """Number buses the way a BIOS scan would (depth first, each bridge's secondary bus right
    after its parent's) and write the ``.topo`` text."""
    lines = [f"numa {n} cpus={n * cpus_per_node}-{n * cpus_per_node + cpus_per_node - 1}" for n in nodes]
    next_bus = 0

    def emit(n: _Node, bus: int, slot: int, indent: int) -> None:
        nonlocal next_bus
        keys = " ".join(f"{k}={v}" for k, v in n.keys.items())
        lines.append(f"{'  ' * indent}{n.kind} {bus:02x}:{slot:02x}.0" + (f" {keys}" if keys else ""))
        if n.children:
            secondary = next_bus
            next_bus += 1
            for s, c in enumerate(n.children):
                emit(c, secondary, s, indent + 1)

    for rc in rcs:
        bus = next_bus
        next_bus += 1
        lines.append("")
        lines.append(f"rc 0000:{bus:02x} numa={rc.numa}")
        for slot, c in enumerate(rc.children):
            emit(c, bus, slot, 1)
    assert next_bus <= BUS_LIMIT, next_bus
    return "\n".join(lines) + "\n"


def world_from_topo(text: str, name: str = "generated") -> World:
    """Parse and build a description in memory and read it back as the sidecar would."""
    tree: MemoryTree = build_tree(parse_topo(text, name))
    host = Topology(SysfsReader(tree))
    return _world(name, text, host)


def _world(name: str, text: str | None, host: Topology, tags: frozenset[str] = frozenset()) -> World:
    assignable, unplaceable = [], []
    for f in host.functions():
        if f.is_bridge:
            continue
        ancestry = host.ancestry(f)
        # Below the root port the mirror expects (upstream, downstream) pairs; a PCIe-to-PCI
        # bridge breaks that shape.
        if ancestry and host.role(ancestry[0]) == Role.ROOT_PORT and (len(ancestry) - 1) % 2:
            unplaceable.append(f.bdf)
        else:
            assignable.append(f.bdf)
    return World(name, text, host, tuple(assignable), tuple(unplaceable), tags)


@st.composite
def generated_worlds(draw, mixed_numa: bool = False, bmc: bool = True, max_nodes: int = 4) -> World:
    """A generated host (see the module docstring)."""
    n_nodes = draw(st.integers(1, max_nodes))
    nodes = list(range(n_nodes))
    no_numa_host = draw(st.integers(0, 9)) == 9  # firmware reports no NUMA at all
    rcs: list[_Rc] = []
    for node in nodes:
        for _ in range(draw(st.integers(1, 3))):
            numa = -1 if no_numa_host or draw(st.integers(0, 11)) == 11 else node
            rcs.append(draw(root_complexes(numa, mixed_numa, bmc)))
    # Keep the host within one PCI domain's 256 buses (drop root complexes from the end).
    kept, used = [], 0
    for rc in rcs:
        size = 1 + sum(_buses(c) for c in rc.children)
        if used + size > BUS_LIMIT:
            break
        kept.append(rc)
        used += size
    tags: set[str] = set()
    for rc in kept:
        for c in rc.children:
            tags |= _tags(c)
        if rc.numa == -1:
            tags.add("numa-1")
        depth = max((_switch_depth(c) for c in rc.children), default=0)
        if depth:
            tags.add(f"depth{depth}")
    tags.add(f"nodes={n_nodes}")
    text = render_topo(nodes, kept)
    w = world_from_topo(text)
    return World(w.name, w.topo, w.host, w.assignable, w.unplaceable, frozenset(tags))


FIXTURE_HOSTS = ("hgx-h100", "hgx-b200", "dgx-h100", "pcie-2socket", "hgx-h200-snc2")


@functools.cache
def fixture_world(name: str) -> World:
    host = open_host(FIXTURES / name)
    return _world(name, None, host, frozenset({"fixture"}))


def fixture_worlds() -> st.SearchStrategy[World]:
    names = [n for n in FIXTURE_HOSTS if (FIXTURES / n).is_dir()]
    return st.sampled_from(names).map(fixture_world)


def worlds(mixed_numa: bool = False) -> st.SearchStrategy[World]:
    return st.one_of(generated_worlds(mixed_numa=mixed_numa), fixture_worlds())
