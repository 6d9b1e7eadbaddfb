"""SR-IOV VFs are shown under their PF, and pairs grow with the PFs.

Before the change, `pcitopo topo --vfs --json` on sriov-4k paired every VF with every other
device (4,116 rows, 8.5 million pairs) and did not finish in 10 minutes; these tests time out
(or find 4,116 rows) there.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pcitopo.host.sysfs import open_host
from pcitopo.model.labels import default_devices
from pcitopo.paths.classify import classify
from pcitopo.paths.vfs import group_vfs
from testkit import REPO as ROOT

BIN = Path(sys.executable).parent
SRIOV = "fixtures/sriov-4k"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "pcitopo"), *args], cwd=ROOT, capture_output=True, timeout=120)


@pytest.fixture(scope="module")
def sriov():
    return open_host(ROOT / SRIOV)


def test_vfs_grouped_under_pf_in_json():
    """20 GPU/NIC rows, 190 pairs, 4,096 VFs listed under their 8 PFs."""
    r = run("topo", "--vfs", "--json", "--sysfs", SRIOV)
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert len(data["devices"]) == 20
    assert len(data["pairs"]) == 20 * 19 // 2
    with_vfs = [d for d in data["devices"] if "vfs" in d]
    assert sorted(d["bdf"][5:7] for d in with_vfs) == ["19", "29", "3b", "5c", "9b", "aa", "bb", "da"]
    assert sum(len(d["vfs"]) for d in with_vfs) == 4096
    nic0 = next(d for d in with_vfs if d["bdf"] == "0000:19:00.0")
    assert len(nic0["vfs"]) == 769
    # a VF sits below its PF's root complex: DRA's pcieRoot of the two is the same
    assert nic0["vfs"][0] == {"bdf": "0000:19:00.1", "driver": "vfio-pci", "iommu_group": nic0["vfs"][0]["iommu_group"],
                              "pcie_root": nic0["pcie_root"]}
    assert nic0["vfs"][-1]["bdf"] == "0000:1c:00.1"
    # No VF is a row or a pair end of its own.
    bdfs = {d["bdf"] for d in data["devices"]}
    assert {p["a"] for p in data["pairs"]} | {p["b"] for p in data["pairs"]} <= bdfs


def test_vfs_grouped_under_pf_in_the_matrix():
    """The text view lists a PF's VFs on its legend line; the matrix has PF rows only."""
    r = run("topo", "--vfs", "--sysfs", SRIOV)
    assert r.returncode == 0, r.stderr
    out = r.stdout.decode()
    assert "NIC0: 0000:19:00.0  mlx5_0  Mellanox ConnectX-7, 769 VFs 0000:19:00.1-0000:1c:00.1 (vfio-pci)" in out
    assert "NIC1: 0000:29:00.0  mlx5_1  Mellanox ConnectX-7, 255 VFs 0000:29:00.1-0000:29:1f.7 (vfio-pci)" in out
    assert "NIC12" not in out  # 12 NICs (8 compute + 4 storage/management) and no VF rows
    assert len(out.splitlines()) < 100


def test_a_vf_named_without_its_pf_is_a_row_of_its_own():
    """Only a VF whose PF is also listed is folded into it."""
    r = run("topo", "--json", "--sysfs", SRIOV, "0000:19:00.1", "0000:18:00.0")
    data = json.loads(r.stdout)
    assert [d["bdf"] for d in data["devices"]] == ["0000:18:00.0", "0000:19:00.1"]
    assert "vfs" not in data["devices"][1] and data["devices"][1]["physfn"] == "0000:19:00.0"
    assert [(p["nccl"], p["nvml"]) for p in data["pairs"]] == [("PIX", "PIX")]


def test_a_vfs_class_to_any_device_is_its_pfs(sriov):
    """The fact the grouping rests on, checked on the fixture: the first and the last
    VF of every PF (including VFs spilled onto the next buses) against every other GPU/NIC."""
    groups = group_vfs(sriov, default_devices(sriov, include_vfs=True))
    assert len(groups.heads) == 20 and len(groups.vfs) == 8
    for pf, vfs in groups.vfs.items():
        for vf in (vfs[0], vfs[len(vfs) // 2], vfs[-1]):
            assert (classify(sriov, vf, pf).nccl.value, classify(sriov, vf, pf).nvml.value) == ("PIX", "PIX")
            for other in groups.heads:
                if other != pf:
                    assert classify(sriov, vf, other) == classify(sriov, pf, other), (vf, other)
            other_vf = next(v[0] for p, v in groups.vfs.items() if p != pf)
            other_pf = sriov.function(other_vf).physfn
            assert classify(sriov, vf, other_vf) == classify(sriov, pf, other_pf)
