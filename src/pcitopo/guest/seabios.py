"""SeaBIOS 1.16.3's placement of 64-bit prefetchable BARs and bridge windows, step for step as its
``src/fw/pciinit.c`` does it, for a guest PCI tree (the firmware model the MMIO rule asks).

What 1.16.3 does (docs/SOURCES.md, "SeaBIOS 1.16.3's 64-bit placement"):

- It trusts the CPU's physical-address width when it is 41 bits or more, exactly 40 on an AMD
  CPU model or 36/39 on an Intel one (``fw/paravirt.c``, ``physbits``); the 64-bit space then
  ends at ``2^min(bits, 46)`` ("top"). Without a trusted width the windows go right above RAM,
  as in 1.16.2.
- With a trusted width, long mode and RAM above 4 GiB it pads: every bridge with a slot (PCIe
  root and downstream ports; QEMU gives each one) whose prefetchable window is 64-bit is aligned
  to ``top / 2048`` instead of to its largest member, and is at least that big. A QEMU
  ``pref64-reserve`` hint raises a root port's window (rounded up to that alignment), never its
  alignment.
- Every bridge lists its members (BARs, child windows) by alignment, then size, descending, and
  lays them out back to back from its window's start; all root buses (expander buses too) share
  one top-level list.
- The top-level list starts at ``top`` minus its sum rounded up to 1 GiB and, when padding, to
  ``top / 8``; never below the end of RAM. That start is aligned to the first member's alignment
  and to 1 GiB.

So a BAR above ``top / 2048`` (32 GiB at 46 bits) lands on a multiple of its size only if every
window it sits first in starts on one; the second of two such BARs below one switch never does
(its port starts ``size + top / 2048`` past the first). Linux drops a BAR that is not on a
multiple of its size or not inside its bridge's window, and every window above the CPU's width.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pcitopo.model.bars import GiB, KiB, MiB

VERSION = "1.16.3"
MAX_TOP_BITS = 46  # wider CPUs still get a 64 TiB space (old guests' virtio-pci)
PAD_SHIFT = 11  # padded slot bridges align to top >> 11
SHARE_SHIFT = 3  # the padded top-level list is rounded up to top >> 3
BRIDGE_MEM_MIN = 2 * MiB  # PCI_BRIDGE_MEM_MIN
DEVICE_MEM_MIN = 4 * KiB  # PCI_DEVICE_MEM_MIN
Q35_SPLIT = 0xB0000000  # QEMU q35: RAM of 2.75 GiB or more keeps only 2 GiB below 4 GiB
Q35_LOW = 2 * GiB


def align_up(n: int, a: int) -> int:
    return -(-n // a) * a


@dataclass
class Bar:
    """A 64-bit prefetchable BAR, labelled for the caller."""

    label: str
    size: int


@dataclass
class Bridge:
    """A guest bridge. ``slot``: a PCIe root or downstream port (SeaBIOS's hot-plug test);
    ``reserve``: its ``pref64-reserve`` hint (root ports only)."""

    label: str
    slot: bool
    members: list[Bar | Bridge] = field(default_factory=list)
    reserve: int = 0


@dataclass(frozen=True)
class Width:
    """The guest CPU's physical-address width; ``vendor`` its CPUID signature if known."""

    bits: int
    vendor: str = ""

    @property
    def trusted(self) -> bool:
        if self.bits >= 41:
            return True
        return (self.vendor, self.bits) in {("AuthenticAMD", 40), ("GenuineIntel", 36), ("GenuineIntel", 39)}


@dataclass
class _Entry:
    node: Bar | Bridge
    size: int
    align: int
    members: list[_Entry] = field(default_factory=list)


@dataclass
class Placement:
    """The model's answer: where each BAR and window went (label → (start, size)) and which
    BARs Linux will not use (label → why)."""

    padded: bool
    top: int  # 0: the width is not trusted
    slot_align: int  # the padded alignment, 0 when not padding
    start: int
    end: int
    bars: dict[str, tuple[int, int]] = field(default_factory=dict)
    windows: dict[str, tuple[int, int]] = field(default_factory=dict)
    lost: dict[str, str] = field(default_factory=dict)

    @property
    def assigned(self) -> int:
        return len(self.bars) - len(self.lost)


def ram_above_4g(ram: int) -> int:
    """What QEMU's q35 machine maps above 4 GiB of ``ram`` bytes of guest RAM."""
    return max(0, ram - (Q35_LOW if ram >= Q35_SPLIT else ram))


def window_entry(node: Bar | Bridge, padded: bool, top: int) -> _Entry:
    """``pci_bios_check_devices``: a BAR or a bridge window with its size and alignment."""
    if isinstance(node, Bar):
        size = max(node.size, DEVICE_MEM_MIN)
        return _Entry(node, size, size)
    members = _sorted([window_entry(m, padded, top) for m in node.members])
    align = max(BRIDGE_MEM_MIN, members[0].align if members else 0)
    total = sum(e.size for e in members)
    if node.slot and padded:
        align = top >> PAD_SHIFT
    if node.slot and align > total:
        total = align  # room for hot-plug
    size = align_up(node.reserve, align) if node.reserve > total else align_up(total, align)
    return _Entry(node, size, align, members)


def _sorted(entries: list[_Entry]) -> list[_Entry]:
    # pci_region_create_entry keeps each list by (alignment, size) descending, ties in order
    return sorted(entries, key=lambda e: (-e.align, -e.size))


def place(tops: list[Bar | Bridge], ram: int, width: Width, reserved_end: int = 0) -> Placement:
    """``pci_setup``'s 64-bit pass over the top-level members ``tops`` (root ports, endpoints on
    root buses). ``reserved_end``: QEMU's ``etc/reserved-memory-end`` (memory hot-plug)."""
    top = 1 << min(width.bits, MAX_TOP_BITS) if width.trusted else 0
    over = ram_above_4g(ram)
    padded = bool(top) and over > 0
    entries = _sorted([window_entry(n, padded, top) for n in tops])
    total = sum(e.size for e in entries)
    start = max(reserved_end, 4 * GiB + over)
    if top:
        size = align_up(total, GiB)
        if padded:
            size = align_up(size, top >> SHARE_SHIFT)
        # when the list outgrows the space, SeaBIOS's unsigned "top - size" wraps past 2^64 and
        # scatters the windows; the model keeps the end of RAM there, erring towards more BARs
        # placed without settings than with (the side the rule must not get wrong)
        if size <= top and start < top - size:
            start = top - size
    start = align_up(align_up(start, entries[0].align if entries else 1), GiB)
    p = Placement(padded, top, top >> PAD_SHIFT if padded else 0, start, start + total)
    _lay(entries, start, 1 << 64, p, 1 << width.bits, None)
    return p


def _lay(entries: list[_Entry], at: int, end: int, p: Placement, limit: int, lost: str | None) -> None:
    """``pci_region_map_entries``: back to back from ``at``; note what Linux will refuse."""
    for e in entries:
        start, at = at, at + e.size
        if isinstance(e.node, Bridge):
            p.windows[e.node.label] = (start, e.size)
            inner = lost or (f"below {e.node.label}, whose window ends above the CPU's width"
                             if start + e.size > limit else None)
            _lay(e.members, start, start + e.size, p, limit, inner)
            continue
        p.bars[e.node.label] = (start, e.node.size)
        why = lost
        if why is None and start % e.node.size:
            why = f"at {start:#x}, not a multiple of its size"
        elif why is None and start + e.node.size > min(end, limit):
            why = "outside its bridge window" if start + e.node.size > end else "above the CPU's width"
        if why:
            p.lost[e.node.label] = why
