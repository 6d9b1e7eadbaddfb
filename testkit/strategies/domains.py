"""Hypothesis strategies over domains: KubeVirt-shaped domains over a world's endpoints (cases),
hostile mutations of them, and the libvirt/KubeVirt simulation extensions they need (see
:mod:`testkit.strategies`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from hypothesis import assume, strategies as st
from lxml import etree

from pcitopo.kubevirt.launcher.release_groups import RELEASES, Release
from pcitopo.libvirt.define_sim import libvirt_define
from pcitopo.libvirt.domain import ROOT_PORT, parse_int
from pcitopo.libvirt.marshal import sub as _sub, to_kubevirt_bytes
from pcitopo.model.tree import Bdf

from ..kubevirt_sim import (
    DomainSpec,
    kubevirt_domain,
    kubevirt_numa_preplace,
    kubevirt_reparse,
    next_call_input,
)
from .hosts import World, worlds

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
        from pcitopo.errors import PcitopoError
        from pcitopo.guest.rewrite import rewrite_domain

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
            el.set(draw(st.sampled_from(names)),
                   draw(st.sampled_from(NASTY_VALUES) | st.text(st.characters(min_codepoint=0x20, max_codepoint=0xD7FF), max_size=8)))
        elif op == "text":
            el.text = draw(st.sampled_from(NASTY_VALUES))
        elif op == "drop" and el.getparent() is not None and el is not root:
            el.getparent().remove(el)
        elif op == "dup" and el.getparent() is not None and el is not root:
            el.addnext(etree.fromstring(etree.tostring(el)))
    return case, etree.tostring(root)
