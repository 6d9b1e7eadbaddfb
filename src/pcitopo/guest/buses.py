"""Bus, slot, index and chassis accounting: every number the planner budgets with, once.

Each constant says where it comes from (docs/SOURCES.md, "Bus and slot accounting", has the
public sources). The planner (:mod:`pcitopo.guest.plan`) decides *what* the guest tree looks like;
this module decides how many buses, slots, indexes and chassis numbers that costs and hands
them out, within the limits of a PCI address (:mod:`pcitopo.model.address`). It knows nothing
about the domain XML or the host model.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from pcitopo.errors import PlanError
from pcitopo.model.address import BUS_COUNT, MAX_CONTROLLER_INDEX, MAX_FUNCTIONS_PER_SLOT, MAX_SLOT, SLOTS_PER_BUS

T = TypeVar("T")

# -- pcie-root (QEMU docs/pcie.txt; libvirt formatdomain "Controllers") -------------------------

# pcie-root slots we never take: 0 is the host bridge, 1 the primary VGA libvirt puts there,
# 0x1f the ICH9 LPC/SATA/SMBus functions of q35.
RESERVED_ROOT_SLOTS = frozenset({0x00, 0x01, MAX_SLOT})
# Where expander buses go on pcie-root: from 0x10 up first (away from the low slots libvirt
# fills with its own devices), then 0x02-0x0f.
PXB_SLOT_ORDER = tuple(range(0x10, MAX_SLOT)) + tuple(range(0x02, 0x10))
# A pcie-to-pci-bridge takes conventional PCI devices in slots 1-31 (libvirt places them
# there for models q35 offers only as conventional PCI).
PCI_BRIDGE_SLOTS = SLOTS_PER_BUS - 1
# Such a bridge costs two buses below pcie-root: the root port it sits in, and its own.
BUSES_PER_PCI_BRIDGE = 2
# pcie-root's own bus.
PCIE_ROOT_OWN_BUS = 1

# -- KubeVirt (pkg/virt-launcher/virtwrap/manager.go, allocateHotplugPorts) --------------------

# After the hooks KubeVirt appends bare pcie-root-ports for hotplug while the highest PCI
# controller index is below this (kubevirt/kubevirt#14754); each takes a bus below pcie-root.
KUBEVIRT_HOTPLUG_INDEX_LIMIT = 32
# How many free ports it wants (calculateHotplugPortCountV2): max(total - PCI devices, least),
# with (total, least) = (16, 6) above 2 GiB of memory, else (8, 3).
KUBEVIRT_LARGE_MEMORY = 2 * 1024**3
KUBEVIRT_PORTS_LARGE, KUBEVIRT_LEAST_FREE_LARGE = 16, 6
KUBEVIRT_PORTS_SMALL, KUBEVIRT_LEAST_FREE_SMALL = 8, 3
# libvirt adds one spare root port of its own when the first define names no PCI controller
# (libvirt's "PCI topology and hotplug"; measured, docs/SOURCES.md); pcitopo's domain names them.
LIBVIRT_SPARE_PORTS = 1

# -- chassis (QEMU pcie-root-port / xio3130-downstream 'chassis' property, 8 bits) ------------

MAX_CHASSIS = 255


def root_port_number(slot: int) -> int:
    """A root port's ``port`` attribute as libvirt numbers it: slot * 8 + function (0)."""
    return slot * MAX_FUNCTIONS_PER_SLOT


def slot_chunks(items: Sequence[T]) -> list[list[T]]:
    """Functions split into slots of at most 8; one empty chunk for none (a port still exists)."""
    step = MAX_FUNCTIONS_PER_SLOT
    return [list(items[i : i + step]) for i in range(0, len(items), step)] or [[]]


def port_buses(chunks: int, on_pxb: bool, switch_buses: int | None) -> int:
    """Buses (= controllers) one mirrored host port costs in the guest.

    ``chunks``: guest slots its functions need (:func:`slot_chunks`); ``on_pxb``: it becomes a
    root port on an expander bus; ``switch_buses``: what the switch below it costs (None: none).
    A port with a switch: the port, the upstream port, and the switch's downstream ports. A root
    port with more than 8 functions gets a switch of its own: port, upstream port, one downstream
    port per chunk. Otherwise one port per chunk (downstream ports side by side)."""
    if switch_buses is not None:
        return 1 + 1 + switch_buses
    if on_pxb and chunks > 1:
        return 1 + 1 + chunks
    return chunks


def allocate_indexes(kept: set[int], count: int) -> list[int]:
    """The lowest ``count`` indexes not kept, ascending: fills gaps so none remain."""
    out, i = [], 1
    while len(out) < count:
        if i not in kept:
            out.append(i)
        i += 1
    return out


def pcie_root_buses_for(unplaced_pcie: int, unplaced_conventional: int) -> int:
    """Buses below pcie-root that libvirt's own placements will take after our call: a root
    port per PCIe device, a root port plus a pcie-to-pci-bridge per 31 conventional ones."""
    bridges = -(-unplaced_conventional // PCI_BRIDGE_SLOTS)
    return unplaced_pcie + BUSES_PER_PCI_BRIDGE * bridges


def hotplug_reserve(highest_index: int) -> int:
    """Root ports KubeVirt will still append for hotplug after our call (indexes up to 31)."""
    return max(0, KUBEVIRT_HOTPLUG_INDEX_LIMIT - 1 - highest_index)


def root_port_devices(unplaced_pcie: int, unplaced_conventional: int) -> int:
    """Root ports on pcie-root that libvirt's own placements fill: one per unplaced PCIe
    device, one per pcie-to-pci-bridge it adds for conventional ones."""
    return unplaced_pcie + -(-unplaced_conventional // PCI_BRIDGE_SLOTS)


def root_ports_added(unplaced_pcie: int, unplaced_conventional: int, highest_index: int, free_ports: int = 0) -> int:
    """Root ports that appear after our call: those libvirt adds for its placements once the
    ``free_ports`` empty ones are filled (libvirt fills empty root ports first), and KubeVirt's
    hotplug ports."""
    return max(0, root_port_devices(unplaced_pcie, unplaced_conventional) - free_ports) + hotplug_reserve(highest_index)


def hotplug_wanted(pci_devices: int, memory: int) -> int:
    """The free hotplug root ports a VM gets without pcitopo at most: KubeVirt's
    ``calculateHotplugPortCountV2`` for ``pci_devices`` (its ``CountPCIDevices``) and ``memory``
    bytes, plus libvirt's own spare."""
    total, least = ((KUBEVIRT_PORTS_LARGE, KUBEVIRT_LEAST_FREE_LARGE) if memory > KUBEVIRT_LARGE_MEMORY
                    else (KUBEVIRT_PORTS_SMALL, KUBEVIRT_LEAST_FREE_SMALL))
    return max(total - pci_devices, least) + LIBVIRT_SPARE_PORTS


def budget_buses(pxb_sizes: list[int], pcie_root_needed: int) -> list[int]:
    """busNr per expander bus (in order), packed at the top of the 256 buses so pcie-root keeps
    everything below the lowest one. Each pxb reserves its root bus plus one bus per bridge."""
    total = sum(pxb_sizes)
    lowest = BUS_COUNT - total
    if lowest < pcie_root_needed or (pxb_sizes and lowest < 1):
        raise PlanError(
            f"out of PCI buses: the mirrored hierarchy needs {total} and pcie-root needs {pcie_root_needed}, "
            f"but a PCI domain has {BUS_COUNT}"
        )
    out, nr = [], lowest
    for size in pxb_sizes:
        out.append(nr)
        nr += size
    return out


@dataclass(frozen=True)
class BusBudget:
    """Indexes and bus numbers for one plan."""

    indexes: tuple[int, ...]  # our controllers' indexes, handed out in emission order
    spares: tuple[int, ...]  # our bare root ports on pcie-root: held, index gaps, hotplug
    bus_nrs: tuple[int, ...]  # busNr per expander bus, in order
    pcie_root_buses: int  # buses kept free below the lowest busNr
    free_ports: int = 0  # spares written empty (the held ones are not)


def budget(pxb_sizes: list[int], kept_indexes: set[int], kept_bridges: int, unplaced_pcie: int,
           unplaced_conventional: int, held: frozenset[int] = frozenset(), free_wanted: int = 0) -> BusBudget:
    """The whole bus budget: one index per bus we create; bare root ports on pcie-root, ours:
    the ``held`` ones (devices sit in them, so their indexes stay), the index gaps libvirt would
    otherwise fill, and up to ``free_wanted`` empty ones in all, gaps first (fewer when the
    buses or indexes run out); below the lowest busNr, room for pcie-root, the controllers kept
    on it, our bare ports, libvirt's placements and KubeVirt's hotplug ports."""
    taken = set(kept_indexes) | set(held) | {0}
    indexes = allocate_indexes(taken, sum(pxb_sizes))
    taken |= set(indexes)
    gaps = len(set(range(1, max(taken) + 1)) - taken)
    fixed = PCIE_ROOT_OWN_BUS + kept_bridges + len(held) + pcie_root_buses_for(unplaced_pcie, unplaced_conventional)
    free = allocate_indexes(taken, max(gaps, free_wanted))

    def needed() -> int:
        return fixed + len(free) + hotplug_reserve(max([*taken, *free]))

    while len(free) > gaps and (needed() > BUS_COUNT - sum(pxb_sizes) or free[-1] > MAX_CONTROLLER_INDEX):
        free.pop()
    need = needed()
    return BusBudget(tuple(indexes), tuple(sorted(set(held) | set(free))), tuple(budget_buses(pxb_sizes, need)),
                     need, len(free))


def fill_slots(keys: Iterable[T], emit: Callable[[T, int], int], overflow: str) -> None:
    """Emit children side by side on one bus: ``emit(key, first_slot)`` returns the slots it
    used. More than a bus has is a :class:`PlanError` saying ``overflow``."""
    slot = 0
    for key in keys:
        slot += emit(key, slot)
        if slot > SLOTS_PER_BUS:
            raise PlanError(overflow)


class RootSlots:
    """pcie-root slots for expander buses: sticky (same alias, same slot as the last call),
    else the first free one in :data:`PXB_SLOT_ORDER`."""

    def __init__(self, used: set[int], previous: dict[str | None, int]):
        self.used = set(used)
        self.previous = dict(previous)

    def take(self, alias: str) -> int:
        slot = self.previous.get(alias)
        if slot is None or slot in self.used:
            free = [s for s in PXB_SLOT_ORDER if s not in self.used and s not in RESERVED_ROOT_SLOTS]
            if not free:
                raise PlanError("no free slot on pcie-root for another expander bus")
            slot = free[0]
        self.used.add(slot)
        return slot


class ChassisPool:
    """Chassis numbers of root and downstream ports, unique across both (QEMU refuses to start
    on a clash). Kept ports hold theirs (libvirt's default chassis is the controller index)."""

    def __init__(self, reserved: Iterable[int]):
        self.used = set(reserved)

    def take(self, index: int) -> int:
        # chassis = index, as libvirt defaults it; on a clash take a free number from the top,
        # away from the low indexes libvirt will give root ports it adds after us.
        c = index
        if c in self.used:
            c = next(x for x in range(MAX_CHASSIS, 0, -1) if x not in self.used)
        self.used.add(c)
        return c
