"""ConnectX-7 functions that manage B200 NVLink switch chips are never compute NICs: recognised
by ``SW_MNG`` in their VPD, or (VPD unreadable) by a host driver bound with no RDMA or network
device on a B200 host. The sysfs trees are the synthetic builder's, plus the files a kernel
shows for these signals (``vpd``, ``infiniband/<dev>``, ``net/<ifname>``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from pcitopo.host.capture import capture
from pcitopo.host.sources import PCI_DEVICES_DIR, MemoryTree, resolve
from pcitopo.host.sysfs import SysfsReader, open_host
from pcitopo.model.labels import default_devices
from pcitopo.model.nvswitch_mgmt import management_reason, parse_vpd, vpd_says_switch_management
from pcitopo.model.tree import Bdf, Topology
from pcitopo.paths.partitions import compute_nics
from pcitopo.synth import build_tree, parse_topo
from pcitopo.views.report import tree_text

REPO = Path(__file__).resolve().parents[1]

HOST = """
numa 0 cpus=0-3
rc 0000:15 numa=0
  rp 15:01.0 preset=intel-rp
    us 16:00.0 preset=pex-gen5-oem
      ds 17:00.0
        ep 18:00.0 preset={gpu}
      ds 17:01.0
        ep 19:00.0 preset=cx7-ib driver=vfio-pci
rc 0000:80 numa=0
  rp 80:01.0 preset=intel-rp
    ep 81:00.0 preset=cx7-eth
  rp 80:02.0 preset=intel-rp
    ep 82:00.0 preset=cx7-eth
"""
MGMT, STORAGE, COMPUTE = Bdf.parse("0000:81:00.0"), Bdf.parse("0000:82:00.0"), Bdf.parse("0000:19:00.0")


def vpd_image(ro: dict[str, bytes], ident: bytes = b"NVIDIA ConnectX-7 HHHL adapter card") -> bytes:
    """A VPD image as the PCI spec lays it out: identifier string, read-only keywords (with the
    RV checksum keyword), end tag. Which keyword carries SW_MNG on real boards is not public; the
    detection looks at every field."""
    ident_res = b"\x82" + len(ident).to_bytes(2, "little") + ident
    body = b"".join(k.encode() + bytes([len(v)]) + v for k, v in ro.items()) + b"RV\x01\x00"
    return ident_res + b"\x90" + len(body).to_bytes(2, "little") + body + b"\x78"


# `lspci -vv` shows the marker as `SMDL=SW_MNG` inside a vendor-specific field of these functions'
# VPD; the rest of the field is a guess.
SW_MNG_VPD = vpd_image({"PN": b"699-2G530-0200-A0", "SN": b"MT2424X00001", "VA": b"MLX:MODL=CX7:SMDL=SW_MNG"})
PLAIN_VPD = vpd_image({"PN": b"MCX75310AAS-NEAT", "SN": b"MT2424X00002"})


def build(gpu: str = "b200", vpd: dict[Bdf, bytes] | None = None, dirs: dict[Bdf, tuple[str, ...]] | None = None) -> MemoryTree:
    tree = build_tree(parse_topo(textwrap.dedent(HOST.format(gpu=gpu)), "mgmt-host"))
    for bdf, data in (vpd or {}).items():
        tree.add_file(f"{resolve(tree, f'{PCI_DEVICES_DIR}/{bdf}')}/vpd", data)
    for bdf, names in (dirs or {STORAGE: ("net/enp130s0np0",)}).items():
        for n in names:
            tree.add_dir(f"{resolve(tree, f'{PCI_DEVICES_DIR}/{bdf}')}/{n}")
    return tree


def host(tree: MemoryTree) -> Topology:
    return Topology(SysfsReader(tree))


def test_vpd_parsing_finds_sw_mng_in_any_field():
    fields = parse_vpd(SW_MNG_VPD)
    assert [(f.section, f.keyword) for f in fields] == [("ID", ""), ("RO", "PN"), ("RO", "SN"), ("RO", "VA"), ("RO", "RV")]
    assert vpd_says_switch_management(SW_MNG_VPD) and not vpd_says_switch_management(PLAIN_VPD)
    assert vpd_says_switch_management(vpd_image({}, ident=b"ConnectX-7 SW_MNG"))
    truncated = SW_MNG_VPD[:20]
    assert parse_vpd(truncated) is None and not vpd_says_switch_management(truncated)
    assert vpd_says_switch_management(b"\x90\xff\xff" + b"V3\x06SW_MNG")  # malformed: raw bytes decide


def test_vpd_with_sw_mng_is_management_whatever_the_driver():
    h = host(build(vpd={MGMT: SW_MNG_VPD, COMPUTE: SW_MNG_VPD}))
    assert management_reason(h, h.function(MGMT)) == "VPD carries SW_MNG"
    assert management_reason(h, h.function(COMPUTE)) == "VPD carries SW_MNG"  # even on vfio-pci
    listed = default_devices(h)
    assert MGMT not in listed and COMPUTE not in listed and STORAGE in listed
    assert [f.bdf for f in compute_nics(h)] == [STORAGE]
    assert "(NVLink switch management, not a compute NIC: VPD carries SW_MNG)" in tree_text(h)


def test_without_vpd_a_host_bound_function_with_no_rdma_or_net_is_management_on_b200():
    h = host(build())
    reason = management_reason(h, h.function(MGMT))
    assert reason and "mlx5_core" in reason and "infiniband/" in reason and "B200" in reason
    assert management_reason(h, h.function(STORAGE)) is None  # net/ registered: the host uses it
    assert management_reason(h, h.function(COMPUTE)) is None  # vfio-pci: handed to VMs
    rdma = host(build(dirs={MGMT: ("infiniband/mlx5_4",), STORAGE: ("net/x",)}))
    assert management_reason(rdma, rdma.function(MGMT)) is None


def test_a_readable_vpd_without_sw_mng_wins_over_the_driver_signal():
    h = host(build(vpd={MGMT: PLAIN_VPD}))
    assert management_reason(h, h.function(MGMT)) is None


def test_the_no_rdma_signal_applies_only_where_switches_are_not_pci_devices():
    h = host(build(gpu="h100"))
    assert management_reason(h, h.function(MGMT)) is None
    assert MGMT in default_devices(h)


def test_capture_keeps_the_signals_and_the_cli_drops_management_functions(tmp_path):
    src = tmp_path / "sys"
    build(vpd={MGMT: SW_MNG_VPD}).write_dir(src)
    out = tmp_path / "host.tar.gz"
    capture(str(src), str(out))
    h = open_host(out)
    assert management_reason(h, h.function(MGMT)) == "VPD carries SW_MNG"
    assert management_reason(h, h.function(STORAGE)) is None  # net/ came along
    env = dict(os.environ, PYTHONPATH=str(REPO))
    r = subprocess.run([str(Path(sys.executable).parent / "pcitopo"), "topo", "--json", "--sysfs", str(out)],
                       capture_output=True, env=env, cwd=REPO, timeout=60)
    bdfs = [d["bdf"] for d in json.loads(r.stdout)["devices"]]
    assert str(MGMT) not in bdfs and str(STORAGE) in bdfs and str(COMPUTE) in bdfs


def test_an_unreadable_vpd_falls_back_to_the_driver_signal():
    """The sidecar runs unprivileged: the VPD file (mode 0600, root's) is unreadable there. Run
    as an unprivileged user (nobody) when the suite runs as root."""
    import tempfile

    src = Path(tempfile.mkdtemp(prefix="pcitopo-vpd-"))
    try:
        os.chmod(src, 0o755)
        build(vpd={MGMT: PLAIN_VPD}).write_dir(src / "sys")
        for p in (src / "sys").rglob("vpd"):
            os.chmod(p, 0o600)
        # Python loads as root (the interpreter lives under /root here), then drops to nobody for
        # good before reading the tree, as the sidecar reads it as uid 107.
        code = ("import os; from pcitopo.host.sysfs import open_host; from pcitopo.model.nvswitch_mgmt import management_reason\n"
                "if os.geteuid() == 0:\n    os.setgroups([]); os.setgid(65534); os.setuid(65534)\n"
                f"h = open_host({str(src / 'sys')!r}); f = h.function('{MGMT}')\n"
                "print(h.extra('vpd', f.bdf), management_reason(h, f))")
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60,
                           env=dict(os.environ, PYTHONPATH=str(REPO)))
        assert r.returncode == 0, r.stderr
        assert r.stdout.startswith("None bound to mlx5_core with no RDMA"), r.stdout
    finally:
        subprocess.run(["rm", "-rf", str(src)], check=True)
