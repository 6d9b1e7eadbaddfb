"""SeaBIOS 1.16.3's 64-bit placement model (src/pcitopo/guest/seabios.py) and the MMIO rule written from it
. The boots that check the model against the real firmware are in
tests/e2e/test_mmio_boot.py."""

from __future__ import annotations

import pytest

from pcitopo.guest.seabios import Bar, Bridge, Width, place, ram_above_4g, window_entry
from pcitopo.model.bars import GiB, MiB

RAM = 8 * GiB  # any guest RAM above 4 GiB makes 1.16.3 pad


def _gpu_port(n: int, size: int, reserve: int = 0, nic: bool = True) -> Bridge:
    """A root port with a two-level switch: the GPU (size + 32 MiB) and a dual-function NIC."""
    gpu = Bridge(f"ds{n}-gpu", True, [Bar(f"gpu{n}", size), Bar(f"gpu{n}-small", 32 * MiB)])
    inner = [gpu] + ([Bridge(f"ds{n}-nic", True, [Bar(f"nic{n}a", 32 * MiB), Bar(f"nic{n}b", 32 * MiB)])] if nic else [])
    us2 = Bridge(f"us{n}b", False, inner)
    us1 = Bridge(f"us{n}a", False, [Bridge(f"ds{n}-top", True, [us2])])
    return Bridge(f"rp{n}", True, [us1], reserve)


def test_q35_ram_split():
    assert ram_above_4g(2 * GiB) == 0 and ram_above_4g(0xB0000000 - 1) == 0
    assert ram_above_4g(3 * GiB) == 1 * GiB and ram_above_4g(8 * GiB) == 6 * GiB


@pytest.mark.parametrize("bits,vendor,trusted", [(41, "", True), (46, "GenuineIntel", True),
                                                 (40, "AuthenticAMD", True), (40, "GenuineIntel", False),
                                                 (39, "GenuineIntel", True), (38, "AuthenticAMD", False),
                                                 (40, "", False)])
def test_which_widths_seabios_believes(bits, vendor, trusted):
    assert Width(bits, vendor).trusted is trusted


def test_padding_overrides_a_port_alignment_and_reserves_never_raise_it():
    port = Bridge("rp", True, [Bar("gpu", 128 * GiB), Bar("small", 32 * MiB)])
    top = 1 << 46
    e = window_entry(port, True, top)
    assert (e.size, e.align) == (160 * GiB, 32 * GiB)  # aligned to top/2048, not to 128 GiB
    port.reserve = 256 * GiB
    e = window_entry(port, True, top)
    assert (e.size, e.align) == (256 * GiB, 32 * GiB)
    assert window_entry(Bridge("empty", True), True, top).size == 32 * GiB  # room for hot-plug
    unpadded = window_entry(Bridge("rp", True, [Bar("gpu", 128 * GiB), Bar("s", 32 * MiB)]), False, top)
    assert (unpadded.size, unpadded.align) == (256 * GiB, 128 * GiB)


def test_without_reserves_the_large_bars_land_misaligned():
    p = place([_gpu_port(i, 128 * GiB) for i in range(8)], RAM, Width(46))
    assert p.padded and p.slot_align == 32 * GiB
    # 192 GiB ports packed from 56 TiB: every other one starts off a multiple of 128 GiB
    lost = sorted(g for g in p.lost if g.startswith("gpu") and "small" not in g)
    assert len(lost) == 4 and all("multiple of its size" in p.lost[g] for g in lost)


@pytest.mark.parametrize("size,reserve", [(128 * GiB, 256 * GiB), (256 * GiB, 512 * GiB)])
@pytest.mark.parametrize("bits", [42, 43, 46])
def test_power_of_two_reserves_place_every_bar(size, reserve, bits):
    p = place([_gpu_port(i, size, reserve) for i in range(8)] + [Bridge(f"x{k}", True) for k in range(6)],
              RAM, Width(bits))
    if 8 * reserve > (1 << bits) // 2:
        return  # does not fit that width at all; the rule picks a wider one
    assert p.lost == {} and p.assigned == 32
    assert p.start % reserve == 0 and p.end <= 1 << bits


def test_the_second_large_bar_below_one_switch_is_misaligned_at_every_width_and_reserve():
    """Two 256 GiB GPUs below one switch: whatever the width (41-46) and reserve, the second GPU's
    downstream port starts size + top/2048 after the first."""
    for bits in range(41, 47):
        for reserve in (0, 1 << 40, 2 << 40, 3 << 39):
            ds = [Bridge(f"ds{k}", True, [Bar(f"gpu{k}", 256 * GiB), Bar(f"s{k}", 32 * MiB)]) for k in range(2)]
            p = place([Bridge("rp", True, [Bridge("us", False, ds)], reserve)], RAM, Width(bits))
            assert "gpu1" in p.lost, (bits, reserve)


def test_an_untrusted_width_keeps_1162s_rules():
    """40 bits on an Intel CPU model: no padding, natural alignment, windows right above RAM."""
    p = place([_gpu_port(0, 128 * GiB)], RAM, Width(40, "GenuineIntel"))
    assert not p.padded and p.top == 0 and p.lost == {}
    assert p.start == 128 * GiB  # RAM ends at 10 GiB, aligned up to the port's 128 GiB


def test_windows_above_the_cpu_width_lose_their_bars():
    p = place([_gpu_port(i, 256 * GiB) for i in range(8)], RAM, Width(40, "GenuineIntel"))
    assert any("above the CPU's width" in why for why in p.lost.values())
