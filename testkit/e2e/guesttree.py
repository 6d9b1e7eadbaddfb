"""The guest's PCI printout (see initramfs.py): parse it, lay it out as a
sysfs-shaped directory the project's reader can open, and map guest BDFs back
to the hostdevs their stand-ins replace.

Mapping back works on tree *structure*, not on bus numbers the firmware chose:
a guest function's realpath is ``/sys/devices/pci0000:RR/<hop>/.../<hop>``
and every hop ``DDDD:BB:SS.F`` sits at slot SS function F of its parent bus,
which is exactly the ``slot``/``function`` of the libvirt ``<address>`` of the
controller (or device) at that level. The root ``pci0000:RR`` is bus 0 for
``pcie-root`` and ``busNr`` for a ``pcie-expander-bus``. So the key
``(RR, ((slot, fn), ...))`` is computed on both sides; a device that comes up
under the wrong root (busNr too low, overlapping ranges) does not match.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from lxml import etree

from .initramfs import BEGIN_MARKER, END_MARKER

BDF_RE = re.compile(r"^([0-9a-f]{4}):([0-9a-f]{2}):([0-9a-f]{2})\.([0-7])$")


class GuestAddr(NamedTuple):
    """A libvirt guest PCI address: ``bus`` is the *controller index*."""

    bus: int
    slot: int
    function: int


@dataclass(frozen=True)
class StandIn:
    """What replaced one ``<hostdev>`` in the bootable domain."""

    alias: str  # the alias of the hostdev (and of its stand-in)
    source: str | None  # host BDF "0000:18:00.0" (None for mdev)
    kind: str  # "gpu" | "nic" | "other"
    element: str  # "video" | "interface" | "rng"
    model: str  # "virtio", "bochs", "e1000e", ...


@dataclass
class GuestFunction:
    bdf: str
    realpath: str  # as the guest printed it, "/sys/devices/pci0000:20/..."
    attrs: dict[str, str] = field(default_factory=dict)
    absent: set[str] = field(default_factory=set)
    unreadable: set[str] = field(default_factory=set)
    links: dict[str, str] = field(default_factory=dict)

    def attr(self, name: str) -> str | None:
        return self.attrs.get(name)

    @property
    def numa_node(self) -> int | None:
        v = self.attrs.get("numa_node")
        return int(v) if v is not None else None

    @property
    def root(self) -> str:
        """``pci0000:RR`` the function hangs below."""
        return self.realpath.split("/")[3]

    @property
    def hops(self) -> tuple[str, ...]:
        """The BDF components below the root, ending with this function."""
        return tuple(self.realpath.split("/")[4:])


@dataclass
class GuestPrintout:
    functions: dict[str, GuestFunction]
    nodes: dict[int, str]  # guest NUMA node -> cpulist
    lspci_tree: str
    raw: str
    info: dict[str, str] = field(default_factory=dict)
    # fw_cfg blobs by name below by_name/ (``opt/...``), as the guest read them
    fwcfg: dict[str, bytes] = field(default_factory=dict)

    def by_root(self, root: str) -> list[GuestFunction]:
        return [f for f in self.functions.values() if f.root == root]


class PrintoutError(RuntimeError):
    pass


def parse_printout(serial_text: str) -> GuestPrintout:
    """Parse the init's printout out of a serial log (kernel noise, CRs and
    terminal escapes are ignored: every line of ours starts with ``@@``)."""
    body = _our_lines(serial_text)
    functions: dict[str, GuestFunction] = {}
    nodes: dict[int, str] = {}
    lspci: list[str] = []
    info: dict[str, str] = {}
    sizes: dict[str, int] = {}
    hexes: dict[str, list[str]] = {}
    for line in body:
        tag, _, rest = line.partition(" ")
        if tag == "@@LSPCI":
            lspci.append(rest)
            continue
        if tag == "@@DEV":
            bdf, realpath = rest.split(" ", 1)
            functions[bdf] = GuestFunction(bdf, realpath)
        elif tag == "@@ATTR":
            bdf, name, *value = rest.split(" ", 2)
            functions[bdf].attrs[name] = value[0] if value else ""
        elif tag == "@@ABSENT":
            bdf, name = rest.split(" ", 1)
            functions[bdf].absent.add(name)
        elif tag == "@@UNREADABLE":
            bdf, name = rest.split(" ", 1)
            functions[bdf].unreadable.add(name)
        elif tag == "@@LINK":
            bdf, name, target = rest.split(" ", 2)
            functions[bdf].links[name] = target
        elif tag == "@@INFO":
            k, *v = rest.split(" ", 1)
            info[k] = v[0].strip() if v else ""
        elif tag == "@@NODE":
            n, *cpulist = rest.split(" ", 1)
            nodes[int(n)] = cpulist[0] if cpulist else ""
        elif tag == "@@FWCFG-SIZE":
            name, size = rest.rsplit(" ", 1)
            sizes[name] = int(size)
            hexes.setdefault(name, [])
        elif tag == "@@FWCFG":
            name, digits = rest.rsplit(" ", 1)
            hexes.setdefault(name, []).append(digits)
        elif tag in ("@@RES", "@@DMESG"):
            continue  # BARs and kernel lines: read by mmio_boot.count_bars
        else:
            raise PrintoutError(f"unexpected line in printout: {line!r}")
    fwcfg = {name: bytes.fromhex("".join(parts)) for name, parts in hexes.items()}
    for name, size in sizes.items():
        if len(fwcfg[name]) != size:
            raise PrintoutError(f"fw_cfg {name}: {len(fwcfg[name])} bytes printed, the guest read {size}")
    return GuestPrintout(functions, nodes, "\n".join(lspci), "\n".join(body), info, fwcfg)


def _our_lines(serial_text: str) -> list[str]:
    """The ``@@`` lines between the begin and end markers."""
    lines: list[str] = []
    for raw in serial_text.replace("\r", "").split("\n"):
        i = raw.find("@@")
        if i >= 0:
            lines.append(raw[i:])
    try:
        start = lines.index(BEGIN_MARKER)
    except ValueError:
        raise PrintoutError("no begin marker in the serial log") from None
    try:
        end = lines.index(END_MARKER, start)
    except ValueError:
        raise PrintoutError("no end marker in the serial log (guest did not finish)") from None
    return lines[start + 1 : end]


def guest_sysfs_tree(printout: GuestPrintout, out_dir: str | os.PathLike) -> Path:
    """Write the printout as a directory laid out like ``/sys``:

    - ``bus/pci/devices/<BDF>`` → ``../../../devices/pci0000:RR/.../<BDF>``
    - the attribute files the guest had, text plus a trailing newline
    - the ``driver``/``iommu_group``/``physfn`` links with the guest's link text
      (dangling here; readers only read the link text)
    - ``devices/system/node/node<N>/cpulist``

    Returns ``out_dir``; open it with ``pcitopo.host.sysfs.open_host(out_dir)``.
    """
    out = Path(out_dir)
    devdir = out / "bus" / "pci" / "devices"
    devdir.mkdir(parents=True, exist_ok=True)
    for f in printout.functions.values():
        if not f.realpath.startswith("/sys/devices/"):
            raise PrintoutError(f"{f.bdf}: unexpected realpath {f.realpath}")
        rel = f.realpath[len("/sys/") :]
        d = out / rel
        d.mkdir(parents=True, exist_ok=True)
        for name, value in f.attrs.items():
            (d / name).write_text(value + "\n")
        for name, target in f.links.items():
            link = d / name
            if link.is_symlink():
                link.unlink()
            link.symlink_to(target)
        link = devdir / f.bdf
        if link.is_symlink():
            link.unlink()
        link.symlink_to(os.path.join("..", "..", "..", rel))
    for n, cpulist in printout.nodes.items():
        nd = out / "devices" / "system" / "node" / f"node{n}"
        nd.mkdir(parents=True, exist_ok=True)
        (nd / "cpulist").write_text(cpulist + "\n")
    return out


# ---------------------------------------------------------------------------
# guest address <-> guest BDF


def _int(v: str | None, default: int = 0) -> int:
    if v is None:
        return default
    v = v.strip()
    return int(v, 16) if v.lower().startswith("0x") else int(v, 10)


class StructKey(NamedTuple):
    root_bus: int
    hops: tuple[tuple[int, int], ...]  # (slot, function) from the root down


def _pci_address(el: etree._Element) -> GuestAddr | None:
    a = el.find("address")
    if a is None or a.get("type") != "pci":
        return None
    return GuestAddr(_int(a.get("bus")), _int(a.get("slot")), _int(a.get("function")))


def structural_keys(domain_xml: bytes) -> dict[GuestAddr, StructKey]:
    """For every PCI address in a (defined) domain: its structural key."""
    root = etree.fromstring(domain_xml, etree.XMLParser(resolve_entities=False, no_network=True))
    controllers: dict[int, etree._Element] = {}
    for c in root.iterfind("devices/controller[@type='pci']"):
        controllers[_int(c.get("index"))] = c

    def key_of(addr: GuestAddr, depth: int = 0) -> StructKey | None:
        if depth > 64:
            return None
        parent = controllers.get(addr.bus)
        if parent is None:
            return None
        model = parent.get("model")
        hop = ((addr.slot, addr.function),)
        if model in ("pcie-root", "pci-root"):
            return StructKey(0, hop)
        if model == "pcie-expander-bus" or model == "pci-expander-bus":
            t = parent.find("target")
            bus_nr = _int(t.get("busNr")) if t is not None and t.get("busNr") else None
            if bus_nr is None:
                return None
            return StructKey(bus_nr, hop)
        paddr = _pci_address(parent)
        if paddr is None:
            return None
        up = key_of(paddr, depth + 1)
        return None if up is None else StructKey(up.root_bus, up.hops + hop)

    keys: dict[GuestAddr, StructKey] = {}
    for el in root.iter():
        if not isinstance(el.tag, str) or el.tag != "address":
            continue
        parent = el.getparent()
        if parent is None or parent.tag in ("source",):
            continue
        addr = _pci_address(parent)
        if addr is None:
            continue
        k = key_of(addr)
        if k is not None:
            keys[addr] = k
    return keys


def guest_key(fn: GuestFunction) -> StructKey:
    m = re.match(r"^pci([0-9a-f]{4}):([0-9a-f]{2})$", fn.root)
    if not m:
        raise PrintoutError(f"{fn.bdf}: unexpected root {fn.root}")
    hops = []
    for comp in fn.hops:
        b = BDF_RE.match(comp)
        if not b:
            raise PrintoutError(f"{fn.bdf}: unexpected path component {comp}")
        hops.append((int(b.group(3), 16), int(b.group(4))))
    return StructKey(int(m.group(2), 16), tuple(hops))


def map_guest_bdfs(
    printout: GuestPrintout,
    domain_xml: bytes,
    mapping: Mapping[GuestAddr, StandIn],
) -> dict[str, StandIn]:
    """Guest BDF → the hostdev whose stand-in it is. ``domain_xml`` is the
    domain as libvirt defined it (``virsh dumpxml``), so every controller has
    its address; ``mapping`` is what make_bootable returned. Stand-ins that
    do not show up where the domain put them are simply absent from the
    result (compare its size with ``mapping``)."""
    keys = structural_keys(domain_xml)
    by_key: dict[StructKey, StandIn] = {}
    for addr, standin in mapping.items():
        k = keys.get(addr)
        if k is not None:
            by_key[k] = standin
    out: dict[str, StandIn] = {}
    for fn in printout.functions.values():
        s = by_key.get(guest_key(fn))
        if s is not None:
            out[fn.bdf] = s
    return out


def guest_bdf_of(printout: GuestPrintout, domain_xml: bytes, addr: GuestAddr) -> str | None:
    """The guest BDF at which the device with libvirt address ``addr`` appeared."""
    k = structural_keys(domain_xml).get(addr)
    if k is None:
        return None
    for fn in printout.functions.values():
        if guest_key(fn) == k:
            return fn.bdf
    return None


def bus_overlaps(printout: GuestPrintout) -> list[str]:
    """Bus-number conflicts visible in the guest: a root bus ``pci0000:BB``
    whose number also lies inside a bridge's [secondary, subordinate] range
    below another root. This is what an expander bus whose ``busNr`` leaves
    too little room for the previous one looks like; the kernel then shows
    one of the two subtrees and silently drops the other. Needs the
    ``secondary_bus_number``/``subordinate_bus_number`` attributes."""
    roots = {int(f.root[-2:], 16) for f in printout.functions.values()}
    out = []
    for f in printout.functions.values():
        sec = f.attrs.get("secondary_bus_number")
        sub = f.attrs.get("subordinate_bus_number")
        if sec is None or sub is None:
            continue
        lo, hi = int(sec, 0), int(sub, 0)
        own = int(f.root[-2:], 16)
        for r in sorted(roots):
            if r != own and lo <= r <= hi:
                out.append(
                    f"root bus {r:02x} lies inside bridge {f.bdf}'s bus range "
                    f"[{lo:02x}-{hi:02x}] below {f.root}"
                )
    return out
