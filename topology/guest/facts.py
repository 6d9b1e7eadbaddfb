"""What the planner is given and what it returns: facts read from the domain (hostdevs,
controllers, cells, what libvirt will still place) in, the guest layout (controllers,
placements, removals, the NUMA map) out.

Plain frozen records, so :mod:`topology.guest.plan` stays a pure function of them and the host
model, and :mod:`topology.guest.rewrite` (which reads the facts and writes the layout) shares
one definition with it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..libvirt.domain import OUR_ALIAS_PREFIX, GuestAddress, NumaCell
from ..model.tree import Bdf


# -- facts in -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class HostdevFact:
    key: int
    source: Bdf
    alias: str | None
    address: GuestAddress | None


@dataclass(frozen=True)
class ControllerFact:
    index: int
    model: str
    alias: str | None
    address: GuestAddress | None
    bus_nr: int | None
    chassis: int | None

    @property
    def ours(self) -> bool:
        return (self.alias or "").startswith(OUR_ALIAS_PREFIX)


@dataclass(frozen=True)
class DomainFacts:
    hostdevs: tuple[HostdevFact, ...]
    controllers: tuple[ControllerFact, ...]
    # guest addresses of every other addressed element (disks, NICs, videos, ...)
    other_addresses: tuple[GuestAddress, ...]
    # devices libvirt will still have to place on pcie-root: PCIe ones (a root port each) and
    # conventional PCI ones (behind a pcie-to-pci-bridge in a root port, 31 per bridge)
    unplaced_pcie: int
    unplaced_conventional: int
    cells: tuple[NumaCell, ...]
    memnodes: tuple[tuple[int, str], ...]
    vcpupins: tuple[tuple[int, str], ...]
    acpi: bool


# -- layout out ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class GuestController:
    model: str
    index: int
    alias: str
    parent: int
    slot: int  # on the parent's bus; -1: no address (libvirt picks a pcie-root slot)
    bus_nr: int | None = None
    node: int | None = None
    chassis: int | None = None
    port: int | None = None


@dataclass(frozen=True)
class Placement:
    key: int
    source: Bdf
    alias: str | None
    address: GuestAddress
    multifunction: bool


@dataclass
class Plan:
    controllers: list[GuestController]
    placements: list[Placement]
    removed: list[int]  # indexes of controllers to delete (ours from earlier calls, taken-over ones)
    numa_map: dict[int, int]  # host NUMA node → guest cell
    numa_source: str
    notes: list[str] = field(default_factory=list)
    added_pcie_root: bool = False
