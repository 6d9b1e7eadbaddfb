"""The synthetic host builder: kernel-shaped trees, line-numbered errors, fresh fixtures."""

from __future__ import annotations

import re
import shutil
import textwrap
from dataclasses import replace

import pytest
from hypothesis import given, strategies as st

import pcitopo.synth.build as synth_build
from pcitopo.errors import SysfsError
from pcitopo.host.sources import MemoryTree, resolve
from pcitopo.host.sysfs import (
    CLASS_DIRS,
    DOCTOR_ATTRS,
    LINK_ATTRS,
    NODE_ATTRS,
    OPTIONAL_ATTRS,
    REQUIRED_ATTRS,
    RESOURCE_ATTRS,
    SysfsReader,
)
from pcitopo.libvirt.domain import parse_cpuset
from pcitopo.model.tree import Topology
from pcitopo.synth import build_tree, format_cpus, load_topo_file, parse_topo
from testkit import FIXTURES, fixture_script

generate = fixture_script("generate")
FIXTURE_NAMES = generate.fixture_names()
SMALL_FIXTURES = [n for n in FIXTURE_NAMES if n != "sriov-4k"]


def tree_of(text: str) -> MemoryTree:
    return build_tree(parse_topo(textwrap.dedent(text), "t.topo"))


def fixture_tree(name: str) -> MemoryTree:
    return load_topo_file(FIXTURES / name / "host.topo")


def function_dirs(tree: MemoryTree) -> dict[str, str]:
    """BDF → realpath of its directory, through the bus/pci/devices links."""
    return {b: resolve(tree, f"bus/pci/devices/{b}") for b in tree.listdir("bus/pci/devices") or []}


SMALL = """\
numa 0 cpus=0-3,8-11
numa 1 cpus=4-7,12-15
rc 0000:15 numa=0
  ep 15:00.0 preset=intel-vtd
  rp 15:01.0 preset=intel-rp
    us 16:00.0 preset=pex-gen5-oem
      ds 17:00.0
        ep 18:00.0 preset=h100
      ds 17:01.0
        ep 19:00.0 preset=cx7-ib vfs=3
rc 0000:80 numa=-1
  rp 80:01.0 preset=intel-rp
    br 81:00.0 preset=aspeed-bridge
      ep 82:00.0 preset=bmc-vga
  rp 80:02.0 preset=intel-rp
    ep 83:00.0 preset=cx6-dx functions=2 vfs=2 omit=subsystem_vendor,local_cpulist
"""


# -- kernel-shaped trees -----------------------------------------------------------------------

def test_bus_links_are_relative_and_resolve_to_the_nested_path():
    tree = tree_of(SMALL)
    assert tree.readlink("bus/pci/devices/0000:18:00.0") == (
        "../../../devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:00.0/0000:18:00.0")
    assert resolve(tree, "bus/pci/devices/0000:18:00.0") == (
        "devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:00.0/0000:18:00.0")
    assert resolve(tree, "bus/pci/devices/0000:15:00.0") == "devices/pci0000:15/0000:15:00.0"
    assert resolve(tree, "bus/pci/devices/0000:82:00.0") == (
        "devices/pci0000:80/0000:80:01.0/0000:81:00.0/0000:82:00.0")


def test_attribute_files_are_formatted_like_the_kernel():
    tree = tree_of(SMALL)
    gpu = resolve(tree, "bus/pci/devices/0000:18:00.0")
    want = {
        "vendor": b"0x10de\n", "device": b"0x2330\n", "class": b"0x030200\n",
        "subsystem_vendor": b"0x10de\n", "subsystem_device": b"0x16c1\n", "numa_node": b"0\n",
        "max_link_speed": b"32.0 GT/s PCIe\n", "max_link_width": b"16\n",
        "current_link_speed": b"32.0 GT/s PCIe\n", "current_link_width": b"16\n",
        "local_cpulist": b"0-3,8-11\n",
    }
    assert {a: tree.read(f"{gpu}/{a}") for a in want} == want
    assert tree.read("devices/system/node/node1/cpulist") == b"4-7,12-15\n"
    # numa_node -1: local_cpulist shows every CPU, as pci-sysfs does.
    vga = resolve(tree, "bus/pci/devices/0000:82:00.0")
    assert tree.read(f"{vga}/numa_node") == b"-1\n"
    assert tree.read(f"{vga}/local_cpulist") == b"0-15\n"
    # An RCiEP has no link: the kernel prints Unknown and 0.
    vtd = resolve(tree, "bus/pci/devices/0000:15:00.0")
    assert tree.read(f"{vtd}/max_link_speed") == b"Unknown\n"
    assert tree.read(f"{vtd}/max_link_width") == b"0\n"


ATTR_FORMATS = {
    "vendor": r"0x[0-9a-f]{4}", "device": r"0x[0-9a-f]{4}", "subsystem_vendor": r"0x[0-9a-f]{4}",
    "subsystem_device": r"0x[0-9a-f]{4}", "class": r"0x[0-9a-f]{6}", "numa_node": r"-1|\d+",
    "max_link_speed": r"(2\.5|5\.0|8\.0|16\.0|32\.0|64\.0) GT/s PCIe|Unknown",
    "current_link_speed": r"(2\.5|5\.0|8\.0|16\.0|32\.0|64\.0) GT/s PCIe|Unknown",
    "max_link_width": r"\d+", "current_link_width": r"\d+", "local_cpulist": r"\d+(-\d+)?(,\d+(-\d+)?)*",
}


@pytest.mark.parametrize("name", SMALL_FIXTURES)
def test_fixtures_hold_only_listed_files_in_kernel_format(name):
    tree = fixture_tree(name)
    # plus the class children a driver registers (infiniband/<name>: fixtures' rdma=)
    listed = set(REQUIRED_ATTRS) | set(OPTIONAL_ATTRS) | set(LINK_ATTRS) | set(RESOURCE_ATTRS) | set(DOCTOR_ATTRS) | set(CLASS_DIRS)
    dirs = function_dirs(tree)
    assert dirs, name
    for bdf, d in dirs.items():
        assert d.rsplit("/", 1)[1] == bdf
        names = set(tree.listdir(d) or [])
        children = {n for n in names if re.fullmatch(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]", n)}
        assert names - children <= listed, (bdf, names - children - listed)
        assert set(REQUIRED_ATTRS) <= names, bdf
        # multi-line and binary files: test_bars.py (resource), test_doctor.py (the doctor's)
        for attr in names - children - set(LINK_ATTRS) - set(RESOURCE_ATTRS) - set(DOCTOR_ATTRS) - set(CLASS_DIRS):
            data = tree.read(f"{d}/{attr}")
            assert isinstance(data, bytes) and data.endswith(b"\n") and data.count(b"\n") == 1
            assert re.fullmatch(ATTR_FORMATS[attr], data.decode().rstrip("\n")), (bdf, attr, data)
        # `resource` as the kernel prints it (13 lines, 17 for a bridge)
        res = tree.read(f"{d}/resource")
        assert isinstance(res, bytes), bdf
        lines = res.decode().splitlines()
        assert len(lines) in (13, 17) and all(re.fullmatch(r"(0x[0-9a-f]{16} ){2}0x[0-9a-f]{16}", ln) for ln in lines)
    for node in tree.listdir("devices/system/node") or []:
        assert set(tree.listdir(f"devices/system/node/{node}") or []) == set(NODE_ATTRS)


@pytest.mark.parametrize("name", SMALL_FIXTURES)
def test_driver_and_iommu_links_are_relative_at_the_right_depth(name):
    tree = fixture_tree(name)
    for bdf, d in function_dirs(tree).items():
        driver = tree.readlink(f"{d}/driver")
        if driver is not None:
            assert driver.startswith("../") and resolve(tree, f"{d}/driver").startswith("bus/pci/drivers/")
        group = tree.readlink(f"{d}/iommu_group")
        assert group is not None and group.startswith("../"), bdf
        assert re.fullmatch(r"kernel/iommu_groups/\d+", resolve(tree, f"{d}/iommu_group")), bdf


def test_vfs_are_siblings_of_their_pf_with_physfn():
    tree = tree_of(SMALL)
    pf = resolve(tree, "bus/pci/devices/0000:19:00.0")
    vfs = ["0000:19:00.1", "0000:19:00.2", "0000:19:00.3"]
    for vf in vfs:
        d = resolve(tree, f"bus/pci/devices/{vf}")
        assert d.rsplit("/", 1)[0] == pf.rsplit("/", 1)[0]
        assert tree.readlink(f"{d}/physfn") == "../0000:19:00.0"
        assert resolve(tree, f"{d}/physfn") == pf
        assert tree.read(f"{d}/device") == b"0x101e\n"
        assert tree.read(f"{d}/class") == b"0x020700\n"
        assert resolve(tree, f"{d}/driver") == "bus/pci/drivers/vfio-pci"
    assert tree.readlink(f"{pf}/physfn") is None
    # Dual-port PF: VFs after both ports, PF0's first (83:00.2-3), then PF1's (83:00.4-5).
    for vf, parent in (("0000:83:00.2", "0000:83:00.0"), ("0000:83:00.3", "0000:83:00.0"),
                       ("0000:83:00.4", "0000:83:00.1"), ("0000:83:00.5", "0000:83:00.1")):
        assert tree.readlink(f"{resolve(tree, f'bus/pci/devices/{vf}')}/physfn") == f"../{parent}"


def test_vfs_past_function_255_continue_on_the_next_bus():
    tree = tree_of("""\
        numa 0 cpus=0-3
        rc 0000:15 numa=0
          rp 15:01.0 preset=intel-rp
            ep 16:00.0 preset=cx7-eth vfs=300
          rp 15:02.0 preset=intel-rp
            ep 18:00.0 preset=h100
        """)
    last = resolve(tree, "bus/pci/devices/0000:17:05.4")  # routing id 0x1600 + 300
    assert last == "devices/pci0000:15/0000:15:01.0/0000:17:05.4"
    assert tree.readlink(f"{last}/physfn") == "../0000:16:00.0"
    assert tree.readlink("bus/pci/devices/0000:17:05.5") is None


def test_omit_drops_optional_files_and_driver_none_drops_the_link():
    tree = tree_of(SMALL)
    vga = resolve(tree, "bus/pci/devices/0000:82:00.0")  # preset: conventional PCI, no link files
    names = set(tree.listdir(vga) or [])
    assert not names & {"max_link_speed", "max_link_width", "current_link_speed", "current_link_width"}
    assert {"vendor", "numa_node", "local_cpulist"} <= names
    nic = resolve(tree, "bus/pci/devices/0000:83:00.1")
    assert tree.read(f"{nic}/subsystem_vendor") is None and tree.read(f"{nic}/local_cpulist") is None
    assert tree.read(f"{nic}/subsystem_device") == b"0x0016\n"
    bridge = resolve(tree, "bus/pci/devices/0000:81:00.0")
    assert tree.readlink(f"{bridge}/driver") is None  # the AST1150 has no driver
    t2 = tree_of("""\
        numa 0 cpus=0
        rc 0000:00 numa=0
          rp 00:01.0 preset=intel-rp
            ep 01:00.0 preset=nvme driver=none omit=link,iommu_group
        """)
    d = resolve(t2, "bus/pci/devices/0000:01:00.0")
    assert set(t2.listdir(d) or []) == {"vendor", "device", "class", "subsystem_vendor",
                                         "subsystem_device", "numa_node", "local_cpulist", *DOCTOR_ATTRS}
    t3 = tree_of("""\
        numa 0 cpus=0
        rc 0000:00 numa=0
          rp 00:01.0 preset=intel-rp
            ep 01:00.0 preset=nvme omit=resource
        """)
    assert t3.read(resolve(t3, "bus/pci/devices/0000:01:00.0") + "/resource") is None


def test_overrides_and_current_link():
    tree = tree_of("""\
        numa 0 cpus=0-1
        rc 0000:00 numa=0
          rp 00:01.0 preset=intel-rp
            ep 01:00.0 preset=a100-pcie cur-speed=2.5 cur-width=8 ids=10de:20b5 sub=10de:1533
          rp 00:02.0 preset=intel-rp
            ep 02:00.0 ids=1234:5678 class=0x120000 speed=8 width=4 iommu=40
        """)
    d = resolve(tree, "bus/pci/devices/0000:01:00.0")
    assert tree.read(f"{d}/max_link_speed") == b"16.0 GT/s PCIe\n"
    assert tree.read(f"{d}/current_link_speed") == b"2.5 GT/s PCIe\n"
    assert tree.read(f"{d}/current_link_width") == b"8\n"
    assert tree.read(f"{d}/device") == b"0x20b5\n" and tree.read(f"{d}/subsystem_device") == b"0x1533\n"
    e = resolve(tree, "bus/pci/devices/0000:02:00.0")
    assert tree.read(f"{e}/class") == b"0x120000\n" and tree.read(f"{e}/subsystem_vendor") == b"0x0000\n"
    assert tree.read(f"{e}/max_link_speed") == b"8.0 GT/s PCIe\n"
    assert tree.readlink(f"{e}/iommu_group").endswith("/kernel/iommu_groups/40")
    assert tree.readlink(f"{e}/driver") is None


def test_iommu_groups_unique_per_function_and_shared_behind_a_pci_bridge():
    tree = tree_of(SMALL)
    groups = {b: resolve(tree, f"{d}/iommu_group") for b, d in function_dirs(tree).items()}
    assert groups["0000:81:00.0"] == groups["0000:82:00.0"]
    others = [g for b, g in groups.items() if b not in ("0000:81:00.0", "0000:82:00.0")]
    assert len(set(others)) == len(others)


def test_builder_refuses_an_attribute_it_cannot_write(monkeypatch):
    monkeypatch.setattr(synth_build, "OPTIONAL_ATTRS", (*OPTIONAL_ATTRS, "brand_new_attr"))
    with pytest.raises(SysfsError, match="brand_new_attr"):
        tree_of(SMALL)


def test_the_reader_sees_the_described_hierarchy():
    spec = parse_topo(SMALL, "t.topo")
    topo = Topology(SysfsReader(build_tree(spec)))
    for root in spec.roots:
        for child in root.children:
            f = topo.function(child.bdf)
            assert f.parent_bdf is None and f.root_complex == root.dirname
    for dev in spec.devices():
        for child in dev.children:
            for b in child.function_bdfs():
                assert topo.function(b).parent_bdf == dev.bdf
        for vf, pf in dev.vf_bdfs():
            assert topo.function(vf).physfn == pf
    assert topo.warnings == []
    assert {n: topo.numa_nodes()[n].cpulist for n in (0, 1)} == {0: "0-3,8-11", 1: "4-7,12-15"}


@given(st.sets(st.integers(min_value=0, max_value=600), min_size=1))
def test_cpulist_round_trip(cpus):
    """What synth writes (the kernel's format), the sidecar's own parser reads back."""
    text = format_cpus(sorted(cpus))
    assert parse_cpuset(text) == cpus
    assert "--" not in text and not text.startswith(",")


# -- bad descriptions --------------------------------------------------------------------------

HEAD = "numa 0 cpus=0-7\nrc 0000:10 numa=0\n"  # lines 1-2

BAD = [
    ("ds under a root port", HEAD + "  rp 10:01.0 preset=intel-rp\n    ds 11:00.0 preset=pex-gen5-oem\n", 4, "cannot sit under rp"),
    ("rp under a switch", HEAD + "  rp 10:01.0 preset=intel-rp\n    us 11:00.0 preset=pex-gen5-oem\n"
     "      rp 12:00.0 preset=intel-rp\n", 5, "cannot sit under us"),
    ("us on a root bus", HEAD + "  us 10:01.0 preset=pex-gen5-oem\n", 3, "cannot sit under rc"),
    ("endpoint on an upstream port", HEAD + "  rp 10:01.0 preset=intel-rp\n    us 11:00.0 preset=pex-gen5-oem\n"
     "      ep 12:00.0 preset=h100\n", 5, "cannot sit under us"),
    ("duplicate address", HEAD + "  rp 10:01.0 preset=intel-rp\n  rp 10:01.0 preset=intel-rp\n", 4, "already used on line 3"),
    ("function collides with functions=", HEAD + "  ep 10:02.0 preset=cx6-dx functions=2\n  ep 10:02.1 preset=nvme\n", 4,
     "already used on line 3"),
    ("VF collides with a function", HEAD + "  ep 10:02.0 preset=cx7-eth vfs=2\n  ep 10:02.2 preset=nvme\n", 4, "already used on line 3"),
    ("child bus not above its bridge", HEAD + "  rp 10:01.0 preset=intel-rp\n    ep 10:00.0 preset=h100\n", 4, "above its bridge"),
    ("root child off the root bus", HEAD + "  rp 11:01.0 preset=intel-rp\n", 3, "root bus 10"),
    ("children of one bridge on two buses", HEAD + "  rp 10:01.0 preset=intel-rp\n    us 11:00.0 preset=pex-gen5-oem\n"
     "      ds 12:00.0\n      ds 13:00.0\n", 6, "share one bus"),
    ("second device on a port link", HEAD + "  rp 10:01.0 preset=intel-rp\n    ep 11:01.0 preset=h100\n", 4, "device 00"),
    ("sibling subtrees overlap", HEAD + "  rp 10:01.0 preset=intel-rp\n    us 11:00.0 preset=pex-gen5-oem\n      ds 12:00.0\n"
     "        us 13:00.0 preset=pex-gen5-oem\n          ds 14:00.0\n            ep 16:00.0 preset=h100\n"
     "      ds 12:01.0\n        ep 15:00.0 preset=h100\n", 9, "buses 15-15, overlapping ds 0000:12:00.0 (line 5, buses 13-16)"),
    ("VF lands on a sibling's address", HEAD + "  rp 10:01.0 preset=intel-rp\n    ep 11:00.0 preset=cx7-eth vfs=300\n"
     "  rp 10:02.0 preset=intel-rp\n    ep 12:00.0 preset=h100\n", 6, "0000:12:00.0 is already used on line 4 (a VF of 0000:11:00.0)"),
    ("VF buses run into the next root complex", HEAD + "  rp 10:01.0 preset=intel-rp\n    ep 11:00.0 preset=cx7-eth vfs=300\n"
     "rc 0000:12 numa=0\n", 5, "overlapping rc 0000:10 (line 2, buses 10-12)"),
    ("root complexes overlap", HEAD + "  rp 10:01.0 preset=intel-rp\n    ep 12:00.0 preset=h100\nrc 0000:11 numa=0\n", 5,
     "overlapping rc 0000:10"),
    ("unknown preset", HEAD + "  ep 10:02.0 preset=h1000\n", 3, "unknown preset 'h1000'"),
    ("unknown key", HEAD + "  ep 10:02.0 preset=h100 colour=green\n", 3, "unknown key 'colour'"),
    ("key given twice", HEAD + "  ep 10:02.0 preset=h100 numa=0 numa=0\n", 3, "given twice"),
    ("not key=value", HEAD + "  ep 10:02.0 preset=h100 fast\n", 3, "key=value"),
    ("unknown line kind", HEAD + "  gpu 10:02.0\n", 3, "unknown line kind"),
    ("endpoint without ids", HEAD + "  ep 10:02.0 class=0x030200\n", 3, "needs preset="),
    ("endpoint with a bridge class", HEAD + "  ep 10:02.0 preset=intel-rp\n", 3, "non-bridge class"),
    ("bridge with an endpoint class", HEAD + "  rp 10:01.0 preset=h100\n", 3, "bridge class"),
    ("vfs without a VF id", HEAD + "  ep 10:02.0 preset=h100 vfs=2\n", 3, "no SR-IOV VF id"),
    ("functions= off function 0", HEAD + "  ep 10:02.1 preset=cx6-dx functions=2\n", 3, "counts from function 0"),
    ("functions= on a bridge", HEAD + "  rp 10:01.0 preset=intel-rp functions=2\n", 3, "unknown key 'functions'"),
    ("omit a required file", HEAD + "  ep 10:02.0 preset=h100 omit=vendor\n", 3, "omit='vendor'"),
    ("bad speed", HEAD + "  ep 10:02.0 preset=h100 speed=40\n", 3, "speed=40"),
    ("bad width", HEAD + "  ep 10:02.0 preset=h100 width=3\n", 3, "width=3"),
    ("bad class", HEAD + "  ep 10:02.0 ids=10de:2330 class=0302\n", 3, "0xCCCCCC"),
    ("bad ids", HEAD + "  ep 10:02.0 ids=10de2330 class=0x030200\n", 3, "VVVV:DDDD"),
    ("bad address", HEAD + "  ep 10:2.0 preset=h100\n", 3, "not a PCI address"),
    ("device number above 1f", HEAD + "  ep 10:20.0 preset=h100\n", 3, "above 1f"),
    ("other PCI domain", HEAD + "  ep 0001:10:02.0 preset=h100\n", 3, "another PCI domain"),
    ("undeclared NUMA node", HEAD + "  ep 10:02.0 preset=h100 numa=3\n", 3, "no 'numa 3' line"),
    ("rc without numa", "numa 0 cpus=0\nrc 0000:10\n", 2, "needs numa=N"),
    ("rc on an undeclared node", "numa 0 cpus=0\nrc 0000:10 numa=1\n", 2, "no 'numa 1' line"),
    ("rc declared twice", "numa 0 cpus=0\nrc 0000:10 numa=0\nrc 0000:10 numa=0\n", 3, "already declared on line 2"),
    ("indented rc", "numa 0 cpus=0\n  rc 0000:10 numa=0\n", 2, "not indented"),
    ("device at top level", "numa 0 cpus=0\nep 10:00.0 preset=h100\n", 2, "must be indented"),
    ("ragged indentation", HEAD + "  rp 10:01.0 preset=intel-rp\n      ep 11:00.0 preset=h100\n  rp 10:02.0 preset=intel-rp\n"
     "     ep 12:00.0 preset=h100\n    ep 12:00.1 preset=h100\n", 7, "does not line up"),
    ("tab indentation", HEAD + "\trp 10:01.0 preset=intel-rp\n", 3, "tabs"),
    ("no numa line", "rc 0000:10 numa=-1\n", 1, "no 'numa' line"),
    ("numa CPUs shared", "numa 0 cpus=0-3\nnuma 1 cpus=3-5\n", 2, "shares CPUs"),
    ("numa declared twice", "numa 0 cpus=0\nnuma 0 cpus=1\n", 2, "already declared"),
    ("bad cpu list", "numa 0 cpus=0-\n", 1, "cannot read cpu/node list '0-'"),
    ("backwards cpu range", "numa 0 cpus=3-1\n", 1, "cannot read cpu/node list '3-1'"),
    ("cpu list naming no CPU", "numa 0 cpus=0-3,^0-3\n", 1, "names no CPU"),
    ("numa without cpus", "numa 0\n", 1, "needs cpus=LIST"),
]


@pytest.mark.parametrize("text,line,fragment", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_descriptions_fail_with_the_line_number(text, line, fragment):
    with pytest.raises(SysfsError) as err:
        parse_topo(text, "bad.topo")
    msg = str(err.value)
    assert msg.startswith(f"bad.topo line {line}: "), msg
    assert fragment in msg, msg
    assert "\n" not in msg
    assert err.value.line == line


def test_load_topo_file_errors_name_the_file(tmp_path):
    with pytest.raises(SysfsError, match="cannot read"):
        load_topo_file(tmp_path / "missing.topo")
    p = tmp_path / "x.topo"
    p.write_text("numa 0 cpus=0\nrc 0000:00 numa=0\n  rp 00:01.0 preset=nope\n")
    with pytest.raises(SysfsError, match=re.escape(f"{p} line 3: ")):
        load_topo_file(p)


# -- the committed fixtures ----------------------------------------------------------------------

@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_committed_tarball_is_what_the_description_generates(name):
    assert generate.check(name) is None


def test_generation_is_byte_for_byte_deterministic(tmp_path):
    tree = fixture_tree("hgx-h100")
    tree.write_tarball(tmp_path / "a.tar.gz")
    fixture_tree("hgx-h100").write_tarball(tmp_path / "b.tar.gz")
    assert (tmp_path / "a.tar.gz").read_bytes() == (tmp_path / "b.tar.gz").read_bytes()


def test_check_mode_flags_a_stale_tarball(tmp_path, monkeypatch, capsys):
    for name in ("pcie-2socket",):
        shutil.copytree(FIXTURES / name, tmp_path / name)
    monkeypatch.setattr(generate, "FIXTURES", tmp_path)
    assert generate.main(["--check"]) == 0
    topo = tmp_path / "pcie-2socket" / "host.topo"
    topo.write_text(topo.read_text().replace("vfs=4", "vfs=5"))
    assert generate.main(["--check"]) == 1
    assert "pcie-2socket: sysfs.tar.gz is stale" in capsys.readouterr().err
    assert generate.main([]) == 0  # regenerate
    assert generate.main(["--check"]) == 0
    assert generate.main(["--check", "no-such-fixture"]) == 2


def test_fixtures_read_back_through_the_project_reader():
    from pcitopo.host.sysfs import open_host

    for name in SMALL_FIXTURES:
        host = open_host(FIXTURES / name)
        assert len(host.bdfs()) == len(function_dirs(fixture_tree(name)))
        assert host.warnings == [], name


def test_hgx_h100_matches_the_nccl_dump_of_the_real_host():
    """Facts from the bare-metal NCCL dump of a Supermicro HGX H200 posted in NVIDIA nccl-tests
    issue #256 (docs/SOURCES.md, "the fixture hosts")."""
    topo = Topology(SysfsReader(fixture_tree("hgx-h100")))
    switches = {"16:00.0": {"18:00.0", "19:00.0"}, "27:00.0": {"29:00.0", "2a:00.0"},
                "38:00.0": {"3a:00.0", "3b:00.0"}, "5a:00.0": {"5c:00.0", "5d:00.0"}}
    for sw, members in switches.items():
        f = topo.function(sw)
        assert (f.ids, f.subsystem_ids, f.link.max_speed, f.link.max_width) == (
            "1000:c030", "15d9:1d25", "32.0 GT/s PCIe", 16)
        below = {str(b)[5:] for ds in topo.children(f.bdf) for b in topo.children(ds)}
        assert below == members
    for gpu in ("18:00.0", "2a:00.0", "3a:00.0", "5d:00.0", "9a:00.0", "ab:00.0", "ba:00.0", "db:00.0"):
        f = topo.function(gpu)
        assert (f.ids, f.subsystem_ids, f.class_code) == ("10de:2330", "10de:16c1", 0x030200)
    for nic in ("19:00.0", "29:00.0", "3b:00.0", "5c:00.0"):
        f = topo.function(nic)
        assert (f.ids, f.subsystem_ids, f.class_code) == ("15b3:1021", "15b3:0023", 0x020000)
    for nvs in ("05:00.0", "06:00.0", "07:00.0", "08:00.0"):
        assert topo.function(nvs).ids == "10de:22a3"
    # Two sockets: GPUs 18 2a 3a 5d on NUMA 0, the rest on NUMA 1 (fixtures/hgx-h100/README.md).
    assert {g[:2]: topo.numa_of(topo.function(g)) for g in ("18:00.0", "5d:00.0", "9a:00.0", "db:00.0")} == {
        "18": 0, "5d": 0, "9a": 1, "db": 1}


def test_sriov_4k_is_hgx_h100_plus_vfs():
    base = parse_topo((FIXTURES / "hgx-h100" / "host.topo").read_text(), "hgx-h100")
    big = parse_topo((FIXTURES / "sriov-4k" / "host.topo").read_text(), "sriov-4k")

    def shape(spec, strip):
        out = []
        for d in spec.devices():
            look = d.look
            if strip and d.vfs:
                look = replace(look, driver="vfio-pci")
            out.append((d.kind, d.bdf, look, d.numa, d.functions, d.iommu))
        return out

    assert [r.dirname for r in base.roots] == [r.dirname for r in big.roots]
    assert [(n.node, n.cpus) for n in base.numa] == [(n.node, n.cpus) for n in big.numa]
    assert shape(base, False) == shape(big, True)
    with_vfs = [d for d in big.devices() if d.vfs]
    assert sum(d.vfs * d.functions for d in with_vfs) == 4096
    assert {str(d.bdf)[5:7] for d in with_vfs} == {"19", "29", "3b", "5c", "9b", "aa", "bb", "da"}
    assert all(d.look.driver == "mlx5_core" for d in with_vfs)


def test_sriov_4k_tarball_stays_small():
    size = (FIXTURES / "sriov-4k" / "sysfs.tar.gz").stat().st_size
    assert size < 3 * 1024 * 1024, size
