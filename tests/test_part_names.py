"""The names `pcitopo topo` prints in its legend and `--tree` for the NVIDIA (Mellanox) NICs and
DPUs of GPU nodes: one table (src/pcitopo/host/names.py), checked against the PCI ID Repository's
pci.ids, and the NVLink switch-management functions named for their role."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pcitopo.host.names import KNOWN_PARTS
from pcitopo.host.sources import PCI_DEVICES_DIR, resolve
from pcitopo.synth import build_tree, parse_topo

PCI_IDS = Path("/usr/share/misc/pci.ids")  # Debian's pci.ids package (pciutils depends on it)
# Named after rdma-core's rdma_topo, where pci.ids names them by family ("mlx5Gen PCIe Bridge") or
# lacks them (docs/SOURCES.md, "the fixture hosts").
NAMED_BY_RDMA_TOPO = {"15b3:1979", "15b3:197c", "15b3:2100"}
# The NICs and DPUs a GPU node carries: ConnectX-5 and -5 Ex, 6, 6 Dx, 6 Lx, 7, 8, BlueField-2 and -3.
GPU_NODE_NICS = {"15b3:1017": "ConnectX-5", "15b3:1019": "ConnectX-5 Ex", "15b3:101b": "ConnectX-6",
                 "15b3:101d": "ConnectX-6 Dx", "15b3:101f": "ConnectX-6 Lx", "15b3:1021": "ConnectX-7",
                 "15b3:1023": "ConnectX-8", "15b3:a2d6": "BlueField-2", "15b3:a2dc": "BlueField-3"}


def pci_ids_devices(vendor: str) -> dict[str, str]:
    """device id -> name of one vendor in pci.ids (tab-indented device lines under the vendor)."""
    out: dict[str, str] = {}
    inside = False
    for line in PCI_IDS.read_text(encoding="utf-8", errors="replace").splitlines():
        if re.match(r"^[0-9a-f]{4}  ", line):
            inside = line.startswith(vendor + "  ")
        elif inside and (m := re.match(r"^\t([0-9a-f]{4})  (.*)$", line)):
            out[m.group(1)] = m.group(2)
    return out


@pytest.mark.skipif(not PCI_IDS.exists(), reason="pci.ids not installed (make test installs pciutils, which brings it)")
def test_the_nvidia_networking_names_are_the_ones_pci_ids_gives():
    devices = pci_ids_devices("15b3")
    checked = 0
    for ids, name in KNOWN_PARTS.items():
        vendor, device = ids.split(":")
        if vendor != "15b3" or ids in NAMED_BY_RDMA_TOPO:
            continue
        assert device in devices, f"{ids} is not in pci.ids"
        assert name.removeprefix("Mellanox ") in devices[device], (ids, name, devices[device])
        checked += 1
    assert checked >= len(GPU_NODE_NICS)


def test_every_nic_and_dpu_of_a_gpu_node_has_its_name():
    for ids, model in GPU_NODE_NICS.items():
        assert KNOWN_PARTS.get(ids) == f"Mellanox {model}", ids


HOST = """
numa 0 cpus=0-3
rc 0000:15 numa=0
  rp 15:01.0 preset=intel-rp
    us 16:00.0 preset=pex-gen5-oem
      ds 17:00.0
        ep 18:00.0 preset={gpu}
      ds 17:01.0
        ep 19:00.0 preset=cx6-dx ids=15b3:101b driver=vfio-pci
rc 0000:80 numa=0
  rp 80:01.0 preset=intel-rp
    ep 81:00.0 preset=cx7-eth
  rp 80:02.0 preset=intel-rp
    ep 82:00.0 preset=cx7-eth
"""
# `lspci -vv` shows SMDL=SW_MNG in a vendor-specific VPD field of these functions; the other
# bytes of this image are made up (the read-only section: VA keyword, then RV, then the end tag)
SW_MNG_VPD = b"\x90\x1f\x00VA\x18MLX:MODL=CX7:SMDL=SW_MNGRV\x01\x00\x78"


def host_dir(tmp_path: Path, gpu: str) -> Path:
    tree = build_tree(parse_topo(textwrap.dedent(HOST.format(gpu=gpu)), "names-host"))
    tree.add_file(f"{resolve(tree, f'{PCI_DEVICES_DIR}/0000:81:00.0')}/vpd", SW_MNG_VPD)
    tree.add_dir(f"{resolve(tree, f'{PCI_DEVICES_DIR}/0000:82:00.0')}/net/enp130s0np0")
    out = tmp_path / gpu
    tree.write_dir(out)
    return out


def topo(*args: str) -> str:
    r = subprocess.run([str(Path(sys.executable).parent / "pcitopo"), "topo", *args], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_a_connectx6_is_named_in_the_tree_and_the_legend(tmp_path):
    sysfs = str(host_dir(tmp_path, "b200"))
    assert re.search(r"NIC0: 0000:19:00\.0  (mlx5_\d+  )?Mellanox ConnectX-6$", topo("--sysfs", sysfs), re.M)
    assert "0000:19:00.0 [15b3:101b] nic Mellanox ConnectX-6 <NIC0>" in topo("--sysfs", sysfs, "--tree")


@pytest.mark.parametrize("gpu", ["b200", "b300"])
def test_a_switch_management_function_is_named_for_its_role_in_the_legend(tmp_path, gpu):
    sysfs = str(host_dir(tmp_path, gpu))
    legend = topo("--sysfs", sysfs, "0000:81:00.0", "0000:82:00.0")
    assert re.search(r"0000:81:00\.0  (mlx5_\d+  )?Mellanox ConnectX-7 \(NVLink switch management, not a compute NIC\)$", legend, re.M)
    assert re.search(r"0000:82:00\.0  (mlx5_\d+  )?Mellanox ConnectX-7$", legend, re.M)
    tree = topo("--sysfs", sysfs, "--tree")
    assert "[15b3:1021] nic Mellanox ConnectX-7 (NVLink switch management, not a compute NIC: VPD carries SW_MNG)" in tree
