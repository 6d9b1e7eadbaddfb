"""What the project writes as root on a node (the doctor's node-exporter and NFD files, their
temporary files, the hook's socket) never follows a symlink planted in those shared folders:
the file a link points to keeps its content, mode and owner."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from pcitopo.cli.main import pcitopo_main, xmlfix_main
from pcitopo.errors import ConfigError
from pcitopo.host import files
from pcitopo.host.files import TMP_SUFFIX, write_atomic
from pcitopo.serve.plugin.sockets import hand_to
from testkit import FIXTURES
from testkit.server_proc import serve_argv

VICTIM_TEXT = "root-owned file a link points to\n"
NCCL_TOPOLOGY = b"""<system version="1">
  <cpu numaid="0">
    <pci busid="0000:d5:00.0" class="0x060400" link_speed="32.0 GT/s PCIe" link_width="16">
      <pci busid="0000:d7:00.0" class="0x030200" link_speed="32.0 GT/s PCIe" link_width="16"/>
    </pci>
  </cpu>
</system>
"""


@pytest.fixture()
def victim(tmp_path):
    """A file outside the output folder that a planted symlink points to (mode 0600)."""
    d = tmp_path / "elsewhere"
    d.mkdir()
    v = d / "shadow"
    v.write_text(VICTIM_TEXT)
    v.chmod(0o600)
    return v


def untouched(v) -> bool:
    st = os.stat(v)
    return v.read_text() == VICTIM_TEXT and stat.S_IMODE(st.st_mode) == 0o600


def test_doctor_outputs_do_not_follow_symlinks_at_their_temporary_names(tmp_path, victim, capsys):
    """Links at the old fixed temporary names (``.<name>.pcitopo-tmp``) and at every name the
    writer could pick are never written through: the temporary file is made with O_EXCL."""
    out = tmp_path / "out"
    out.mkdir()
    prom, nfd = out / "pcitopo.prom", out / "pcitopo"
    for name in (f".{prom.name}.pcitopo-tmp", f".{nfd.name}.pcitopo-tmp"):
        (out / name).symlink_to(victim)
    pcitopo_main(["doctor", "--sysfs", str(FIXTURES / "hgx-b200"), "--prometheus-out", str(prom), "--nfd-out", str(nfd)])
    capsys.readouterr()
    assert untouched(victim)
    assert prom.read_text().startswith("# HELP") and not prom.is_symlink()
    assert stat.S_IMODE(prom.stat().st_mode) == 0o644
    leftovers = [p.name for p in out.iterdir() if p.name.endswith(TMP_SUFFIX) and not p.is_symlink()]
    assert leftovers == []


def test_doctor_outputs_replace_a_symlink_at_the_output_path_instead_of_following_it(tmp_path, victim, capsys):
    out = tmp_path / "out"
    out.mkdir()
    prom, nfd = out / "pcitopo.prom", out / "pcitopo"
    prom.symlink_to(victim)
    nfd.symlink_to(victim)
    pcitopo_main(["doctor", "--sysfs", str(FIXTURES / "hgx-b200"), "--prometheus-out", str(prom), "--nfd-out", str(nfd)])
    capsys.readouterr()
    assert untouched(victim)
    assert not prom.is_symlink() and not nfd.is_symlink()
    assert prom.read_text().startswith("# HELP") and "pcitopo.kubevirt.io/" in nfd.read_text()


def test_write_atomic_never_opens_an_existing_name(tmp_path, victim, monkeypatch):
    """Whatever the random name comes out as, a link already there is refused by O_EXCL, and
    the writer takes another name: planting links at the first hundred candidates does not
    make it write through any of them."""
    names = iter(f"cand{i:03d}" for i in range(1000))
    planted = []

    def planting() -> str:
        n = next(names)
        if len(planted) < 100:
            link = tmp_path / f".report.json.{n}{TMP_SUFFIX}"
            link.symlink_to(victim)
            planted.append(link)
        return n

    monkeypatch.setattr(files, "_candidate", planting)
    target = tmp_path / "report.json"
    write_atomic(str(target), "{}\n")
    assert target.read_text() == "{}\n" and untouched(victim)
    assert all(p.is_symlink() for p in planted)


def test_socket_owner_change_refuses_a_symlink(tmp_path, victim):
    link = tmp_path / "hook.sock"
    link.symlink_to(victim)
    before = os.stat(victim)
    with pytest.raises(ConfigError, match="no longer our socket"):
        hand_to(str(link), 107, 107)
    after = os.stat(victim)
    assert (after.st_uid, after.st_gid) == (before.st_uid, before.st_gid) and untouched(victim)


def test_server_refuses_a_symlink_at_its_socket_path(tmp_path, victim):
    sock = tmp_path / "hook.sock"
    sock.symlink_to(victim)
    r = subprocess.run(serve_argv(sock, str(FIXTURES / "hgx-b200")), capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "is not a socket; refusing to replace it" in r.stderr, r.stderr
    assert sock.is_symlink() and untouched(victim)


def test_guest_nccl_topology_install_does_not_follow_symlinks(tmp_path, victim):
    """In the guest, root installs NCCL's topology file at every boot: links planted at the old
    temporary name (``<dest>.tmp<pid>``) and at the file itself are not written through."""
    from pcitopo.nccl import topoxml as ncclxml

    good = NCCL_TOPOLOGY
    dest = tmp_path / "run" / "virtualTopology.xml"
    dest.parent.mkdir()
    (dest.parent / f"{dest.name}.tmp{os.getpid()}").symlink_to(victim)
    dest.symlink_to(victim)
    ncclxml.install(good, str(dest))
    assert untouched(victim) and not dest.is_symlink() and dest.read_bytes() == good


# -- every command's output goes through the one writer (src/pcitopo/host/files.py) --------------
# Each: (argv for pcitopo_main or xmlfix_main, the fixed temporary names it used before the one
# writer, what its output starts with). ``{out}`` is the output path.
H100 = FIXTURES / "hgx-h100"
COMMANDS = {
    "xmlfix -o": (["xmlfix", "--sysfs", str(H100), "-o", "{out}", str(H100 / "domain.xml")], ["{out}.xmlfix-tmp"], b"<domain"),
    "pcitopo capture -o": (["capture", "--sysfs", str(H100), "-o", "{out}"], ["{out}.tmp"], b"\x1f\x8b"),
    "pcitopo guest-tool -o": (["guest-tool", "-o", "{out}"], ["{out}.tmp{pid}"], b"#!/usr/bin/env python3"),
    "pcitopo doctor --prometheus-out": (["doctor", "--sysfs", str(H100), "--prometheus-out", "{out}"],
                                        [".{name}.pcitopo-tmp"], b"# HELP"),
    "pcitopo doctor --json-out": (["doctor", "--sysfs", str(H100), "--json-out", "{out}"], [".{name}.pcitopo-tmp"], b"{"),
}


def _run(command: str, out) -> int:
    argv = [a.format(out=out) for a in COMMANDS[command][0]]
    return xmlfix_main(argv[1:]) if argv[0] == "xmlfix" else pcitopo_main(argv)


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_no_command_writes_through_a_link_at_a_temporary_name(command, tmp_path, victim, monkeypatch, capsys):
    """Links planted at each command's old fixed temporary name and at the writer's first
    candidates are never written through; the output is whole and no temporary file is left."""
    out = tmp_path / "out" / "result"
    out.parent.mkdir()
    for name in COMMANDS[command][1]:
        (out.parent / os.path.basename(name.format(out=out, pid=os.getpid(), name=out.name))).symlink_to(victim)
    names = iter(f"cand{i}" for i in range(100))
    planted = []

    def planting() -> str:
        n = next(names)
        if len(planted) < 5:
            planted.append(out.parent / f".{out.name}.{n}{TMP_SUFFIX}")
            planted[-1].symlink_to(victim)
        return n

    monkeypatch.setattr(files, "_candidate", planting)
    assert _run(command, out) == 0, capsys.readouterr().err
    capsys.readouterr()
    assert untouched(victim) and len(planted) == 5
    assert out.read_bytes().startswith(COMMANDS[command][2]) and not out.is_symlink()
    assert [p.name for p in out.parent.iterdir() if not p.is_symlink() and p != out] == []


def _drained_fifo(path):
    """A FIFO at ``path`` with a reader collecting what is written (a writer blocks without one)."""
    os.mkfifo(path)
    got = []

    def drain():
        with open(path, "rb") as fh:
            got.append(fh.read())

    t = threading.Thread(target=drain, daemon=True)
    t.start()
    return t, got


@pytest.mark.skipif(os.geteuid() != 0, reason="making a character device node needs root")
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_character_device_stays_a_device(command, tmp_path, capsys):
    """``--prometheus-out /dev/null`` and the like: renaming over a device as root leaves the node
    without it. A character node (c 1 3, the null device) made for the test is written in place:
    still the same character device after the command."""
    node = tmp_path / "null"
    os.mknod(node, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    assert _run(command, node) == 0, capsys.readouterr().err
    st = os.lstat(node)
    assert stat.S_ISCHR(st.st_mode) and st.st_rdev == os.makedev(1, 3)
    assert [p.name for p in tmp_path.iterdir()] == ["null"]  # no temporary file left beside it


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_fifo_is_written_in_place(command, tmp_path, capsys):
    fifo = tmp_path / "pipe"
    reader, got = _drained_fifo(fifo)
    assert _run(command, fifo) == 0, capsys.readouterr().err
    reader.join(timeout=60)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and got and got[0].startswith(COMMANDS[command][2])


def test_a_block_device_a_socket_or_a_folder_is_refused_in_one_line(tmp_path, capsys):
    """What is neither a file nor a character device or FIFO is not written at all: one line,
    exit 2, the thing left as it was."""
    targets = [tmp_path / "folder"]
    targets[0].mkdir()
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(tmp_path / "sock"))
    targets.append(tmp_path / "sock")
    if os.geteuid() == 0:  # only looked at (lstat), never opened
        os.mknod(tmp_path / "blk", 0o600 | stat.S_IFBLK, os.makedev(7, 250))
        targets.append(tmp_path / "blk")
    try:
        for target in targets:
            before = os.lstat(target)
            assert pcitopo_main(["doctor", "--sysfs", str(H100), "--prometheus-out", str(target)]) == 2
            err = capsys.readouterr().err
            assert err.count("\n") == 1 and f"cannot write {target}: it is a" in err, err
            after = os.lstat(target)
            assert (after.st_mode, after.st_ino) == (before.st_mode, before.st_ino)
    finally:
        sock.close()


def test_a_descriptor_name_is_the_descriptor_and_dash_is_standard_output(tmp_path, capsys):
    """``/dev/fd/N`` (like ``/dev/stdout``) names a descriptor this process holds: written there,
    the link itself left alone; ``-o -`` is standard output."""
    r, w = os.pipe()
    try:
        write_atomic(f"/dev/fd/{w}", "through the descriptor\n")
        write_atomic(f"/proc/self/fd/{w}", b"twice\n")
        os.close(w)
        with os.fdopen(r, "rb") as fh:
            assert fh.read() == b"through the descriptor\ntwice\n"
    finally:
        for fd in (r, w):
            try:
                os.close(fd)
            except OSError:
                pass
    assert pcitopo_main(["doctor", "--sysfs", str(H100), "--json-out", "-"]) == 0
    assert capsys.readouterr().out.lstrip().startswith("{")
    assert not (Path.cwd() / "-").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="the socket is handed to the compute container's uid only as root")
def test_server_as_root_hands_its_own_socket_to_the_compute_uid(tmp_path):
    from testkit.server_proc import ServerProcess

    sock = tmp_path / "hook.sock"
    srv = ServerProcess(serve_argv(sock, str(FIXTURES / "hgx-b200")), tmp_path / "server.log", socket=sock)
    try:
        srv.wait_for_socket()
        st = os.lstat(sock)
        assert stat.S_ISSOCK(st.st_mode) and (st.st_uid, st.st_gid) == (107, 107)
    finally:
        srv.stop()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__]))
