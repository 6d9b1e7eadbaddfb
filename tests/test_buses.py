"""Bus, slot, index and chassis accounting (src/pcitopo/guest/buses.py), one rule at a time."""

from __future__ import annotations

import pytest

from pcitopo.errors import PlanError
from pcitopo.guest import buses
from pcitopo.model.address import address_in_range


def test_address_limits():
    assert address_in_range(0xFFFF, 0xFF, 0x1F, 7)
    for bad in [(0x10000, 0, 0, 0), (0, 0x100, 0, 0), (0, 0, 0x20, 0), (0, 0, 0, 8), (-1, 0, 0, 0)]:
        assert not address_in_range(*bad), bad


def test_conventional_pci_devices_cost_two_buses_per_31():
    assert buses.pcie_root_buses_for(0, 0) == 0
    assert buses.pcie_root_buses_for(3, 0) == 3
    assert buses.pcie_root_buses_for(0, 1) == 2
    assert buses.pcie_root_buses_for(0, 31) == 2
    assert buses.pcie_root_buses_for(2, 32) == 2 + 4


def test_hotplug_reserve_counts_up_to_index_31():
    assert buses.hotplug_reserve(0) == 31
    assert buses.hotplug_reserve(20) == 11
    assert buses.hotplug_reserve(31) == 0
    assert buses.hotplug_reserve(200) == 0


def test_bus_numbers_are_packed_at_the_top():
    assert buses.budget_buses([3, 5], 10) == [248, 251]
    assert buses.budget_buses([], 200) == []
    with pytest.raises(PlanError, match="out of PCI buses: the mirrored hierarchy needs 250 and pcie-root needs 7"):
        buses.budget_buses([250], 7)


def test_budget_fills_index_gaps_with_spares_and_reserves_their_buses():
    b = buses.budget([2], kept_indexes={1, 5}, kept_bridges=2, unplaced_pcie=1, unplaced_conventional=0)
    assert b.indexes == (2, 3)
    assert b.spares == (4,)
    # pcie-root, 2 kept bridges, 1 spare, 1 libvirt placement, hotplug ports for indexes 6..31
    assert b.pcie_root_buses == 1 + 2 + 1 + 1 + 26
    assert b.bus_nrs == (254,)


def test_port_buses():
    assert buses.port_buses(1, on_pxb=True, switch_buses=None) == 1
    assert buses.port_buses(3, on_pxb=False, switch_buses=None) == 3  # downstream ports side by side
    assert buses.port_buses(3, on_pxb=True, switch_buses=None) == 5  # root port + its own switch
    assert buses.port_buses(1, on_pxb=True, switch_buses=4) == 6
    assert [len(c) for c in buses.slot_chunks(list(range(17)))] == [8, 8, 1]
    assert buses.slot_chunks([]) == [[]]


def test_fill_slots_stops_past_32():
    used: list[tuple[str, int]] = []

    def emit(key: str, first: int) -> int:
        used.append((key, first))
        return 2

    buses.fill_slots(["a", "b"], emit, "never")
    assert used == [("a", 0), ("b", 2)]
    with pytest.raises(PlanError, match="too many"):
        buses.fill_slots([str(i) for i in range(17)], emit, "too many")


def test_root_slots_sticky_then_lowest_free_in_order():
    slots = buses.RootSlots(used={0x10, 0x02}, previous={"ua-pcitopo-pxb-a": 0x14, "ua-pcitopo-pxb-b": 0x10})
    assert slots.take("ua-pcitopo-pxb-a") == 0x14  # sticky
    assert slots.take("ua-pcitopo-pxb-b") == 0x11  # its old slot is taken now
    assert slots.take("ua-pcitopo-pxb-c") == 0x12
    full = buses.RootSlots(used=set(buses.PXB_SLOT_ORDER), previous={})
    with pytest.raises(PlanError, match="no free slot on pcie-root"):
        full.take("x")
    assert not set(buses.PXB_SLOT_ORDER) & buses.RESERVED_ROOT_SLOTS


def test_chassis_is_the_index_unless_taken_then_from_the_top():
    pool = buses.ChassisPool([3, 255])
    assert pool.take(4) == 4
    assert pool.take(3) == 254
    assert pool.take(7) == 7


def test_allocate_indexes_fills_gaps():
    assert buses.allocate_indexes({0, 1, 3}, 3) == [2, 4, 5]


def test_hotplug_ports_fill_gaps_first_and_stop_where_the_buses_end():
    # held port 9 keeps its index; the gap 4 comes first, then indexes above the highest
    b = buses.budget([2], kept_indexes={1, 5}, kept_bridges=2, unplaced_pcie=1, unplaced_conventional=0,
                     held=frozenset({9}), free_wanted=5)
    assert b.indexes == (2, 3) and b.free_ports == 5
    assert b.spares == (4, 6, 7, 8, 9, 10)
    # pcie-root, 2 kept bridges, the held port, 1 libvirt placement, 5 free ports, KubeVirt's up to 31
    assert b.pcie_root_buses == 1 + 2 + 1 + 1 + 5 + (31 - 10)
    # 245 buses for the tree leave 11: pcie-root's own and 10 ports (indexes 246-255)
    tight = buses.budget([245], kept_indexes=set(), kept_bridges=0, unplaced_pcie=0, unplaced_conventional=0,
                         free_wanted=20)
    assert tight.free_ports == 10 and tight.pcie_root_buses == 11


def test_hotplug_wanted_follows_calculate_hotplug_port_count_v2():
    assert buses.hotplug_wanted(22, 64 * 2**30) == 6 + 1  # at least 6 above 2 GiB
    assert buses.hotplug_wanted(10, 64 * 2**30) == 16 - 10 + 1
    assert buses.hotplug_wanted(2, 2 * 2**30) == 8 - 2 + 1  # not above 2 GiB: 8 in all, at least 3
    assert buses.hotplug_wanted(7, 2**30) == 3 + 1
