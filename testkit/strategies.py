"""Hypothesis strategies: generated host worlds and KubeVirt-shaped domains over them.

A *world* is a host, described as ``.topo`` text (the DSL of :mod:`testkit.synth`, see
``fixtures/README``) and read back through the very reader the sidecar uses::

    .topo text → synth.parse_topo/build_tree → MemoryTree → Topology(SysfsReader(tree))

all in memory. Generated worlds have 1–4 NUMA nodes, one to three host bridges (root
complexes) per node, root-complex integrated endpoints, root ports holding endpoints, empty
ports or switches nested up to three levels: OEM-branded Broadcom parts (never flattened),
Gen4 PEX parts (flattened when nested in each other), Broadcom Gen5 two-level complexes
(``1000:c030`` sub ``1000:0xxx`` on top, ``1000:100b`` virtual switches below; NCCL flattens
them) and ConnectX-7 integrated switches (NIC on one downstream port, a second bridge pair
leading to the GPU on the other, as on DGX H100). Endpoints are GPUs, NICs (multi-function,
with SR-IOV VFs), NVMe and NVSwitch functions; some functions lack optional attributes, some
root complexes (or whole hosts) report ``numa_node`` -1, and a few hosts carry a BMC display
behind a PCIe-to-PCI bridge (a shape the mirror refuses with a PlanError). The committed
fixture hosts are worlds too (:func:`fixture_worlds`).

A *case* is a world plus a KubeVirt-shaped domain (built by :mod:`testkit.kubevirt_sim`) over a
random subset of the world's endpoints, with or without guest NUMA cells (or a single cell
without a memnode map), with or without ACPI, with other devices, and in one of the shapes a
first ``OnDefineDomain`` call can see: fresh, already defined by libvirt (root ports on
pcie-root, addresses), pre-placed by KubeVirt's ``PCINUMAAwareTopology``, or both.

The libvirt/KubeVirt simulation extensions that :mod:`testkit.kubevirt_sim` lacks live here too
(:func:`libvirt_define_all`, :func:`kubevirt_hotplug_ports`, :func:`chained_calls`): they
add the device kinds this module generates, and the ports KubeVirt appends after the last call.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Callable, Sequence

from hypothesis import assume
from hypothesis import strategies as st
from lxml import etree

from pcitopo.topology.libvirt.domain import ROOT_PORT, parse_int
from pcitopo.topology.model.tree import Bdf, Role, Topology
from pcitopo.topology.host.sysfs import SysfsReader, open_host
from pcitopo.topology.host.sources import MemoryTree

from . import FIXTURES
from .kubevirt_sim import (
    DomainSpec,
    _sub,
    kubevirt_domain,
    kubevirt_numa_preplace,
    kubevirt_reparse,
    libvirt_define,
    next_call_input,
    to_kubevirt_bytes,
)
from .kubevirt_releases import RELEASES, Release
from .synth import build_tree, parse_topo

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
    children: list["_Node"] = field(default_factory=list)
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


@functools.lru_cache(maxsize=None)
def fixture_world(name: str) -> World:
    host = open_host(FIXTURES / name)
    return _world(name, None, host, frozenset({"fixture"}))


def fixture_worlds() -> st.SearchStrategy[World]:
    names = [n for n in FIXTURE_HOSTS if (FIXTURES / n).is_dir()]
    return st.sampled_from(names).map(fixture_world)


def worlds(mixed_numa: bool = False) -> st.SearchStrategy[World]:
    return st.one_of(generated_worlds(mixed_numa=mixed_numa), fixture_worlds())


# -- libvirt/KubeVirt simulation extensions -----------------------------------------------------

# Other devices a KubeVirt domain carries (as KubeVirt writes them), by name.
OTHER_DEVICES: dict[str, Callable[[etree._Element], None]] = {}


def _other(name: str):
    def deco(fn):
        OTHER_DEVICES[name] = fn
        return fn
    return deco


@_other("rng")
def _rng(devices: etree._Element) -> None:
    rng = _sub(devices, "rng", model="virtio-non-transitional")
    _sub(rng, "backend", "/dev/urandom", model="random")


@_other("tablet")
def _tablet(devices: etree._Element) -> None:
    inp = _sub(devices, "input", type="tablet", bus="virtio")
    _sub(inp, "alias", name="ua-tablet0")


@_other("vsock")
def _vsock(devices: etree._Element) -> None:
    v = _sub(devices, "vsock", model="virtio-non-transitional")
    _sub(v, "cid", auto="no", address="3")


@_other("disk")
def _disk(devices: etree._Element) -> None:
    disk = _sub(devices, "disk", device="disk", type="file", model="virtio-non-transitional")
    _sub(disk, "source", file="/var/run/kubevirt-private/vmi-disks/datadisk/disk.img")
    _sub(disk, "target", bus="virtio", dev="vdb")
    _sub(disk, "driver", cache="none", name="qemu", type="raw")
    _sub(disk, "alias", name="ua-datadisk")


@_other("serial")
def _serial(devices: etree._Element) -> None:
    s = _sub(devices, "serial", type="unix")
    _sub(s, "target", port="0")
    _sub(s, "source", mode="bind", path="/var/run/kubevirt-private/1234/virt-serial0")


@_other("watchdog")
def _watchdog(devices: etree._Element) -> None:
    # KubeVirt's i6300esb: conventional PCI, so libvirt adds a pcie-to-pci-bridge for it.
    wd = _sub(devices, "watchdog", model="i6300esb", action="poweroff")
    _sub(wd, "alias", name="ua-watchdog")


@_other("nic-on-root")
def _nic_on_root(devices: etree._Element) -> None:
    # A second interface KubeVirt placed itself on pcie-root (placePCIDevicesOnRootComplex).
    iface = _sub(devices, "interface", type="ethernet")
    _sub(iface, "target", dev="tap1", managed="no")
    _sub(iface, "model", type="virtio-non-transitional")
    _sub(iface, "mac", address="02:00:00:aa:bb:cd")
    _sub(iface, "alias", name="ua-secondary")
    _sub(iface, "address", type="pci", domain="0x0000", bus="0x00", slot="0x03", function="0x0")


def add_other_devices(xml: bytes, names: Sequence[str]) -> bytes:
    root = etree.fromstring(xml)
    devices = root.find("devices")
    first_hostdev = devices.find("hostdev")
    for name in names:
        scratch = etree.Element("devices")
        OTHER_DEVICES[name](scratch)
        for el in list(scratch):
            if first_hostdev is not None:
                first_hostdev.addprevious(el)
            else:
                devices.append(el)
    return to_kubevirt_bytes(root)


def single_cell(xml: bytes) -> bytes:
    """A domain with one guest cell and no memnode map (no guestMappingPassthrough)."""
    root = etree.fromstring(xml)
    cpu = root.find("cpu")
    if cpu.find("numa") is None:
        numa = _sub(cpu, "numa")
        vcpus = root.findtext("vcpu") or "4"
        _sub(numa, "cell", id="0", cpus=f"0-{int(vcpus) - 1}", memory=root.findtext("memory") or "4294967296", unit="b")
    return to_kubevirt_bytes(root)


def without_acpi(xml: bytes) -> bytes:
    root = etree.fromstring(xml)
    feats = root.find("features")
    if feats is not None:
        for a in feats.findall("acpi"):
            feats.remove(a)
    return to_kubevirt_bytes(root)


# Device elements libvirt puts on a pcie-root-port of its own when they have no address.
# libvirt's define additions: one simulation for every tier (testkit/kubevirt_sim.py).
libvirt_define_all = libvirt_define


# KubeVirt appends bare root ports for hotplug after the last call while the highest PCI
# controller index is below this (KubeVirt pkg/virt-launcher/virtwrap/manager.go; docs/SOURCES.md).
KUBEVIRT_HOTPLUG_INDEX_LIMIT = 32


def kubevirt_hotplug_ports(xml: bytes) -> bytes:
    """KubeVirt's hotplug root ports: one bare pcie-root-port per index above the highest one,
    up to index 31 (they take buses on pcie-root)."""
    root = etree.fromstring(xml)
    devices = root.find("devices")
    pci = [c for c in devices.findall("controller") if c.get("type") == "pci"]
    highest = max((parse_int(c.get("index"), "index") for c in pci), default=0)
    anchor = pci[-1] if pci else None
    for index in range(highest + 1, KUBEVIRT_HOTPLUG_INDEX_LIMIT):
        rp = etree.Element("controller", type="pci", index=str(index), model=ROOT_PORT)
        if anchor is not None:
            anchor.addnext(rp)
        else:
            devices.insert(0, rp)
        anchor = rp
    return to_kubevirt_bytes(root)


def as_booted(xml: bytes) -> bytes:
    """What libvirt defines from the last call's output: KubeVirt's hotplug ports, then libvirt's
    own additions (addresses for those ports and any unaddressed device)."""
    return libvirt_define_all(kubevirt_hotplug_ports(xml))


def chained_calls(xml: bytes, rewrite: Callable[[bytes], bytes], calls: int = 3,
                  decimal_bus: bool = False, release: Release = Release.MAIN) -> list[tuple[bytes, bytes]]:
    """The 1–3 OnDefineDomain calls of one boot as (input, output) pairs: each later call gets
    the previous output after libvirt's define additions and ``release``'s lossy re-parse."""
    out: list[tuple[bytes, bytes]] = []
    current = xml
    for i in range(calls):
        result = rewrite(current)
        out.append((current, result))
        current = next_call_input(result, release, decimal_bus=decimal_bus and i % 2 == 0)
    return out


# -- domains over a world ------------------------------------------------------------------------

LAYOUTS = ("fresh", "defined", "preplaced", "preplaced-defined")


@dataclass(frozen=True)
class Case:
    world: World
    devices: tuple[Bdf, ...]
    guest_numa: bool  # guestMappingPassthrough: one cell per host node used, memnode map
    single_cell: bool  # no passthrough, one cell, no memnode map
    acpi: bool
    layout: str
    others: tuple[str, ...]
    calls: int
    decimal_bus: bool
    xml: bytes = field(repr=False)
    release: Release = Release.MAIN  # whose re-parse runs between the calls

    @property
    def unplaceable(self) -> bool:
        return any(b in self.world.unplaceable for b in self.devices)

    def __repr__(self) -> str:
        return (f"Case(devices={[str(b) for b in self.devices]}, guest_numa={self.guest_numa}, "
                f"single_cell={self.single_cell}, acpi={self.acpi}, layout={self.layout!r}, "
                f"others={self.others}, calls={self.calls}, decimal_bus={self.decimal_bus},\n"
                f"     world={self.world!r})")


def build_domain(world: World, devices: Sequence[Bdf], *, guest_numa: bool = True, single: bool = False,
                 acpi: bool = True, layout: str = "fresh", others: Sequence[str] = ()) -> bytes:
    xml = kubevirt_domain(world.host, DomainSpec("fuzz", tuple(devices), guest_numa=guest_numa))
    if single and not guest_numa:
        xml = single_cell(xml)
    if not acpi:
        xml = without_acpi(xml)
    if others:
        xml = add_other_devices(xml, others)
    if layout.startswith("preplaced"):
        xml = kubevirt_numa_preplace(xml, world.host)
    if layout.endswith("defined"):
        xml = kubevirt_reparse(libvirt_define_all(xml))
    return xml


@st.composite
def cases(draw, world_strategy: st.SearchStrategy[World] | None = None, max_devices: int = 12,
          allow_unplaceable: bool = True) -> Case:
    world = draw(world_strategy if world_strategy is not None else worlds())
    pool = list(world.assignable)
    if allow_unplaceable and world.unplaceable and draw(st.integers(0, 9)) == 9:
        pool += list(world.unplaceable)
    assume(pool)  # a host whose ports are all empty has nothing to assign
    devices = tuple(draw(st.lists(st.sampled_from(pool), min_size=min(2, len(pool)), max_size=min(max_devices, len(pool)), unique=True)))
    guest_numa = draw(st.integers(0, 3)) != 3
    single = not guest_numa and draw(st.booleans())
    acpi = draw(st.integers(0, 7)) != 7
    layout = draw(st.sampled_from(LAYOUTS))
    others = tuple(draw(st.lists(st.sampled_from(sorted(OTHER_DEVICES)), max_size=3, unique=True)))
    calls = draw(st.integers(1, 3))
    decimal_bus = draw(st.booleans())
    release = draw(st.sampled_from(RELEASES))
    xml = build_domain(world, devices, guest_numa=guest_numa, single=single, acpi=acpi, layout=layout, others=others)
    return Case(world, devices, guest_numa, single, acpi, layout, others, calls, decimal_bus, xml, release)


# -- mutations (for the "only typed errors" property) -----------------------------------------

# Attribute values that have broken parsers somewhere.
NASTY_VALUES = ("", " ", "-1", "0", "256", "0x", "0xzz", "1e3", "0x0000000000000000001", "99999999999999999999",
                "\u0661", "0x1f", "31", "NaN", "0-", "1--3", "^0", "0-4294967295", "ua-pcitopo-x", "pcie-root",
                "pcie-expander-bus", "pcie-switch-upstream-port", "pci", "\x7f", "&", "a" * 300)


@st.composite
def mutated_domains(draw, base: st.SearchStrategy[Case] | None = None) -> tuple[Case, bytes]:
    """A case whose domain (often a later call's input, with controllers) had a few attribute
    values, texts or elements replaced by hostile ones."""
    case = draw(base if base is not None else cases())
    xml = case.xml
    if draw(st.booleans()):
        from pcitopo.topology.guest.rewrite import rewrite_domain
        from pcitopo.topology.errors import PcitopoError

        try:
            xml = kubevirt_reparse(libvirt_define_all(rewrite_domain(xml, case.world.host).xml))
        except PcitopoError:
            pass
    root = etree.fromstring(xml)
    targets = [el for el in root.iter() if isinstance(el.tag, str)
               and el.tag in ("controller", "address", "target", "node", "cell", "memnode", "vcpupin", "hostdev",
                              "alias", "type", "acpi", "numa", "source")]
    for _ in range(draw(st.integers(1, 4))):
        el = draw(st.sampled_from(targets))
        op = draw(st.sampled_from(("attr", "attr", "attr", "text", "drop", "dup")))
        if op == "attr":
            names = sorted(set(el.attrib) | {"index", "bus", "slot", "function", "domain", "busNr", "model", "type",
                                             "name", "id", "cellid", "nodeset", "chassis"})
            el.set(draw(st.sampled_from(names)), draw(st.sampled_from(NASTY_VALUES) | st.text(st.characters(min_codepoint=0x20, max_codepoint=0xD7FF), max_size=8)))
        elif op == "text":
            el.text = draw(st.sampled_from(NASTY_VALUES))
        elif op == "drop" and el.getparent() is not None and el is not root:
            el.getparent().remove(el)
        elif op == "dup" and el.getparent() is not None and el is not root:
            el.addnext(etree.fromstring(etree.tostring(el)))
    return case, etree.tostring(root)


__all__ = [
    "Case", "World", "FIXTURE_HOSTS", "LAYOUTS", "OTHER_DEVICES", "add_other_devices", "as_booted", "build_domain",
    "cases", "chained_calls", "endpoints", "fixture_world", "fixture_worlds", "generated_worlds",
    "kubevirt_hotplug_ports", "libvirt_define_all", "mutated_domains", "render_topo", "root_complexes",
    "root_ports", "single_cell", "switches", "without_acpi", "world_from_topo", "worlds",
]
