"""NCCL's topology-file grammar and bandwidth model, as NCCL's xml.cc/topo.cc have them.

The parser in ``ncclxml`` is the check the hook runs on every file it writes; these tests hold
it to NCCL's rules (each case names the xml.cc behaviour it follows), so a file it accepts is a
file NCCL loads, and one it refuses would fail NCCL's init.
"""

from __future__ import annotations

import ast
import base64
import threading
from pathlib import Path

import pytest

from pcitopo.nccl import install as ncclinstall, pcitree as nccltree, topoxml as ncclxml
from pcitopo.nccl.pcitree import DirSysfs, NcclTree
from pcitopo.nccl.price import SharedNcclTree
from pcitopo.nccl.topoxml import NcclXmlError, bandwidth, parse, rate

GOOD = b"""<system version="1">
  <cpu numaid="0">
    <pci busid="0000:d5:00.0" class="0x060400" link_speed="32.0 GT/s PCIe" link_width="16">
      <pci busid="0000:d7:00.0" class="0x030200" link_speed="32.0 GT/s PCIe" link_width="16"/>
    </pci>
  </cpu>
</system>
"""


def test_a_file_as_the_hook_writes_it_parses():
    system = parse(GOOD)
    pcis = [n for n in system.walk() if n.name == "pci"]
    assert [n.get("busid") for n in pcis] == ["0000:d5:00.0", "0000:d7:00.0"]
    assert pcis[1].parent is pcis[0]


@pytest.mark.parametrize("data, why", [
    (b'<?xml version="1.0"?>\n' + GOOD, "expected '>'"),  # xmlGetNode: '?' where '>' is due
    (GOOD.replace(b"  <cpu", b"\t<cpu"), "expected '<'"),  # only space, CR, LF between elements
    (GOOD.replace(b'version="1"', b"version=1"), "quoted"),  # xmlGetValue: quotes required
    (GOOD.replace(b'version="1"', b'version="2"'), "version 1"),  # ncclTopoXmlLoadSystem
    (GOOD.replace(b' version="1"', b""), "no version"),
    (GOOD.replace(b"</cpu>", b"</pci>"), "closed by"),  # xmlLoadSub: XML Mismatch
    (GOOD[:-10], "unterminated"),
    (GOOD.replace(b'busid="0000:d7:00.0"', b'busid="d7:00.0"'), "dddd:bb:dd.f"),
    (GOOD.replace(b' link_width="16"/>', b"/>"), "no link_width"),
    (b"", "no <system>"),
])
def test_what_nccl_refuses_is_refused(data, why):
    with pytest.raises(NcclXmlError, match=why):
        parse(data)


def test_comments_and_single_quotes_are_fine_unknown_elements_skipped():
    data = GOOD.replace(b"<cpu", b"<!-- by pcitopo -->\n  <cpu").replace(b'numaid="0"', b"numaid='0'")
    data = data.replace(b"</cpu>", b'<foo a="1"><pci busid="0000:00:01.0"/></foo>\n  </cpu>')
    system = parse(data)
    assert [n.get("busid") for n in system.walk() if n.name == "pci"] == ["0000:d5:00.0", "0000:d7:00.0"]


def test_values_are_literal_no_entities():
    """NCCL does not decode entities: a value keeps `&amp;` as five characters."""
    system = parse(GOOD.replace(b'class="0x060400"', b'class="0x060400" name="a&amp;b"'))
    assert next(n for n in system.walk() if n.get("name")).get("name") == "a&amp;b"


def test_limits_256_elements():
    many = b"".join(b'<pci busid="0000:%02x:00.0" class="0x020000" link_speed="" link_width="16"/>' % i for i in range(255))
    with pytest.raises(NcclXmlError, match="256 elements"):
        parse(b'<system version="1"><cpu numaid="0">' + many + b"</cpu></system>")


@pytest.mark.parametrize("speed, want", [
    ("32.0 GT/s PCIe", 240), ("64.0 GT/s PCIe", 480), ("16.0 GT/s PCIe", 120), ("2.5 GT/s PCIe", 15),
    ("32 GT/s", 240),  # kernels up to 5.6
    ("32.0 GT/s", 60), ("64 GT/s", 60), ("Unknown", 60), ("", 60),  # not in NCCL's table: Gen3
])
def test_speed_table_is_a_prefix_lookup_with_a_gen3_fallback(speed, want):
    assert rate(speed) == want


def test_bandwidth_width_zero_counts_as_16():
    assert bandwidth("32.0 GT/s PCIe", "16") == 48.0
    assert bandwidth("32.0 GT/s PCIe", "0") == 48.0
    assert bandwidth("2.5 GT/s PCIe", "1") == pytest.approx(0.1875)  # QEMU's upstream port


def test_sysfs_link_takes_the_lower_end_and_ignores_unknown():
    assert ncclxml.sysfs_link("32.0 GT/s PCIe", "16.0 GT/s PCIe", "16", "32") == ("16.0 GT/s PCIe", "16")
    assert ncclxml.sysfs_link("32.0 GT/s PCIe", "Unknown", "16", "0") == ("32.0 GT/s PCIe", "0")
    assert ncclxml.sysfs_link("2.5 GT/s PCIe", "32.0 GT/s PCIe", "1", "16") == ("2.5 GT/s PCIe", "1")


def test_canonical_speed_keeps_the_rate():
    for s in ("32 GT/s", "32.0 GT/s PCIe", "5 GT/s", "Unknown", "64 GT/s"):
        assert rate(ncclxml.canonical_speed(s)) == rate(s)
    assert ncclxml.canonical_speed("32 GT/s") == "32.0 GT/s PCIe"


def _sysfs(tmp_path: Path, devices: dict[str, tuple[str, str, str]]) -> Path:
    """A sysfs directory: realpath → (max_link_speed, max_link_width, numa_node)."""
    for real, (speed, width, numa) in devices.items():
        d = tmp_path / "devices" / real
        d.mkdir(parents=True, exist_ok=True)
        (d / "max_link_speed").write_text(speed + "\n")
        (d / "max_link_width").write_text(width + "\n")
        (d / "numa_node").write_text(numa + "\n")
        (d / "class").write_text("0x060400\n" if real.count("/") < 3 else "0x030200\n")
        link = tmp_path / "bus" / "pci" / "devices" / real.rsplit("/", 1)[1]
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to("../../../devices/" + real)
    return tmp_path


def test_a_guest_switch_is_priced_at_its_emulated_link_unless_the_file_says(tmp_path):
    rp, us, ds, gpu = "pci0000:d4/0000:d4:00.0", "0000:d5:00.0", "0000:d6:00.0", "0000:d7:00.0"
    root = _sysfs(tmp_path, {
        rp: ("32.0 GT/s PCIe", "16", "0"),
        f"{rp}/{us}": ("2.5 GT/s PCIe", "1", "0"),
        f"{rp}/{us}/{ds}": ("Unknown", "0", "0"),
        f"{rp}/{us}/{ds}/{gpu}": ("32.0 GT/s PCIe", "16", "0"),
    })
    bare = NcclTree(DirSysfs(str(root)))
    assert bare.to_cpu(gpu) == pytest.approx(0.1875)
    assert [n.get("busid") for n in bare.chain(gpu)] == [gpu, us]
    with_file = NcclTree(DirSysfs(str(root)), parse(GOOD))
    assert with_file.to_cpu(gpu) == 48.0
    assert with_file.cpu_of(gpu) == "0"


def test_decode_offered_and_install(tmp_path):
    blob = base64.b64encode(GOOD)
    assert ncclxml.decode_offered(blob + b"\n") == GOOD
    with pytest.raises(NcclXmlError, match="base64"):
        ncclxml.decode_offered(GOOD)
    with pytest.raises(NcclXmlError):
        ncclxml.decode_offered(base64.b64encode(b"<system>"))
    dest = tmp_path / "run" / "nvidia-topologyd" / "virtualTopology.xml"
    ncclxml.install(GOOD, str(dest))
    assert dest.read_bytes() == GOOD and dest.stat().st_mode & 0o777 == 0o644


def test_guest_module_is_stdlib_only_python38():
    """The guest tool carries these modules (and the one writer they install with): standard
    library only, Python 3.8 syntax."""
    from pcitopo.host import files

    for mod in (ncclxml, nccltree, ncclinstall, files):
        _stdlib_only(Path(mod.__file__).read_text())


def _stdlib_only(src: str) -> None:
    tree = ast.parse(src, feature_version=(3, 8))
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    own = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module and n.module.startswith("pcitopo")}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module} - {"pcitopo"}
    assert own <= {"pcitopo.nccl.topoxml", "pcitopo.errors", "pcitopo.host.files"}, own  # only the guest modules' own
    assert imported <= {"__future__", "argparse", "base64", "binascii", "os", "re", "stat", "subprocess", "sys", "typing"}, imported


class _HeldSysfs(DirSysfs):
    """A sysfs view that holds the first thread reading ``busid``'s attributes until released,
    so another thread can ask the tree for the same node while it is being filled."""

    def __init__(self, root: str, busid: str):
        super().__init__(root)
        self.busid = busid
        self.inside = threading.Event()
        self.release = threading.Event()

    def attr(self, path, name):
        if path and path[-1] == self.busid and not self.inside.is_set():
            self.inside.set()
            self.release.wait(60)
        return super().attr(path, name)


def test_a_node_asked_for_while_another_thread_fills_it_comes_back_whole(tmp_path):
    """The tree kept with a host model (ncclprice.nccl_tree: a SharedNcclTree) serves every call
    on it, so threads ask it for the same node at once. The second asker must get the node with
    the switches above it, not the bare node the first asker has marked as filled and not yet
    attached (what a plain NcclTree hands out)."""
    rp, us, ds, gpu = "pci0000:d4/0000:d4:00.0", "0000:d5:00.0", "0000:d6:00.0", "0000:d7:00.0"
    root = _sysfs(tmp_path, {
        rp: ("32.0 GT/s PCIe", "16", "0"),
        f"{rp}/{us}": ("32.0 GT/s PCIe", "16", "0"),
        f"{rp}/{us}/{ds}": ("32.0 GT/s PCIe", "16", "0"),
        f"{rp}/{us}/{ds}/{gpu}": ("32.0 GT/s PCIe", "16", "0"),
    })
    want = [n.get("busid") for n in NcclTree(DirSysfs(str(root))).chain(gpu)]
    assert want == [gpu, us]  # the root port is skipped, as NCCL skips it
    view = _HeldSysfs(str(root), gpu)
    tree = SharedNcclTree(view)
    chains: dict[str, list] = {}
    first = threading.Thread(target=lambda: chains.__setitem__("first", tree.chain(gpu)))
    second = threading.Thread(target=lambda: chains.__setitem__("second", tree.chain(gpu)))
    first.start()
    assert view.inside.wait(60)
    second.start()
    second.join(2)  # left to finish on its own while the first is held (it must wait for it instead)
    view.release.set()
    first.join(60)
    second.join(60)
    assert [n.get("busid") for n in chains["first"]] == want
    assert [n.get("busid") for n in chains["second"]] == want
