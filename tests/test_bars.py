"""BARs: the `resource` format, the reader, the capture and the synthesiser's sizes."""

from __future__ import annotations

import os

import pytest

from pcitopo.errors import SysfsError
from pcitopo.host.capture import capture
from pcitopo.host.sources import MemoryTree
from pcitopo.host.sysfs import SysfsReader, open_host
from pcitopo.model.bars import (
    IORESOURCE_MEM,
    IORESOURCE_MEM_64,
    IORESOURCE_PREFETCH,
    Bar,
    device_bars,
    format_resource,
    parse_resource,
)
from pcitopo.model.tree import Topology

GiB, MiB = 1 << 30, 1 << 20

# An H100 SXM's `resource` as the kernel prints it (lines 0-12), BAR1 assigned, BAR3 not.
H100 = (
    "0x00000000a8000000 0x00000000a8ffffff 0x0000000000040200\n"
    "0x0000200000000000 0x0000201fffffffff 0x000000000014220c\n"
    "0x0000000000000000 0x0000000000000000 0x0000000000000000\n"
    "0x0000000000000000 0x0000000001ffffff 0x000000000014220c\n"
) + "0x0000000000000000 0x0000000000000000 0x0000000000000000\n" * 9


def test_parse_resource_sizes_flags_and_assignment():
    bars = parse_resource(H100)
    assert len(bars) == 13 and [b.index for b in bars] == list(range(13))
    b0, b1, b2, b3 = bars[:4]
    assert (b0.size, b0.is_mem, b0.is_64bit, b0.prefetchable, b0.assigned) == (16 * MiB, True, False, False, True)
    assert (b1.size, b1.is_64bit, b1.prefetchable, b1.assigned) == (128 * GiB, True, True, True)
    assert (b2.size, b2.is_mem, b2.assigned) == (0, False, True)  # unused: nothing to place
    assert (b3.size, b3.assigned) == (32 * MiB, False)  # start 0, size kept: not placed
    assert [b.index for b in device_bars(bars)] == [0, 1, 3]
    assert format_resource(bars) == H100


def test_flag_constants_are_the_kernels():
    assert (IORESOURCE_MEM, IORESOURCE_PREFETCH, IORESOURCE_MEM_64) == (0x200, 0x2000, 0x100000)
    b = Bar(1, 0x1000, 0x1FFF, 0x14220C)
    assert b.is_mem and b.prefetchable and b.is_64bit and b.size == 0x1000


@pytest.mark.parametrize("text", [
    "0x0 0x1\n",                                     # two fields
    "0x0 0x1 0x2 0x3\n",                             # four
    "zero 0x1 0x2\n",                                # not hex
    "0 1 2\n",                                       # hex without 0x: not what the kernel prints
    "0x0000000000002000 0x0000000000001000 0x200\n",  # end below start
    "0x0 0x0 0x0\n" * 65,                            # more lines than a function has
    "-0x10 0x1 0x200\n",                             # negative
])
def test_malformed_resource_is_a_sysfs_error(text):
    with pytest.raises(SysfsError, match="resource"):
        parse_resource(text)


def _one_gpu_tree(resource: str | None) -> MemoryTree:
    t = MemoryTree("t")
    d = "devices/pci0000:00/0000:00:01.0"
    t.add_link("bus/pci/devices/0000:00:01.0", f"../../../{d}")
    for k, v in (("vendor", "0x10de"), ("device", "0x2330"), ("class", "0x030200")):
        t.add_file(f"{d}/{k}", v + "\n")
    if resource is not None:
        t.add_file(f"{d}/resource", resource)
    return t


def test_reader_loads_bars_absent_is_none_malformed_is_a_warning():
    assert Topology(SysfsReader(_one_gpu_tree(H100))).function("0000:00:01.0").bars == parse_resource(H100)
    assert Topology(SysfsReader(_one_gpu_tree(None))).function("0000:00:01.0").bars is None
    bad = Topology(SysfsReader(_one_gpu_tree("garbage\n")))
    assert bad.function("0000:00:01.0").bars is None
    assert any("resource" in w for w in bad.warnings)


@pytest.mark.parametrize("fixture,ids,sizes", [
    ("hgx-h100", "10de:2330", [16 * MiB, 128 * GiB, 32 * MiB]),
    ("hgx-b200", "10de:2901", [64 * MiB, 256 * GiB, 32 * MiB]),
    ("hgx-b200", "15b3:1021", [32 * MiB]),
])
def test_fixtures_carry_real_bar_sizes(fixture, ids, sizes):
    host = open_host(f"fixtures/{fixture}")
    fs = [f for f in host.functions() if f.ids == ids and not f.is_vf]
    assert fs
    for f in fs:
        bars = device_bars(f.bars)
        assert [b.size for b in bars] == sizes, f.bdf
        assert all(b.assigned for b in bars)
        # every 64-bit prefetchable BAR lies inside the pref window of each bridge above it
        for a in host.ancestry(f):
            win = a.bars[15]
            for b in bars:
                if b.is_mem and b.is_64bit and b.prefetchable:
                    assert win.start <= b.start and b.end <= win.end, (f.bdf, a.bdf)


def test_negative_values_are_named():
    with pytest.raises(SysfsError, match="negative"):
        parse_resource("0x0 -0x1 0x200\n")


def test_the_planted_unassigned_bar_is_the_one_writer_s_output():
    """`fault=bar-unassigned` (the doctor's fixture) is planted by the same `resource` writer:
    the largest BAR at start 0 with its size kept, taking no room in the windows above it."""
    host = open_host("fixtures/hgx-h100-faults")
    gpu6 = host.function("0000:ba:00.0")
    bars = device_bars(gpu6.bars)
    assert [(b.index, b.size, b.assigned) for b in bars] == [(0, 16 * MiB, True), (1, 128 * GiB, False), (3, 32 * MiB, True)]
    assert bars[1].start == 0 and bars[1].is_mem64_pref
    above = host.ancestry(gpu6)
    assert above and all(a.bars[15].size < 128 * GiB for a in above)  # the windows hold BAR3 only
    clean = open_host("fixtures/hgx-h100").function("0000:ba:00.0")
    assert [b.size for b in device_bars(clean.bars)] == [b.size for b in bars]


def test_bar_fault_needs_a_function_with_bars():
    from pcitopo.synth import TopoError, parse_topo

    text = "numa 0 cpus=0\nrc 0000:00 numa=0\n  rp 00:01.0 preset=intel-rp fault=bar-unassigned\n"
    with pytest.raises(TopoError, match="line 3: fault=bar-unassigned"):
        parse_topo(text, "t.topo")


def test_capture_keeps_resource_files(tmp_path):
    out = tmp_path / "c.tar.gz"
    capture("fixtures/hgx-h100", out)
    a, b = open_host("fixtures/hgx-h100"), open_host(str(out))
    assert [f.bars for f in a.functions()] == [f.bars for f in b.functions()]
    assert all(f.bars is not None for f in b.functions())


@pytest.mark.skipif(not os.path.exists("/sys/bus/pci/devices"), reason="no live sysfs")
def test_live_sysfs_resource_parses():
    host = open_host("/sys")
    for f in host.functions():
        assert f.bars is None or len(f.bars) >= 6, f.bdf
