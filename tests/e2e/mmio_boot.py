"""The MMIO tier (issue 11): boot rewritten domains with large-BAR stand-ins and count the BARs
the guest kernel assigned.

A GPU's BARs are stood in for by QEMU ``ivshmem-plain`` devices: its BAR2 is a 64-bit
prefetchable BAR of exactly the size of its ``memory-backend-ram`` (``share=on,reserve=off``: the
memory is mapped, never reserved or touched). Per GPU hostdev, at the guest address the rewrite
gave it: function 0 with the GPU's large BAR (128 GiB for H100, 256 GiB for B200) and function 1
with its second 64-bit prefetchable BAR (32 MiB). libvirt has no element for ivshmem with a
given backend, so the stand-ins go through ``<qemu:commandline>`` as JSON ``-object``/``-device``
arguments; ``bus`` is the QEMU id of the port the hostdev sat on, which is that controller's
alias (libvirt uses user aliases as device ids).

The guest's ``/init`` prints every function's ``resource`` file (``@@RES`` lines) and the
kernel's BAR messages (``@@DMESG``); :func:`count_bars` reads them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from lxml import etree

from topology.model.bars import Bar
from topology.libvirt.domain import parse_int

QEMU_NS = "http://libvirt.org/schemas/domain/qemu/1.0"
Q = f"{{{QEMU_NS}}}"
IVSHMEM = ("0x1af4", "0x1110")  # ivshmem's vendor:device in the guest
OVMF = "/usr/share/ovmf/OVMF.fd"  # Debian's `ovmf` package (2022.11)
KEEP_CPU = ("maxphysaddr", "feature")
MiB, GiB = 1 << 20, 1 << 30


def large_bar_standins(domain_xml: bytes, bar_sizes: dict[str, tuple[int, ...]]) -> tuple[bytes, int]:
    """Replace each hostdev whose alias is in ``bar_sizes`` by ivshmem functions with those
    BAR sizes (one function each, at the hostdev's slot). Returns (XML, functions added)."""
    root = etree.fromstring(domain_xml)
    devices = root.find("devices")
    alias_of = {parse_int(c.get("index"), "index"): c.find("alias").get("name")
                for c in devices.findall("controller") if c.get("type") == "pci" and c.find("alias") is not None}
    args: list[str] = []
    removed: set[str] = set()
    for hd in devices.findall("hostdev"):
        alias = hd.find("alias").get("name") if hd.find("alias") is not None else None
        if alias not in bar_sizes:
            continue
        a = hd.find("address")
        bus = alias_of[parse_int(a.get("bus"), "bus")]
        slot = parse_int(a.get("slot"), "slot")
        base = parse_int(a.get("function", "0"), "function")  # NIC ports share a slot
        for k, size in enumerate(bar_sizes[alias]):
            fn = base + k
            mem = f"{alias}-m{fn}"
            args += ["-object", json.dumps({"qom-type": "memory-backend-ram", "id": mem, "size": size,
                                            "share": True, "reserve": False}, separators=(",", ":"))]
            dev = {"driver": "ivshmem-plain", "id": f"{alias}-f{fn}", "memdev": mem, "bus": bus,
                   "addr": f"0x{slot:x}.0x{fn:x}"}
            if fn == 0 and (len(bar_sizes[alias]) > 1 or a.get("multifunction") == "on"):
                dev["multifunction"] = True
            args += ["-device", json.dumps(dev, separators=(",", ":"))]
        devices.remove(hd)
        removed.add(alias)
    # libvirt would put devices without an address on the ports the hostdevs left empty (it
    # does not see the stand-ins): drop them, the guest needs none of them.
    for el in list(devices):
        if el.find("address") is None and (
            el.tag in ("interface", "channel", "rng", "memballoon")
            or (el.tag == "controller" and el.get("type") in ("scsi", "virtio-serial"))
        ):
            devices.remove(el)
    etree.SubElement(devices, "memballoon", model="none")
    for ov in root.findall(f"{Q}override"):  # hostdev properties (cliques) go with the hostdev
        for dev in ov.findall(f"{Q}device"):
            if dev.get("alias") in removed:
                ov.remove(dev)
        if len(ov) == 0:
            root.remove(ov)
    cl = root.find(f"{Q}commandline")
    if cl is None:
        cl = etree.SubElement(root, f"{Q}commandline", nsmap={"qemu": QEMU_NS})
    for arg in args:
        etree.SubElement(cl, f"{Q}arg", value=arg)
    return etree.tostring(root), len(args) // 4


def strip_mmio_settings(domain_xml: bytes) -> bytes:
    """The same domain without what the mmio option wrote (for the "loses BARs" control)."""
    root = etree.fromstring(domain_xml)
    for el in root.findall("cpu/maxphysaddr") + root.findall("cpu/feature[@name='pdpe1gb']"):
        el.getparent().remove(el)
    for p in root.iter(f"{Q}property"):
        if p.get("name") == "pref64-reserve":
            p.getparent().remove(p)
    return etree.tostring(root)


@dataclass
class BarCount:
    expected: int  # stand-in BARs (the ivshmem memdev BAR2 of every stand-in function)
    assigned: int
    sizes: dict[int, tuple[int, int]] = field(default_factory=dict)  # size -> (assigned, expected)
    physbits: str = ""
    dmesg: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        per = ", ".join(f"{_fmt(s)}: {a}/{e}" for s, (a, e) in sorted(self.sizes.items(), reverse=True))
        return f"{self.assigned}/{self.expected} BARs assigned ({per}; guest CPU {self.physbits})"


def _fmt(n: int) -> str:
    return f"{n // GiB} GiB" if n >= GiB else f"{n // MiB} MiB"


def count_bars(serial_text: str, want_sizes: list[int]) -> BarCount:
    """Count the stand-ins' BAR2 assigned in the guest. ``want_sizes`` are the memdev sizes of
    every stand-in function: a BAR the kernel gave up on may read as all zeros, so the expected
    set comes from the domain, not from the guest."""
    res: dict[str, dict[int, Bar]] = {}
    ids: dict[str, tuple[str, str]] = {}
    physbits, dmesg = "", []
    for raw in serial_text.replace("\r", "").split("\n"):
        i = raw.find("@@")
        if i < 0:
            continue
        tag, _, rest = raw[i:].partition(" ")
        if tag == "@@RES":
            bdf, n, s, e, f = rest.split()
            res.setdefault(bdf, {})[int(n)] = Bar(int(n), int(s, 16), int(e, 16), int(f, 16))
        elif tag == "@@ATTR":
            bdf, name, *value = rest.split(" ", 2)
            if name in ("vendor", "device"):
                v = ids.get(bdf, ("", ""))
                ids[bdf] = (value[0], v[1]) if name == "vendor" else (v[0], value[0])
        elif tag == "@@INFO" and rest.startswith("physbits "):
            physbits = rest.split(" ", 1)[1]
        elif tag == "@@DMESG":
            dmesg.append(rest)
    got: dict[int, int] = {}
    for bdf, (v, d) in ids.items():
        if (v, d) != IVSHMEM:
            continue
        b = res.get(bdf, {}).get(2)
        if b is not None and b.size and b.start:
            got[b.size] = got.get(b.size, 0) + 1
    sizes = {}
    for s in sorted(set(want_sizes)):
        sizes[s] = (min(got.get(s, 0), want_sizes.count(s)), want_sizes.count(s))
    return BarCount(len(want_sizes), sum(a for a, _ in sizes.values()), sizes, physbits, dmesg)


def serial_text(path: Path) -> str:
    return path.read_text(errors="replace")
