"""PCI BARs as sysfs shows them: one ``resource`` file per function.

The kernel's ``resource`` attribute (``drivers/pci/pci-sysfs.c``, ``resource_show``) prints one
line per resource of the function, ``0x%016llx 0x%016llx 0x%016llx`` = start, end, flags:
lines 0-5 are the BARs, 6 the expansion ROM, then (bridges) the windows and (SR-IOV PFs) the VF
BARs. An unused resource is all zeros; a BAR the kernel could not place has start 0 and a
non-zero end (its size is kept: ``0x0 0x<size-1>``). The flag bits are the kernel's
``IORESOURCE_*`` (``include/linux/ioport.h``).

This module is the one place that knows the format: the reader (``pcitopo.host.sysfs``) loads it
lazily into :attr:`pcitopo.model.tree.PciFunction.bars` (the MMIO budget, ``src/pcitopo/guest/mmio.py``), and
``pcitopo doctor``'s ``bar`` check reads it for unassigned BARs; the synthesiser writes it with
:func:`format_resource`.
"""

from __future__ import annotations

from dataclasses import dataclass

from pcitopo import SLOTS
from pcitopo.errors import SysfsError

KiB, MiB, GiB, TiB = 1 << 10, 1 << 20, 1 << 30, 1 << 40

IORESOURCE_MEM = 0x200
IORESOURCE_PREFETCH = 0x2000
IORESOURCE_MEM_64 = 0x100000

# Lines of `resource` that are the function's own BARs (6 .. : ROM, bridge windows, VF BARs).
STANDARD_BARS = 6
# A real `resource` file has at most 17 lines (6 BARs, ROM, 6 IOV BARs, 4 bridge windows).
MAX_RESOURCE_LINES = 64


@dataclass(frozen=True, **SLOTS)
class Bar:
    """One line of a ``resource`` file (``index`` is the line number, 0-based)."""

    index: int
    start: int
    end: int
    flags: int

    @property
    def size(self) -> int:
        return self.end - self.start + 1 if self.end > 0 else 0

    @property
    def is_mem(self) -> bool:
        return bool(self.flags & IORESOURCE_MEM)

    @property
    def is_64bit(self) -> bool:
        return bool(self.flags & IORESOURCE_MEM_64)

    @property
    def prefetchable(self) -> bool:
        return bool(self.flags & IORESOURCE_PREFETCH)

    @property
    def assigned(self) -> bool:
        """The kernel placed it (or there is nothing to place)."""
        return self.start != 0 or self.size == 0

    @property
    def is_mem64_pref(self) -> bool:
        """What lands in a bridge's 64-bit prefetchable window."""
        return self.is_mem and self.is_64bit and self.prefetchable


def parse_resource(text: str) -> tuple[Bar, ...]:
    """Parse a ``resource`` file. Raises SysfsError naming the bad line: anything that is not
    three hex numbers per line, a negative value, or an end below its start."""
    bars: list[Bar] = []
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if len(lines) > MAX_RESOURCE_LINES:
        raise SysfsError(f"resource file has {len(lines)} lines, more than a PCI function has")
    for i, line in enumerate(lines):
        parts = line.split()
        if len(parts) != 3 or not all(p.lstrip("+-")[:2].lower() == "0x" for p in parts):
            raise SysfsError(f"resource line {i}: {line[:80]!r} is not 'start end flags' in hex")
        try:
            start, end, flags = (int(p, 16) for p in parts)
        except ValueError:
            raise SysfsError(f"resource line {i}: {line[:80]!r} is not 'start end flags' in hex") from None
        if min(start, end, flags) < 0:
            raise SysfsError(f"resource line {i}: {line[:80]!r} holds a negative value")
        if end and end < start:
            raise SysfsError(f"resource line {i}: end 0x{end:x} is below start 0x{start:x}")
        bars.append(Bar(i, start, end, flags))
    return tuple(bars)


def format_resource(bars: tuple[Bar, ...] | list[Bar]) -> str:
    """The file as the kernel prints it (the synthesiser writes this)."""
    return "".join(f"0x{b.start:016x} 0x{b.end:016x} 0x{b.flags:016x}\n" for b in bars)


def device_bars(bars: tuple[Bar, ...] | None) -> tuple[Bar, ...]:
    """The function's own memory BARs (lines 0-5), without ROM, windows or VF BARs."""
    return tuple(b for b in (bars or ()) if b.index < STANDARD_BARS and b.is_mem and b.size)


# -- sizes ------------------------------------------------------------------------------------------

def pow2ceil(n: int) -> int:
    return 1 << (n - 1).bit_length() if n > 1 else n


def bits_for(end: int) -> int:
    """Smallest width whose address space holds ``[0, end)``."""
    return max(1, (end - 1).bit_length())


def fmt_size(n: int) -> str:
    """Bytes in the largest binary unit that fits: exact as an integer, else two decimals."""
    for unit, size in (("TiB", TiB), ("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n >= size:
            return f"{n // size} {unit}" if n % size == 0 else f"{n / size:.2f} {unit}"
    return f"{n} B"


__all__ = [
    "Bar", "GiB", "IORESOURCE_MEM", "IORESOURCE_MEM_64", "IORESOURCE_PREFETCH", "KiB", "MiB", "TiB",
    "bits_for", "device_bars", "fmt_size", "format_resource", "parse_resource", "pow2ceil",
]
