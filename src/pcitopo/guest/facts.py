"""What the planner is given and what it returns: facts read from the domain (hostdevs,
controllers, cells, what libvirt will still place) in, the guest layout (controllers,
placements, removals, the NUMA map) out.

Plain frozen records, so :mod:`pcitopo.guest.plan` stays a pure function of them and the host
model, and :mod:`pcitopo.guest.rewrite` (which reads the facts and writes the layout) shares
one definition with it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pcitopo.libvirt.domain import OUR_ALIAS_PREFIX, GuestAddress, NumaCell
from pcitopo.model.tree import Bdf

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
    # what KubeVirt's hotplug port count starts from: its CountPCIDevices of the domain before
    # the hook calls (pcitopo.libvirt.domain.DomainView.kubevirt_pci_devices), and <memory>
    kubevirt_pci_devices: int = 0
    memory: int = 0


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
    # a root port's host link (max_link_speed, max_link_width as sysfs spells them), if any
    link: tuple[str | None, str | None] | None = None


@dataclass(frozen=True)
class Placement:
    key: int
    source: Bdf
    alias: str | None
    address: GuestAddress
    multifunction: bool


@dataclass(frozen=True)
class HotplugPorts:
    """The bare root ports on pcie-root the plan writes for hotplug (docs/ARCHITECTURE.md,
    "Hotplug capacity"). ``wanted``: free ports the VM would have without pcitopo at most
    (KubeVirt's count plus libvirt's spare); ``kept``: free ones it has once every device
    without an address sits in one; ``lost`` = wanted - kept (out of buses or indexes)."""

    wanted: int
    kept: int
    free: int  # bare root ports written empty (libvirt's placements go into them first)

    @property
    def lost(self) -> int:
        return max(0, self.wanted - self.kept)


@dataclass
class Plan:
    controllers: list[GuestController]
    placements: list[Placement]
    removed: list[int]  # indexes of controllers to delete (ours from earlier calls, taken-over ones)
    numa_map: dict[int, int]  # host NUMA node → guest cell
    numa_source: str
    notes: list[str] = field(default_factory=list)
    added_pcie_root: bool = False
    hotplug: HotplugPorts | None = None

