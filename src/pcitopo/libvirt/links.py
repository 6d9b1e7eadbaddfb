"""Root ports that carry the host's link: QEMU's ``x-speed`` and ``x-width`` on each
``pcie-root-port`` we create, set to the host link that port stands for.

QEMU's ``pcie-root-port`` reports 16 GT/s x32 unless told otherwise; its properties ``x-speed``
(``2_5 5 8 16``, and ``32 64`` since QEMU 9.0) and ``x-width`` (``1 2 4 8 12 16 32``, QAPI's
``PCIELinkWidth``) are enums, so libvirt must pass them as strings (a number is refused). The
emulated switch ports have no such properties in any QEMU: the upstream port always reports
2.5 GT/s x1 and the downstream port an unknown speed; NCCL's topology file covers those
(topology/ncclfile.py).

The link a root port stands for: with a host switch below it, the link between the host's root
port and that switch's upstream port, as NCCL reads it (the lower of the two ends); with an
endpoint below it, the host root port's own. A speed or width QEMU has no value for is left at
QEMU's default.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from functools import lru_cache

from lxml import etree

from pcitopo.libvirt.domain import OUR_ALIAS_PREFIX
from pcitopo.libvirt.overrides import Property, set_properties
from pcitopo.nccl import topoxml as ncclxml

X_SPEED = "x-speed"
X_WIDTH = "x-width"
QEMU_SPEEDS = {2.5: "2_5", 5.0: "5", 8.0: "8", 16.0: "16", 32.0: "32", 64.0: "64"}
QEMU_WIDTHS = ("1", "2", "4", "8", "12", "16", "32")
# The oldest QEMU that accepts each x-speed value (32 and 64 GT/s came with 9.0).
QEMU_SINCE = {"32": "9.0", "64": "9.0"}


@lru_cache(maxsize=64)
def link_properties(speed: str | None, width: str | None) -> tuple[Property, ...]:
    """The ``x-speed``/``x-width`` properties for a host link (sysfs spellings), those QEMU has.
    A host has a handful of link spellings and the hook asks twice per root port per call:
    each answered once."""
    out = []
    gt = ncclxml.gt_s(speed or "")
    if gt is not None and gt in QEMU_SPEEDS:
        out.append(Property(X_SPEED, "string", QEMU_SPEEDS[gt]))
    w = str(ncclxml.strtol(width or ""))
    if w in QEMU_WIDTHS:
        out.append(Property(X_WIDTH, "string", w))
    return tuple(out)


def owned(alias: str, name: str) -> bool:
    return name in (X_SPEED, X_WIDTH) and alias.startswith(OUR_ALIAS_PREFIX)


def apply_links(root: etree._Element, wanted: Mapping[str, tuple[str | None, str | None]]) -> int:
    """Set (or, with nothing wanted, remove) the link properties of our root ports, by alias.
    Idempotent: what an earlier call wrote is replaced. Returns how many ports got one."""
    props = {alias: link_properties(*link) for alias, link in wanted.items()}
    props = {a: p for a, p in props.items() if p}
    set_properties(root, owned, props)
    return len(props)


def oldest_qemu(links: Iterable[tuple[str | None, str | None]]) -> tuple[str, str] | None:
    """(x-speed value, QEMU version) of the newest speed among ``links`` that an older QEMU
    refuses, or None when any QEMU takes them all."""
    speeds = {p.value for link in links for p in link_properties(*link) if p.name == X_SPEED and p.value in QEMU_SINCE}
    if not speeds:
        return None
    top = max(speeds, key=lambda v: float(v.replace("_", ".")))
    return top, QEMU_SINCE[top]
