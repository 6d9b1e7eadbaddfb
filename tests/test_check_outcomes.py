"""``xmlfix --check``'s three outcomes: ``ok`` (exit 0), ``failed`` (exit 1) and ``unknown``
(exit 4) when something it needs is missing; GPUDirect RDMA judged in the verdict; what
``pcitopo capture`` says about what it could not read; NVLink that the board table did not infer.

The hosts are the committed fixtures, or copies of them with files taken away, read through the
same capture and reader an operator uses.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from pcitopo.cli.main import pcitopo_main, xmlfix_main
from pcitopo.host.capture import is_live_sysfs
from pcitopo.host.sources import MemoryTree
from pcitopo.host.sysfs import open_host
from pcitopo.model.tree import Bdf
from pcitopo.program import EXIT_CHECK_FAILED, EXIT_OK, EXIT_UNKNOWN
from pcitopo.synth import build_tree, parse_topo
from testkit import REPO as ROOT
from testkit.kubevirt_sim import DomainSpec, kubevirt_domain

H100 = ROOT / "fixtures" / "hgx-h100"
GPUS = ("18", "2a", "3a", "5d", "9a", "ab", "ba", "db")  # GPU0-3 on node 0, GPU4-7 on node 1
NICS_NODE0 = ("19", "29", "3b", "5c")  # each the PIX NIC of one node-0 GPU
NICS_NODE1 = ("9b", "aa", "bb", "da")


def _domain(tmp_path: Path, sysfs: Path, buses: tuple[str, ...], name: str = "vm") -> str:
    host = open_host(sysfs)
    out = tmp_path / f"{name}.xml"
    out.write_bytes(kubevirt_domain(host, DomainSpec(name, tuple(Bdf.parse(f"{b}:00.0") for b in buses))))
    return str(out)


def _check(capsys, sysfs, domain: str, *extra: str) -> tuple[int, list[str]]:
    rc = xmlfix_main(["--check", "--sysfs", str(sysfs), *extra, domain])
    return rc, capsys.readouterr().err.splitlines()


def _vmi(tmp_path: Path, pairing: str) -> str:
    p = tmp_path / "vmi.json"
    # the label the pcitopo Plugin selects: a VMI no door attaches fails --check
    p.write_text(json.dumps({"metadata": {"name": "vm", "namespace": "default",  # the domain's <name>: default_vm
                                          "annotations": {"pcitopo.kubevirt.io/pairing": pairing},
                                          "labels": {"pcitopo.kubevirt.io/plugin": "true"}}}))
    return str(p)


# -- GPUDirect RDMA in the verdict ---------------------------------------------------------------

def test_a_vm_given_only_the_first_sockets_nics_fails_with_its_gdr_count(tmp_path, capsys):
    rc, err = _check(capsys, H100, _domain(tmp_path, H100, GPUS + NICS_NODE0))
    assert rc == EXIT_CHECK_FAILED
    assert err[-1].startswith("xmlfix: check: failed: NCCL: 66/66 pairs as on the host")
    assert "; GPUDirect RDMA: 4/8 GPUs have a NIC at PIX or PXB in the guest" in err[-1]
    lost = [line for line in err if line.startswith("xmlfix: check: GPUDirect RDMA: ")]
    assert [line.split()[5] for line in lost] == ["GPU4", "GPU5", "GPU6", "GPU7"]
    assert lost[0].endswith("(its nearest: host NIC0 (0000:19:00.0), SYS in the guest); "
                            "the node has host NIC6 (0000:9b:00.0) at PIX for it")
    # the pairing warnings say the same of these GPUs: said once, by the check
    assert not [line for line in err if line.startswith("xmlfix: warning: pairing: ")]


def test_the_same_vm_with_every_nic_passes_with_8_of_8(tmp_path, capsys):
    rc, err = _check(capsys, H100, _domain(tmp_path, H100, GPUS + NICS_NODE0 + NICS_NODE1))
    assert rc == EXIT_OK, err
    assert err == ["xmlfix: check: ok: NCCL: 120/120 pairs as on the host; nvidia-smi: 120/120 pairs as on the host; "
                   "GPUDirect RDMA: 8/8 GPUs have a NIC at PIX or PXB in the guest"]


def test_the_same_vm_without_nics_is_not_judged_on_gdr(tmp_path, capsys):
    rc, err = _check(capsys, H100, _domain(tmp_path, H100, GPUS))
    assert rc == EXIT_OK, err
    assert err[-1].endswith("; GPUDirect RDMA: not judged (no NIC in the VM)")


def test_pairing_off_counts_gdr_without_failing(tmp_path, capsys):
    dom = _domain(tmp_path, H100, GPUS + NICS_NODE0)
    on_main = ["--cluster", str(ROOT / "fixtures" / "clusters" / "main-pcitopo-plugin.yaml"),  # where the label starts it
               "--assume-release", "main+pr18866"]
    for extra in (["--pairing", "off"], ["--vmi", _vmi(tmp_path, "off"), *on_main]):
        rc, err = _check(capsys, H100, dom, *extra)
        assert rc == EXIT_OK, (extra, err)
        assert err[-1].startswith("xmlfix: check: ok: ") and "GPUDirect RDMA: 4/8 GPUs" in err[-1]
    # pairing: warn (the default) is a boot policy: --check still fails
    rc, _ = _check(capsys, H100, dom, "--vmi", _vmi(tmp_path, "warn"), *on_main)
    assert rc == EXIT_CHECK_FAILED


def test_a_gpu_the_node_offers_no_gdr_nic_is_named_and_not_failed(tmp_path, capsys):
    """pcie-2socket: its one NIC is PHB to GPU0 and SYS to GPU1 on the host itself."""
    sysfs = ROOT / "fixtures" / "pcie-2socket"
    rc, err = _check(capsys, sysfs, _domain(tmp_path, sysfs, ("21", "a1", "41")))
    assert rc == EXIT_OK, err
    assert ("GPUDirect RDMA: 0/2 GPUs have a NIC at PIX or PXB in the guest "
            "(2 without: the node has none for host GPU0, host GPU1)") in err[-1]


def test_dot_title_and_summary_carry_the_same_outcome(tmp_path, capsys):
    dom = _domain(tmp_path, H100, GPUS + NICS_NODE0)
    assert xmlfix_main(["--summary", "--sysfs", str(H100), dom]) == EXIT_OK
    verdict = [line for line in capsys.readouterr().out.splitlines() if line.startswith("verdict:")]
    assert verdict[0].startswith("verdict: check failed: ") and "GPUDirect RDMA: 4/8" in verdict[0]
    assert xmlfix_main(["--dot", "--pairing", "off", "--sysfs", str(H100), dom]) == EXIT_OK
    assert "\\ncheck: ok\\n" in capsys.readouterr().out


# -- unknown: what the check needs and sysfs does not give -------------------------------------

def _copy_without(tmp_path: Path, name: str, drop) -> Path:
    """The fixture as an extracted sysfs directory, minus the entries ``drop(rel)`` names."""
    d = tmp_path / name
    MemoryTree.from_tarball(H100 / "sysfs.tar.gz").write_dir(d)
    for root, dirs, files in os.walk(d):
        for n in files + dirs:
            p = Path(root) / n
            if drop(p.relative_to(d).as_posix()) and (p.is_symlink() or p.is_file()):
                p.unlink()
    shutil.rmtree(d / "pcitopo", ignore_errors=True)  # the recorded width: a directory cannot tell it
    return d


def _capture(capsys, src: Path, out: Path, *extra: str) -> list[str]:
    assert pcitopo_main(["capture", "--sysfs", str(src), "-o", str(out), *extra]) == EXIT_OK
    return capsys.readouterr().err.splitlines()


def test_a_capture_without_resource_files_is_unknown_for_mmio_not_ok(tmp_path, capsys):
    src = _copy_without(tmp_path, "nores", lambda rel: rel.endswith("/resource"))
    err = _capture(capsys, src, tmp_path / "node.tar.gz", "--phys-bits", "52")
    assert "warning: 89 PCI function(s) of 89 have no resource: their BARs cannot be sized, so xmlfix --check " \
           "says unknown for MMIO" in err
    dom = _domain(tmp_path, H100, GPUS + NICS_NODE0 + NICS_NODE1)
    rc, err = _check(capsys, tmp_path / "node.tar.gz", dom)
    assert rc == EXIT_UNKNOWN
    assert err[-1].startswith("xmlfix: check: unknown: MMIO: the BARs of 16 device(s) cannot be sized "
                              "(no resource file in sysfs: 0000:18:00.0, 0000:2a:00.0, 0000:3a:00.0, and 13 more); NCCL: 120/120")
    # --explain says it once, in the budget, not once per device
    assert xmlfix_main(["--explain", "--sysfs", str(tmp_path / "node.tar.gz"), dom]) == EXIT_OK
    out = " ".join(capsys.readouterr().out.split())
    assert "unknown: the BARs of 16 device(s) cannot be sized" in out and "no BARs in sysfs" not in out
    # a failure wins over what is unknown, which is still said
    rc, err = _check(capsys, tmp_path / "node.tar.gz", _domain(tmp_path, H100, GPUS + NICS_NODE0, "bad"))
    assert rc == EXIT_CHECK_FAILED and err[-1].startswith("xmlfix: check: failed: ")
    assert any(line.startswith("xmlfix: check: unknown: MMIO: the BARs of 12 device(s)") for line in err)


def test_a_directory_capture_records_no_width_unless_given(tmp_path, capsys, monkeypatch):
    src = _copy_without(tmp_path, "dir", lambda rel: False)
    monkeypatch.setenv("PCITOPO_CPUINFO", str(tmp_path / "cpuinfo"))  # this machine: readable, and not the node
    (tmp_path / "cpuinfo").write_text("address sizes\t: 46 bits physical, 57 bits virtual\n")
    err = _capture(capsys, src, tmp_path / "unknown.tar.gz")
    assert not any(line.startswith("recorded the host CPU's") for line in err)
    assert any("host CPU address width unknown" in line and "give --phys-bits N" in line for line in err)
    dom = _domain(tmp_path, H100, GPUS + NICS_NODE0 + NICS_NODE1)
    rc, err = _check(capsys, tmp_path / "unknown.tar.gz", dom)
    assert rc == EXIT_UNKNOWN and err[-1].startswith("xmlfix: check: unknown: MMIO: the host CPU address width is unknown")
    err = _capture(capsys, src, tmp_path / "given.tar.gz", "--phys-bits", "52")
    assert "recorded the host CPU's physical-address width: 52 bits" in err
    assert _check(capsys, tmp_path / "given.tar.gz", dom)[0] == EXIT_OK


def test_phys_bits_must_be_a_width(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        pcitopo_main(["capture", "--sysfs", str(H100), "-o", str(tmp_path / "x.tar.gz"), "--phys-bits", "300"])
    assert e.value.code == 2 and "'300' is not an address width" in capsys.readouterr().err


def test_missing_iommu_groups_and_drivers_are_one_warning_each_and_unknown(tmp_path, capsys):
    src = _copy_without(tmp_path, "links", lambda rel: rel.endswith(("/iommu_group", "/driver")))
    err = _capture(capsys, src, tmp_path / "node.tar.gz", "--phys-bits", "52")
    warned = [line for line in err if line.startswith("warning: ") and " have no " in line]
    assert sorted(line.split(" have no ")[1].split(":")[0] for line in warned) == ["driver", "iommu_group"]
    rc, err = _check(capsys, tmp_path / "node.tar.gz", _domain(tmp_path, H100, GPUS + NICS_NODE0 + NICS_NODE1))
    assert rc == EXIT_UNKNOWN
    assert "sysfs gives no IOMMU group for 16 device(s)" in err[-1] and "sysfs gives no driver for 16 device(s)" in err[-1]


def test_only_a_mounted_sysfs_is_live(tmp_path):
    assert not is_live_sysfs(str(tmp_path)) and not is_live_sysfs(str(H100))
    if not os.path.ismount("/sys"):
        pytest.skip("no sysfs mounted at /sys here")
    assert is_live_sysfs("/sys")


# -- NVLink: inferred only where the board table's conditions hold ------------------------------

def _sxm_without_nvswitches(tmp_path: Path) -> Path:
    text = "\n".join(line for line in (H100 / "host.topo").read_text().splitlines() if "preset=nvswitch" not in line)
    out = tmp_path / "sxm-no-nvswitch.tar.gz"
    tree = build_tree(parse_topo(text, "sxm-no-nvswitch"))
    tree.add_file("pcitopo/cpuinfo-address-sizes", "address sizes\t: 52 bits physical\n")
    tree.write_tarball(out)
    return out


def test_sxm_without_nvswitches_says_nvlink_source_none_and_why(tmp_path, capsys):
    sysfs = _sxm_without_nvswitches(tmp_path)
    doc = json.loads(_stdout(capsys, ["topo", "--json", "--sysfs", str(sysfs)]))
    assert doc["nvlink_source"] == "none"
    assert doc["nvlink_reason"] == ("8 SXM GPUs (HGX H100/H200 8-GPU), no NVSwitch seen: NV# not inferred; "
                                    "pass --fabric (`fmpm -l`) or --nvlink-table")
    assert not any(p["nvlink"] for p in doc["pairs"])
    text = _stdout(capsys, ["topo", "--sysfs", str(sysfs)])
    assert "NV18" not in text and "No NV#: nvlink_source none: 8 SXM GPUs" in text
    dom = _domain(tmp_path, sysfs, GPUS)
    assert xmlfix_main(["--json", "--sysfs", str(sysfs), dom]) == EXIT_OK
    pred = json.loads(capsys.readouterr().out)
    assert pred["nvlink_source"] == "none" and "no NVSwitch seen: NV# not inferred; pass --fabric" in pred["nvlink_reason"]
    assert xmlfix_main(["--explain", "--sysfs", str(sysfs), dom]) == EXIT_OK
    explained = " ".join(capsys.readouterr().out.split())
    assert "NVLink: nvlink_source none: 8 SXM GPUs (HGX H100/H200 8-GPU), no NVSwitch seen: NV# not inferred" in explained
    assert "NV# inferred" not in explained


def test_sxm_with_nvswitches_says_inferred(capsys):
    doc = json.loads(_stdout(capsys, ["topo", "--json", "--sysfs", str(H100)]))
    assert doc["nvlink_source"] == "inferred from the SXM board table"
    assert doc["nvlink_reason"] == "8 SXM GPUs (HGX H100/H200 8-GPU), NVSwitch seen"
    assert all(p["nvlink"] == 18 for p in doc["pairs"] if p["a"].endswith(":00.0") and p["nvml"] != "PIX"
               and {p["a"][5:7], p["b"][5:7]} <= set(GPUS))


def _stdout(capsys, argv: list[str]) -> str:
    assert pcitopo_main(argv) == EXIT_OK
    return capsys.readouterr().out
