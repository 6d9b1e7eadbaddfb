"""Every input a command reads is bounded: hostile files made here (a YAML alias bomb, /dev/zero
as a cluster dump, a cluster dump file one byte over its bound, a capture tarball of 1.5 million
entries, one of huge PAX names and link targets, 100k-deep YAML and JSON) each end in one line
on stderr and exit 2, within 5 s and 200 MB of memory (the child's own peak RSS, from wait4)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import zlib
from pathlib import Path

import pytest

from testkit import FIXTURES

BIN = Path(sys.executable).parent
H100 = FIXTURES / "hgx-h100"
MAX_SECONDS = 5.0
MAX_RSS_MB = 200


GNU_TIME = Path("/usr/bin/time")


def run_measured(argv: list[str]) -> tuple[int, str, float, float]:
    """(exit status, stderr, seconds, peak RSS in MB) of one child process. Linux carries a
    process's peak RSS across fork and exec (the forking process's counts), so the peak is
    taken by GNU time, a small C program, when the machine has it; otherwise wait4's figure,
    which includes this test process's own size and so can only overstate."""
    timed = GNU_TIME.exists()
    cmd = [str(GNU_TIME), "-f", "%M", "--", *argv] if timed else argv
    start = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    err = proc.stderr.read().decode(errors="replace")  # type: ignore[union-attr]
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.monotonic() - start
    peak_kb = float(usage.ru_maxrss)
    if timed:  # its last line is the peak in KB
        err, _, last = err.rstrip("\n").rpartition("\n")
        err, peak_kb = err + "\n", float(last)
        status_line = [ln for ln in err.splitlines() if ln.startswith("Command exited with non-zero status")]
        err = "".join(ln + "\n" for ln in err.splitlines() if ln not in status_line)
    return os.waitstatus_to_exitcode(status), err, seconds, peak_kb / 1024


def assert_refused_cheaply(argv: list[str], words: str) -> None:
    rc, err, seconds, rss = run_measured(argv)
    assert rc == 2 and err.count("\n") == 1 and words in err, (rc, err[-2000:])
    assert seconds < MAX_SECONDS and rss < MAX_RSS_MB, f"{argv[:2]}: {seconds:.2f} s, {rss:.0f} MB"


def alias_bomb() -> bytes:
    """"Billion laughs" as a VMI: nine levels of ten aliases each, 10^9 strings once expanded."""
    lines = ["apiVersion: kubevirt.io/v1", "kind: VirtualMachineInstance", "metadata: {name: lol}",
             'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for prev, name in zip("abcdefgh", "bcdefghi"):
        lines.append(f"{name}: &{name} [" + ",".join([f"*{prev}"] * 10) + "]")
    return ("\n".join(lines) + "\n").encode()


@pytest.mark.parametrize("command", [["xmlfix", "--sysfs", str(H100), "--vmi"], ["pcitopo", "domain", "--sysfs", str(H100), "--vmi"]])
def test_a_yaml_alias_bomb_is_refused(command, tmp_path):
    bomb = tmp_path / "vmi.yaml"
    bomb.write_bytes(alias_bomb())
    assert len(alias_bomb()) < 700
    assert_refused_cheaply([str(BIN / command[0]), *command[1:], str(bomb)], "uses a YAML alias (*a)")


def test_dev_zero_as_a_cluster_dump_is_refused():
    assert_refused_cheaply([str(BIN / "pcitopo"), "preflight", "--target", "kubevirt-v1.9.0", "/dev/zero"],
                           "cluster dump /dev/zero is larger than")


@pytest.mark.parametrize("command", [["pcitopo", "preflight", "--target", "kubevirt-v1.9.0"],
                                     ["xmlfix", "--explain", "--sysfs", str(H100), str(H100 / "domain.xml"), "--cluster"]],
                         ids=["preflight", "xmlfix"])
def test_a_cluster_dump_one_byte_over_the_bound_is_refused(command, tmp_path):
    """A regular file (sparse: nothing is written) one byte larger than a dump may be."""
    from pcitopo.kubevirt.cluster import MAX_DUMP_BYTES

    big = tmp_path / "cluster.yaml"
    with open(big, "wb") as f:
        f.truncate(MAX_DUMP_BYTES + 1)
    assert_refused_cheaply([str(BIN / command[0]), *command[1:], str(big)],
                           f"cluster dump {big} is larger than {MAX_DUMP_BYTES} bytes")


@pytest.mark.parametrize("text", ["[" * 100_000 + "]" * 100_000, '{"a":' * 100_000 + "1" + "}" * 100_000],
                         ids=["yaml", "json"])
def test_deep_nesting_is_bad_input_not_an_internal_error(text, tmp_path):
    deep = tmp_path / "deep"
    deep.write_text(text)
    assert_refused_cheaply([str(BIN / "xmlfix"), "--sysfs", str(H100), "--vmi", str(deep)], "nests deeper than")
    assert_refused_cheaply([str(BIN / "pcitopo"), "preflight", "--target", "kubevirt-v1.9.0", str(deep)], "nests deeper than")


# -- capture tarballs ---------------------------------------------------------------------------

def ustar_header(name: bytes, kind: bytes, size: int = 0, link: bytes = b"") -> bytes:
    """One 512-byte ustar header, checksum included (tarfile writes the same layout)."""
    h = bytearray(512)
    h[0:len(name)] = name
    h[100:108] = b"0000755\0"
    h[108:116] = h[116:124] = b"0000000\0"
    h[124:136] = b"%011o\0" % size
    h[136:148] = b"00000000000\0"
    h[148:156] = b" " * 8
    h[156:157] = kind
    h[157:157 + len(link)] = link
    h[257:265] = b"ustar\x0000"
    h[148:156] = b"%06o\0 " % sum(h)
    return bytes(h)


def many_entries(path: Path, count: int) -> None:
    """A gzip'd tar of ``count`` distinct directories (``d/0000000/`` ...)."""
    z = zlib.compressobj(1, zlib.DEFLATED, 31)
    template = ustar_header(b"d/0000000/", b"5")
    base = sum(template) - sum(b"d/0000000/") - sum(template[148:156]) + 8 * 32
    with open(path, "wb") as f:
        batch = []
        for i in range(count):
            name = b"d/%07d/" % i
            batch.append(name + template[10:148] + b"%06o\0 " % (base + sum(name)) + template[156:])
            if len(batch) == 8192:
                f.write(z.compress(b"".join(batch)))
                batch = []
        f.write(z.compress(b"".join(batch) + b"\0" * 1024) + z.flush())


def long_names(path: Path, members: int, length: int) -> None:
    """PAX headers each carrying a ``length``-byte path and link target: one gzip member
    written ``members`` times (a gzip file may be several members back to back)."""
    records = b""
    for key, value in ((b"path", b"n/" + b"a" * length), (b"linkpath", b"b" * length)):
        body = b" %s=%s\n" % (key, value)
        size = len(body) + len(str(len(body)))
        size = len(body) + len(str(size))
        records += b"%d%s" % (size, body)
    blob = ustar_header(b"pax", b"x", len(records)) + records + b"\0" * (-len(records) % 512)
    blob += ustar_header(b"short", b"2", 0, b"t")
    member = zlib.compress(blob, 9, wbits=31)
    with open(path, "wb") as f:
        for _ in range(members):
            f.write(member)
        f.write(zlib.compress(b"\0" * 1024, 9, wbits=31))


@pytest.fixture(scope="module")
def million_entries(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tar") / "entries.tar.gz"
    many_entries(path, 1_500_000)
    return path


def test_a_capture_of_one_and_a_half_million_entries_is_refused(million_entries):
    assert 5_000_000 < million_entries.stat().st_size < 20_000_000
    assert_refused_cheaply([str(BIN / "pcitopo"), "topo", "--sysfs", str(million_entries)], "members, not a capture")


def test_a_capture_of_huge_pax_names_and_link_targets_is_refused(tmp_path):
    path = tmp_path / "names.tar.gz"
    long_names(path, 300, 4_000_000)
    assert 2_000_000 < path.stat().st_size < 4_000_000
    assert_refused_cheaply([str(BIN / "pcitopo"), "topo", "--sysfs", str(path)], "header or name of more than")


def test_names_within_path_max_still_count_against_the_tree_bound(tmp_path):
    """Names under PATH_MAX, each implying two thousand folders: the tree's path bytes are
    counted as it grows, so a few such members are refused, not 4 GB later."""
    import tarfile

    path = tmp_path / "deep.tar.gz"
    with tarfile.open(path, "w:gz", format=tarfile.PAX_FORMAT) as tar:
        for i in range(40):
            info = tarfile.TarInfo(f"{i}/" + "a/" * 2000 + "f")
            tar.addfile(info)
    assert_refused_cheaply([str(BIN / "pcitopo"), "topo", "--sysfs", str(path)], "bytes of names and link targets")


def test_the_bounds_leave_room_for_a_real_large_capture():
    """fixtures/sriov-4k (4,096 VFs, 96k members) reads as before."""
    from pcitopo.host.sources import MemoryTree
    from pcitopo.host.tarball import MAX_ENTRIES, MAX_PATH_BYTES

    tree = MemoryTree.from_tarball(FIXTURES / "sriov-4k" / "sysfs.tar.gz")
    assert 90_000 < len(tree) < MAX_ENTRIES / 2 and tree.path_bytes < MAX_PATH_BYTES / 2
