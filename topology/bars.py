"""PCI BARs as sysfs ``resource`` shows them: one line per resource, ``start end flags`` in hex.

The kernel prints every resource of a function (BARs 0-5, the expansion ROM, bridge windows or
SR-IOV BARs after them) as three ``0x%016llx`` numbers; an unused slot is all zeros. A BAR the
firmware (or the kernel) could not place keeps its size but has start 0: ``0x0 0x<size-1>``.
The flag bits are the kernel's ``IORESOURCE_*`` (include/linux/ioport.h).
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import SysfsError

IORESOURCE_MEM = 0x200
IORESOURCE_PREFETCH = 0x2000
IORESOURCE_MEM_64 = 0x100000


@dataclass(frozen=True)
class Bar:
    """One line of ``resource``: its index (line number from 0), start, end and flags."""

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
        """Placed in the address space (or an unused slot, which needs no placing)."""
        return self.start != 0 or self.size == 0


def parse_resource(text: str) -> tuple[Bar, ...]:
    """Parse a ``resource`` file. Raises SysfsError on anything that is not three hex numbers
    per line, or on an end below its start."""
    bars: list[Bar] = []
    for index, line in enumerate(text.splitlines()):
        fields = line.split()
        if not fields:
            continue
        if len(fields) != 3:
            raise SysfsError(f"resource line {index}: {line[:60]!r} is not 'start end flags'")
        try:
            start, end, flags = (int(f, 16) for f in fields)
        except ValueError:
            raise SysfsError(f"resource line {index}: {line[:60]!r} holds a value that is not hex") from None
        if min(start, end, flags) < 0:
            raise SysfsError(f"resource line {index}: {line[:60]!r} holds a negative value")
        if end and end < start:
            raise SysfsError(f"resource line {index}: end 0x{end:x} is below start 0x{start:x}")
        bars.append(Bar(index, start, end, flags))
    return tuple(bars)
