"""What the project writes as root on a node (the doctor's node-exporter and NFD files, their
temporary files, the hook's socket) never follows a symlink planted in those shared folders:
the file a link points to keeps its content, mode and owner."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

import pytest

from pcitopo.sidecar.cli import pcitopo_main
from pcitopo.sidecar.plugin.sockets import hand_to
from pcitopo.topology.checks.fleet import TMP_SUFFIX, write_atomic
from pcitopo.topology.errors import ConfigError
from testkit import FIXTURES
from testkit.hookkit import serve_argv

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
    import tempfile

    names = iter(f"cand{i:03d}" for i in range(1000))
    planted = []

    class Planting:
        def __next__(self):
            n = next(names)
            if len(planted) < 100:
                link = tmp_path / f".report.json.{n}{TMP_SUFFIX}"
                link.symlink_to(victim)
                planted.append(link)
            return n

    monkeypatch.setattr(tempfile, "_get_candidate_names", lambda: Planting())
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
    from pcitopo.topology.paths import ncclxml

    good = NCCL_TOPOLOGY
    dest = tmp_path / "run" / "virtualTopology.xml"
    dest.parent.mkdir()
    (dest.parent / f"{dest.name}.tmp{os.getpid()}").symlink_to(victim)
    dest.symlink_to(victim)
    ncclxml.install(good, str(dest))
    assert untouched(victim) and not dest.is_symlink() and dest.read_bytes() == good


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
