"""The host CPU's physical-address width and where it came from (the MMIO check).

The width is the ``address sizes : NN bits physical`` line the kernel prints in /proc/cpuinfo
(Linux ``arch/x86/kernel/cpu/proc.c``, ``show_cpuinfo``). It belongs to the host the sysfs tree
describes, so it is read from the same source:

- a capture that recorded it (``pcitopo capture`` stores the line as the member
  :data:`ADDRESS_SIZES_MEMBER`): the recorded line, whatever machine replays the capture;
- a capture file that did not record it (of a directory without ``--phys-bits``, or taken by an
  older pcitopo): unknown (``xmlfix --check`` says so) rather than the replaying machine's width;
- a live ``/sys``, a sysfs-shaped directory or a fixture directory: this machine's /proc/cpuinfo
  (or ``$PCITOPO_CPUINFO``), read once per path.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

from pcitopo import SLOTS

CPUINFO_ENV = "PCITOPO_CPUINFO"
PROC_CPUINFO = "/proc/cpuinfo"
CPUINFO_MAX_BYTES = 64 * 1024  # the first processor's block, where "address sizes" is, is < 4 KiB
# The capture member holding the recorded line (not a sysfs path: sysfs has no such directory).
ADDRESS_SIZES_MEMBER = "pcitopo/cpuinfo-address-sizes"
ADDRESS_SIZES = "address sizes"


@dataclass(frozen=True, **SLOTS)
class HostWidth:
    """The host CPU's physical-address width (None: unknown) and where it came from."""

    bits: int | None
    origin: str
    line: str | None = None  # the ``address sizes`` line as read (what a capture records)


def parse_address_sizes(text: str) -> tuple[int | None, str | None]:
    """(bits, the line) from cpuinfo text; (None, None) without a well-formed line."""
    for line in text.splitlines():
        if line.startswith(ADDRESS_SIZES):
            words = line.split(":", 1)[-1].split()
            if len(words) >= 3 and words[1] == "bits" and words[0].isdigit():
                return int(words[0]), line.strip()
    return None, None


def local_cpuinfo_path() -> str:
    return os.environ.get(CPUINFO_ENV) or PROC_CPUINFO


def local_width(path: str | None = None) -> HostWidth:
    """This machine's width: ``path``, else ``$PCITOPO_CPUINFO``, else /proc/cpuinfo."""
    path = path or local_cpuinfo_path()
    bits, line = _read_local(path)
    where = f"${CPUINFO_ENV}={path}" if path != PROC_CPUINFO and path == os.environ.get(CPUINFO_ENV) else path
    return HostWidth(bits, f"{where} on this machine" if bits else f"{where} unreadable or without '{ADDRESS_SIZES}'", line)


@functools.lru_cache(maxsize=4)
def _read_local(path: str) -> tuple[int | None, str | None]:
    """Read once per path (the CPU does not change), at most 64 KiB, never through a symlink."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None, None
    try:
        data = os.read(fd, CPUINFO_MAX_BYTES)
    except OSError:
        return None, None
    finally:
        os.close(fd)
    return parse_address_sizes(data.decode("utf-8", "replace"))


def recorded_width(data: bytes, name: str) -> HostWidth:
    """The width a capture recorded (the member's bytes)."""
    bits, line = parse_address_sizes(data.decode("utf-8", "replace"))
    if bits is None:
        return HostWidth(None, f"{name}: {ADDRESS_SIZES_MEMBER} holds no well-formed '{ADDRESS_SIZES}' line")
    return HostWidth(bits, f"recorded in {name} ({ADDRESS_SIZES_MEMBER})", line)
