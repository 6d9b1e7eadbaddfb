"""Typed views over the PCI side of a libvirt domain: controllers, hostdevs, guest addresses, NUMA cells and pins, and the
devices libvirt will place itself. XPath strings and attribute spellings live in this room (``pcitopo/libvirt/``) and nowhere else;
the document itself (parse, serialisation, indentation) is :mod:`pcitopo.libvirt.document`'s,
the ``<os>``/``<memory>``/``<cpu>`` spellings :mod:`pcitopo.libvirt.machine`'s.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from lxml import etree

from pcitopo.errors import DomainError, quoted
from pcitopo.libvirt.document import append_child, remove_element
from pcitopo.model.address import MAX_CONTROLLER_INDEX, address_in_range
from pcitopo.model.tree import Bdf

QEMU_NS = "http://libvirt.org/schemas/domain/qemu/1.0"
Q = f"{{{QEMU_NS}}}"  # lxml's prefix for qemu: elements (Clark notation)

# Every controller we create carries an alias with this prefix; KubeVirt keeps controller
# aliases through its re-parse only when they start with "ua-".
OUR_ALIAS_PREFIX = "ua-pcitopo-"

# libvirt's default (and only PCI) hostdev mode, written out where KubeVirt leaves it implicit.
HOSTDEV_MODE = "subsystem"

PXB = "pcie-expander-bus"
ROOT_PORT = "pcie-root-port"
UPSTREAM = "pcie-switch-upstream-port"
DOWNSTREAM = "pcie-switch-downstream-port"
PCIE_ROOT = "pcie-root"

# libvirt model → QEMU device (libvirt's <model name> at define; ours write it, KubeVirt's re-parse drops it).
QEMU_MODEL_NAME = {PXB: "pxb-pcie", ROOT_PORT: "pcie-root-port", UPSTREAM: "x3130-upstream", DOWNSTREAM: "xio3130-downstream",
                   "pcie-to-pci-bridge": "pcie-pci-bridge"}


def parse_int(text: str | None, what: str | Callable[[], str]) -> int:
    """Addresses come as hex ('0x0a') from libvirt and KubeVirt, or decimal from re-parses.
    ``what`` names the value in the error; a callable is asked only on an error (the hook
    reads hundreds of addresses per call and names none of them when they parse)."""
    if text is None:
        raise DomainError(f"{what() if callable(what) else what} is missing")
    try:
        return _fast_int(text)
    except ValueError:
        pass
    t = text.strip().lower()
    try:
        return int(t, 16) if t.startswith("0x") else int(t, 10)
    except ValueError:
        raise DomainError(f"{what() if callable(what) else what}={quoted(text)!r} is not a number") from None


def _fast_int(text: str) -> int:
    """``parse_int`` for what libvirt and KubeVirt write ('0x0a', '10'); ValueError for anything
    else (spaces, upper case), which ``parse_int`` then reads the long way or names."""
    return int(text, 16) if text.startswith("0x") else int(text, 10)


# Parsed attribute strings, shared by every call: a hook call reads about 180 addresses of a
# few dozen distinct spellings, and a VM's spellings repeat across its defines. Bounded: past
# the limit a spelling is parsed and not kept.
_PARSED: dict[tuple, tuple[int, ...]] = {}
_PARSED_MAX = 4096


def read_ints(get: Callable[[str, str | None], str | None], fields: tuple[tuple[str, str | None], ...],
              what: Callable[[str], str]) -> tuple[int, ...]:
    """The integer attributes ``fields`` ((name, default), ...) of an element whose ``get`` is
    given. The hook reads a hundred addresses a call: ``what(name)``, the name in an error, is
    only asked for when one does not parse."""
    raw = tuple([get(name, default) for name, default in fields])
    hit = _PARSED.get(raw)
    if hit is not None:
        return hit
    try:
        out = tuple([_fast_int(text) for text in raw])
    except (TypeError, ValueError, AttributeError):  # missing (None) or odd: the long way names it
        return tuple(parse_int(text, lambda name=name: what(name)) for text, (name, _) in zip(raw, fields))
    if len(_PARSED) < _PARSED_MAX:
        _PARSED[raw] = out
    return out


ADDRESS_FIELDS = (("bus", "0"), ("slot", "0"), ("function", "0"), ("domain", "0"))  # GuestAddress's order
SOURCE_FIELDS = (("domain", "0"), ("bus", None), ("slot", None), ("function", "0"))  # Bdf's order


class GuestAddress(NamedTuple):
    """A guest PCI address: ``bus`` is the index of the controller it plugs into."""

    bus: int
    slot: int
    function: int
    domain: int = 0


def read_guest_address(el: etree._Element) -> GuestAddress | None:
    addr = el.find("address")
    if addr is None or addr.get("type") != "pci":
        return None
    a = GuestAddress(*read_ints(addr.get, ADDRESS_FIELDS, lambda name: f"<{el.tag}> address {name}"))
    if not address_in_range(a.domain, a.bus, a.slot, a.function):
        raise DomainError(f"<{el.tag}> address {a.domain:x}:{a.bus:x}:{a.slot:x}.{a.function:x} is out of range")
    return a


def write_guest_address(el: etree._Element, a: GuestAddress, multifunction: bool = False) -> None:
    old = el.find("address")
    new = etree.Element("address")
    new.set("type", "pci")
    new.set("domain", f"0x{a.domain:04x}")
    new.set("bus", f"0x{a.bus:02x}")
    new.set("slot", f"0x{a.slot:02x}")
    new.set("function", f"0x{a.function:x}")
    if multifunction:
        new.set("multifunction", "on")
    if old is not None:
        new.tail = old.tail
        el.replace(old, new)
    else:
        append_child(el, new)


def pci_controller_element(
    index: int,
    model: str,
    *,
    alias: str | None = None,
    bus_nr: int | None = None,
    node: int | None = None,
    chassis: int | None = None,
    port: int = 0,
    address: GuestAddress | None = None,
) -> etree._Element:
    """A ``<controller type='pci'>`` as we write it: the QEMU model name, target, alias and
    address re-emitted explicitly, since KubeVirt's re-parse drops some of them."""
    el = etree.Element("controller")
    el.set("type", "pci")
    el.set("index", str(index))
    el.set("model", model)
    if model in QEMU_MODEL_NAME:
        etree.SubElement(el, "model").set("name", QEMU_MODEL_NAME[model])
    if bus_nr is not None:
        target = etree.SubElement(el, "target")
        target.set("busNr", str(bus_nr))
        if node is not None:
            etree.SubElement(target, "node").text = str(node)
    elif chassis is not None:
        target = etree.SubElement(el, "target")
        target.set("chassis", str(chassis))
        target.set("port", f"0x{port:x}")
    if alias is not None:
        etree.SubElement(el, "alias").set("name", alias)
    if address is not None:
        write_guest_address(el, address)
    return el


# -- views ------------------------------------------------------------------------------------

@dataclass
class PciController:
    """A ``<controller type='pci'>``."""

    el: etree._Element

    @property
    def index(self) -> int:
        index = parse_int(self.el.get("index"), "pci controller index")
        if not 0 <= index <= MAX_CONTROLLER_INDEX:
            raise DomainError(f"pci controller index {index} is out of range (0-{MAX_CONTROLLER_INDEX})")
        return index

    @property
    def model(self) -> str:
        return self.el.get("model") or ""

    @property
    def alias(self) -> str | None:
        a = self.el.find("alias")
        return a.get("name") if a is not None else None

    @property
    def ours(self) -> bool:
        return (self.alias or "").startswith(OUR_ALIAS_PREFIX)

    @property
    def address(self) -> GuestAddress | None:
        return read_guest_address(self.el)

    @property
    def bus_nr(self) -> int | None:
        t = self.el.find("target")
        return parse_int(t.get("busNr"), "busNr") if t is not None and t.get("busNr") is not None else None

    @property
    def chassis(self) -> int | None:
        t = self.el.find("target")
        return parse_int(t.get("chassis"), "chassis") if t is not None and t.get("chassis") is not None else None

    @property
    def node(self) -> int | None:
        n = self.el.find("target/node")
        return parse_int(n.text, "target node") if n is not None else None


@dataclass
class PciHostdev:
    """A ``<hostdev mode='subsystem' type='pci'>`` (KubeVirt omits mode)."""

    el: etree._Element

    @property
    def source_address(self) -> etree._Element | None:
        return self.el.find("source/address")

    @property
    def source(self) -> Bdf:
        a = self.source_address
        if a is None:
            raise DomainError(f"hostdev {quoted(self.alias or '')} has no <source><address>".replace("  ", " "))
        def where() -> str:  # only for an error: the alias is looked up then
            return f"hostdev {quoted(self.alias or '(no alias)')} source"

        dom, bus, slot, fn = read_ints(a.get, SOURCE_FIELDS, lambda name: f"{where()} {name}")
        if not address_in_range(dom, bus, slot, fn):
            raise DomainError(f"{where()} {dom:x}:{bus:x}:{slot:x}.{fn:x} is out of range")
        return Bdf(dom, bus, slot, fn)

    @property
    def alias(self) -> str | None:
        a = self.el.find("alias")
        return a.get("name") if a is not None else None

    @property
    def address(self) -> GuestAddress | None:
        return read_guest_address(self.el)

    def give_mode(self) -> bool:
        """Write libvirt's default ``mode='subsystem'`` when the hostdev has none (KubeVirt
        writes none). libvirt reads both the same, but the Go model KubeVirt's Plugins pipeline
        parses the domain with (libvirt-go-xml-module) refuses a hostdev without ``mode``:
        kubevirt/kubevirt#18861. First among the attributes, where libvirt writes it."""
        if self.el.get("mode") is not None:
            return False
        rest = dict(self.el.attrib)
        self.el.attrib.clear()
        self.el.set("mode", HOSTDEV_MODE)
        for k, v in rest.items():
            self.el.set(k, v)
        return True

    def format_as_libvirt(self) -> list[str]:
        """Drop what libvirt's schema has no room for, the way libvirt itself writes the hostdev:
        a ``type`` on the source address (KubeVirt writes ``type='pci'``; the re-parse of
        KubeVirt v1.6 and v1.7 writes ``type=''``) and an empty ``<driver>`` (v1.9's re-parse
        keeps only the ``iommufd`` attribute of libvirt's ``<driver name='vfio'/>``). Returns
        what was dropped, spelled as it was."""
        dropped = []
        src = self.source_address
        if src is not None and "type" in src.attrib:
            dropped.append(f"source address type='{src.attrib.pop('type')}'")
        for drv in self.el.findall("driver"):
            if not drv.attrib and len(drv) == 0 and not (drv.text or "").strip():
                remove_element(drv)
                dropped.append("empty <driver>")
        return dropped


@dataclass(frozen=True)
class NumaCell:
    id: int
    cpus: str | None


class DomainView:
    """Read-only facts from a domain that the planner needs, and the elements it edits."""

    def __init__(self, tree: etree._ElementTree):
        self.tree = tree
        self.root = tree.getroot()
        devices = self.root.find("devices")
        if devices is None:
            raise DomainError("domain has no <devices>")
        self.devices = devices

    def machine(self) -> str:
        t = self.root.find("os/type")
        return (t.get("machine") or "") if t is not None else ""

    def check_q35(self) -> None:
        machine = self.machine()
        if "q35" not in machine:
            raise DomainError(
                f"machine type is {quoted(machine or 'unset')!r}, not q35: PCIe expander buses and switches need q35"
            )

    def pci_controllers(self) -> list[PciController]:
        return [PciController(el) for el in self.devices.findall("controller") if el.get("type") == "pci"]

    def pci_hostdevs(self) -> list[PciHostdev]:
        return [PciHostdev(el) for el in self.devices.findall("hostdev") if el.get("type") == "pci"]

    def has_acpi(self) -> bool:
        return self.root.find("features/acpi") is not None

    def numa_cells(self) -> list[NumaCell]:
        cells = []
        for c in self.root.findall("cpu/numa/cell"):
            cid = c.get("id")
            if cid is None:
                continue
            cells.append(NumaCell(parse_int(cid, "numa cell id"), c.get("cpus")))
        return cells

    def memnodes(self) -> list[tuple[int, str]]:
        """(guest cell, host nodeset) from <numatune><memnode>."""
        out = []
        for m in self.root.findall("numatune/memnode"):
            if m.get("cellid") is not None and m.get("nodeset"):
                out.append((parse_int(m.get("cellid"), "memnode cellid"), m.get("nodeset") or ""))
        return out

    def unplaced_pci_devices(self) -> tuple[int, int]:
        """(PCIe, conventional PCI) devices without a guest address: libvirt will place each
        PCIe one on a new root port of pcie-root, and the conventional ones behind a
        pcie-to-pci-bridge (what that costs in buses: :func:`pcitopo.guest.buses.pcie_root_buses_for`)."""
        pcie = conventional = 0
        for el in self.devices:
            if isinstance(el.tag, str) and el.find("address") is None and _needs_pci_slot(el):
                if _conventional_pci(el):
                    conventional += 1
                else:
                    pcie += 1
        return pcie, conventional

    def kubevirt_pci_devices(self) -> int:
        """What KubeVirt's ``CountPCIDevices`` counted on the domain before the hook calls
        (``converter/pci-placement.go``, ``iteratePCIAddresses``: interfaces, PCI hostdevs,
        controllers, virtio disks and inputs, watchdogs, rng, memballoon, each without an
        address or with a PCI one), read from any call's input: its placeholder interfaces, the
        PCI controllers libvirt, KubeVirt and pcitopo add, and the SATA controller libvirt adds
        on q35 are not counted, so every call of one boot reads the same number."""
        n = 0
        for el in self.devices:
            if not isinstance(el.tag, str) or not _kubevirt_counts(el):
                continue
            a = el.find("address")
            n += a is None or a.get("type") in (None, "", "pci")
        return n

    def vcpupins(self) -> list[tuple[int, str]]:
        out = []
        for p in self.root.findall("cputune/vcpupin"):
            if p.get("vcpu") is not None and p.get("cpuset"):
                out.append((parse_int(p.get("vcpu"), "vcpupin vcpu"), p.get("cpuset") or ""))
        return out


# Linux's largest NR_CPUS; no cpu or node list can name more.
MAX_CPUSET_MEMBERS = 8192


# Devices libvirt puts on a root port of pcie-root when they carry no address.
_PCI_DEVICE_TAGS = frozenset({"interface", "rng", "memballoon", "vsock", "filesystem", "watchdog", "shmem", "sound"})
# Models QEMU offers only as conventional PCI on q35: libvirt puts them behind a
# pcie-to-pci-bridge inside a root port.
_CONVENTIONAL_PCI_MODELS = frozenset({"i6300esb", "e1000", "rtl8139", "ne2k_pci", "pcnet", "es1370", "ac97", "ich6", "lsilogic"})


def _needs_pci_slot(el: etree._Element) -> bool:
    if el.tag in _PCI_DEVICE_TAGS:
        model = el.find("model")
        return not (el.tag == "memballoon" and el.get("model") == "none") and (model is None or model.get("type") != "none")
    if el.tag == "hostdev":
        return el.get("type") == "mdev"  # a vGPU: a PCI function in the guest (type='pci' ones are ours)
    if el.tag == "disk":
        t = el.find("target")
        return t is not None and t.get("bus") == "virtio"
    if el.tag == "controller":
        return el.get("type") in ("virtio-serial", "scsi") or (el.get("type") == "usb" and el.get("model") not in (None, "none"))
    if el.tag == "input":
        return el.get("bus") == "virtio"
    return False


# KubeVirt's hotplug placeholders (network/nichotplug.go newInterfacePlaceholder): alias and
# target dev ``placeholder-N``; they exist only for the first define.
_PLACEHOLDER = re.compile(r"placeholder-[0-9]+")


def _kubevirt_counts(el: etree._Element) -> bool:
    """Whether ``CountPCIDevices`` counts ``el`` (see :meth:`DomainView.kubevirt_pci_devices`)."""
    tag = el.tag
    if tag == "interface":
        alias = el.find("alias")
        return alias is None or not _PLACEHOLDER.fullmatch(alias.get("name") or "")
    if tag == "hostdev":
        return el.get("type") == "pci"
    if tag == "controller":
        return el.get("type") not in ("pci", "sata")
    if tag in ("disk", "input"):
        bus = el.find("target").get("bus") if tag == "disk" and el.find("target") is not None else el.get("bus")
        return bus == "virtio"
    return tag in ("watchdog", "rng", "memballoon")


def _conventional_pci(el: etree._Element) -> bool:
    model = el.get("model") or ""
    m = el.find("model")
    if m is not None:
        model = m.get("type") or model
    return model in _CONVENTIONAL_PCI_MODELS


def parse_cpuset(text: str) -> set[int]:
    """libvirt/kernel cpu lists: '0-3,8,10-11', with '^N' exclusions. Bounded: a list naming
    more than MAX_CPUSET_MEMBERS cpus/nodes is refused, whatever its length in bytes."""
    out: set[int] = set()
    excluded: set[int] = set()
    if len(text or "") > 64 * 1024:
        raise DomainError("cpu/node list is longer than 64 KiB")
    for part in (text or "").split(","):
        part = part.strip()
        if not part:
            continue
        target = out
        if part.startswith("^"):
            target, part = excluded, part[1:]
        try:
            if "-" in part:
                lo, hi = part.split("-", 1)
                lo_i, hi_i = int(lo), int(hi)
                if lo_i < 0 or hi_i < lo_i or hi_i >= MAX_CPUSET_MEMBERS:
                    raise ValueError
                target.update(range(lo_i, hi_i + 1))
            else:
                n = int(part)
                if not 0 <= n < MAX_CPUSET_MEMBERS:
                    raise ValueError
                target.add(n)
        except ValueError:
            raise DomainError(f"cannot read cpu/node list {text[:60]!r}: want ids 0-{MAX_CPUSET_MEMBERS - 1}") from None
    return out - excluded
