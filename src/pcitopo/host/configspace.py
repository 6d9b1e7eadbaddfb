"""PCI configuration space as sysfs ``config`` shows it: the header and the extended
capabilities the doctor needs (ACS and ATS).

What a reader gets depends on who reads: root gets the whole space (4096 bytes for a PCIe
function, 256 for conventional PCI); anyone else gets only the 64-byte header (pci-sysfs
``pci_read_config`` caps unprivileged reads). The extended capabilities start at 0x100 and are a
linked list of 32-bit headers: capability id (bits 0-15), version (16-19), next offset
(20-31). Layouts (the kernel's ``include/uapi/linux/pci_regs.h``, PCIe Base Specification):

- ACS, extended capability 0x000D: control register at +6 with SV 0x01, TB 0x02, RR 0x04,
  CR 0x08, UF 0x10, EC 0x20, DT 0x40;
- ATS, extended capability 0x000F: control register at +6, enable bit 15 (0x8000).

Nothing here trusts the bytes: a truncated space, a list that loops, or an offset whose
register lies past the end gives :class:`ConfigUnknown` with the reason, never an exception
of another kind and never an endless walk.
"""

from __future__ import annotations

from dataclasses import dataclass

HEADER_BYTES = 64  # what an unprivileged reader gets
LEGACY_BYTES = 256  # conventional PCI: no extended space
PCIE_BYTES = 4096
EXT_START = 0x100
# The list cannot hold more capabilities than dwords in the extended space.
MAX_EXT_CAPS = (PCIE_BYTES - EXT_START) // 4

EXT_CAP_ACS = 0x000D
EXT_CAP_ATS = 0x000F

ACS_CTRL = 0x06
ACS_SV, ACS_TB, ACS_RR, ACS_CR, ACS_UF, ACS_EC, ACS_DT = 0x01, 0x02, 0x04, 0x08, 0x10, 0x20, 0x40
ACS_BITS = (("SV", ACS_SV), ("TB", ACS_TB), ("RR", ACS_RR), ("CR", ACS_CR), ("UF", ACS_UF),
            ("EC", ACS_EC), ("DT", ACS_DT))
ATS_CTRL = 0x06
ATS_ENABLE = 0x8000

NEEDS_ROOT = "needs root"


class ConfigUnknown(Exception):
    """The config space cannot answer the question; ``why`` says what was wrong with it."""

    def __init__(self, why: str):
        self.why = why
        super().__init__(why)


def acs_flags(ctrl: int) -> str:
    """'SV|RR|CR|UF' for 0x1d; '-' when no bit is set."""
    names = [n for n, bit in ACS_BITS if ctrl & bit]
    return "|".join(names) or "-"


def _u16(data: bytes, off: int) -> int:
    return data[off] | data[off + 1] << 8


def _u32(data: bytes, off: int) -> int:
    return _u16(data, off) | _u16(data, off + 2) << 16


@dataclass(frozen=True, slots=True)
class ConfigSpace:
    """The bytes of one function's ``config`` file."""

    data: bytes

    def _extended(self) -> bool:
        """Whether there is an extended space to walk (False: conventional PCI, 256 bytes).
        Raises ConfigUnknown when the read was cut short."""
        n = len(self.data)
        if n <= HEADER_BYTES:
            raise ConfigUnknown(NEEDS_ROOT if n == HEADER_BYTES else f"config space is {n} bytes (truncated)")
        if self.data[:2] == b"\xff\xff":
            raise ConfigUnknown("config space reads all ones (vendor ffff): the device does not respond")
        if n == LEGACY_BYTES:
            return False
        if n != PCIE_BYTES:
            raise ConfigUnknown(f"config space is {n} bytes (truncated; want {LEGACY_BYTES} or {PCIE_BYTES})")
        return True

    def ext_capabilities(self) -> dict[int, int]:
        """Extended capability id -> offset of its header (the first, if an id repeats).
        Raises ConfigUnknown for a hostile or cut-short list."""
        if not self._extended():
            return {}
        found: dict[int, int] = {}
        seen: set[int] = set()
        off = EXT_START
        while off:
            if off < EXT_START or off + 4 > len(self.data):
                raise ConfigUnknown(f"extended capability pointer 0x{off:x} is outside 0x100..0x{len(self.data) - 4:x}")
            if off in seen or len(seen) >= MAX_EXT_CAPS:
                raise ConfigUnknown(f"extended capability list loops at 0x{off:x}")
            seen.add(off)
            header = _u32(self.data, off)
            if header in (0, 0xFFFFFFFF):
                if off == EXT_START:
                    return {}  # no extended capabilities at all
                raise ConfigUnknown(f"extended capability at 0x{off:x} is empty")
            found.setdefault(header & 0xFFFF, off)
            off = (header >> 20) & 0xFFC
        return found

    def _register16(self, cap_id: int, reg: int) -> int | None:
        """A 16-bit register of a capability, None when the capability is absent."""
        off = self.ext_capabilities().get(cap_id)
        if off is None:
            return None
        if off + reg + 2 > len(self.data):
            raise ConfigUnknown(f"capability 0x{cap_id:04x} at 0x{off:x}: register +{reg} lies past the end")
        return _u16(self.data, off + reg)

    def acs_control(self) -> int | None:
        """The ACS control register, None when the function has no ACS capability."""
        return self._register16(EXT_CAP_ACS, ACS_CTRL)

    def ats_control(self) -> int | None:
        """The ATS control register, None when the function has no ATS capability."""
        return self._register16(EXT_CAP_ATS, ATS_CTRL)
