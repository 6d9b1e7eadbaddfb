"""GPU-NIC pairs: ``pcie_root`` as Kubernetes computes it, ``pcitopo pairs``, the
pairing check at boot (``pcitopo.kubevirt.io/pairing``) and the doctor's per-node count.

The one classifier judges every pair; these tests hold ``pcitopo pairs`` to what ``pcitopo topo``
says about the same host, and compute ``pcieRoot`` the way Kubernetes does (reading the
``bus/pci/devices`` symlink of an unpacked sysfs tree), not with our reader.
"""

from __future__ import annotations

import json
import os
import tarfile
from pathlib import Path

import pytest

from pcitopo.cli.main import pcitopo_main, xmlfix_main
from pcitopo.errors import PairingError
from pcitopo.host.sysfs import SysfsReader, open_host
from pcitopo.model.tree import Bdf, Topology
from pcitopo.paths.pairing import check_vm_pairs, host_pairs
from pcitopo.serve.core import handle_define_domain
from pcitopo.synth import build_tree, host_from_topo, parse_topo
from testkit import REPO as ROOT
from testkit.kubevirt_sim import DomainSpec, kubevirt_domain

FIXTURES = ROOT / "fixtures"
HOSTS = sorted(p.parent.name for p in FIXTURES.glob("*/host.topo"))
AMD = ROOT / "tests" / "data" / "amd-shared-root.topo"
HOSTILE_TOPOS = sorted((ROOT / "tests" / "hostile" / "hosts").glob("*.topo"))
NCCL_ORDER = ["PIX", "PXB", "PHB", "SYS"]
NVML_ORDER = ["PIX", "PXB", "PHB", "NODE", "SYS"]


def _amd_dir(tmp_path: Path) -> Path:
    """The AMD-style test host as a sysfs tarball (what ``--sysfs`` reads)."""
    out = tmp_path / "amd.tar.gz"
    if not out.exists():
        build_tree(parse_topo(AMD.read_text(), AMD.name)).write_tarball(out)
    return out


def _sources(tmp_path: Path) -> list[tuple[str, Path]]:
    out = [(h, FIXTURES / h) for h in HOSTS]
    out.append(("amd-shared-root", _amd_dir(tmp_path)))
    for t in HOSTILE_TOPOS:
        tar = tmp_path / f"{t.stem}.tar.gz"
        build_tree(parse_topo(t.read_text(), t.name)).write_tarball(tar)
        out.append((f"hostile/{t.stem}", tar))
    return out


def _json(capsys, argv: list[str]) -> dict:
    assert pcitopo_main(argv) == 0
    return json.loads(capsys.readouterr().out)


# -- pcie_root -------------------------------------------------------------------------------------

def _kubernetes_pcie_root(sys_root: Path, bdf: str) -> str:
    """k8s.io/dynamic-resource-allocation deviceattribute: readlink bus/pci/devices/<bdf>,
    resolve it relative to that directory, require devices/pci..., take the first component
    below devices/."""
    link = sys_root / "bus" / "pci" / "devices" / bdf
    target = os.path.normpath(os.path.join(link.parent, os.readlink(link)))
    devices = os.path.join(sys_root, "devices")
    assert target.startswith(os.path.join(devices, "pci")) and os.path.basename(target) == bdf
    return os.path.relpath(target, devices).split(os.sep)[0]


@pytest.mark.parametrize("name", ["hgx-b300", "hgx-b200", "pcie-2socket"])
def test_topo_json_gives_each_device_its_kubernetes_pcie_root(name, tmp_path, capsys):
    with tarfile.open(FIXTURES / name / "sysfs.tar.gz") as tar:
        tar.extractall(tmp_path, filter="tar")
    sys_root = next(p.parent for p in tmp_path.rglob("bus") if (p / "pci" / "devices").is_dir())
    doc = _json(capsys, ["topo", "--json", "--vfs", "--sysfs", str(FIXTURES / name)])
    devices = doc["devices"] + [v for d in doc["devices"] for v in d.get("vfs", [])]
    assert devices
    for d in devices:
        assert d["pcie_root"] == _kubernetes_pcie_root(sys_root, d["bdf"]), d["bdf"]


# -- pcitopo pairs agrees with pcitopo topo ------------------------------------------------------

def test_pairs_agrees_with_topo_on_every_fixture_and_test_host(tmp_path, capsys):
    checked = 0
    for name, src in _sources(tmp_path):
        topo = _json(capsys, ["topo", "--json", "--sysfs", str(src)])
        pairs = _json(capsys, ["pairs", "--json", "--sysfs", str(src)])
        kind = {d["bdf"]: d["kind"] for d in topo["devices"]}
        root = {d["bdf"]: d["pcie_root"] for d in topo["devices"]}
        cls = {}
        for p in topo["pairs"]:
            cls[p["a"], p["b"]] = cls[p["b"], p["a"]] = (p["nccl"], p["nvml"])
        gpus = [b for b, k in kind.items() if k == "gpu"]
        nics = [b for b, k in kind.items() if k == "nic"]
        assert [g["gpu"] for g in pairs["gpus"]] == gpus, name
        for g in pairs["gpus"]:
            gpu = g["gpu"]
            assert g["pcie_root"] == root[gpu]
            if not nics:
                assert g["nic"] is None
                continue
            key = lambda n: (NCCL_ORDER.index(cls[gpu, n][0]), NVML_ORDER.index(cls[gpu, n][1]), n)  # noqa: E731
            best = min(nics, key=key)
            assert (g["nic"], g["nccl"], g["nvml"]) == (best, *cls[gpu, best]), (name, gpu)
            gdr = cls[gpu, best][0] in ("PIX", "PXB")
            assert g["gdr"] == gdr
            same = [n for n in nics if root[n] == root[gpu]]
            assert [s["nic"] for s in g["same_pcie_root_nics"]] == same
            enough = bool(same) and all(cls[gpu, n][0] == cls[gpu, best][0] for n in same)
            assert g["pcie_root_enough"] == enough, (name, gpu)
            checked += 1
        assert pairs["pcie_root_enough"] == all(g["pcie_root_enough"] for g in pairs["gpus"])
    assert checked > 60


@pytest.mark.parametrize("name", ["hgx-h100", "hgx-h200-snc2", "hgx-b200", "hgx-b300", "dgx-h100"])
def test_pcie_root_is_enough_on_hosts_with_a_root_complex_per_switch(name, capsys):
    doc = _json(capsys, ["pairs", "--json", "--sysfs", str(FIXTURES / name)])
    assert doc["pcie_root_enough"] is True and doc["pcie_root_not_enough_for"] == []


def test_pcie_root_is_not_enough_where_a_root_complex_carries_two_switches(tmp_path, capsys):
    src = str(_amd_dir(tmp_path))
    doc = _json(capsys, ["pairs", "--json", "--sysfs", src])
    assert doc["pcie_root_enough"] is False
    assert doc["pcie_root_not_enough_for"] == ["GPU0", "GPU1", "GPU3"]
    by_label = {g["label"]: g for g in doc["gpus"]}
    assert by_label["GPU2"]["pcie_root_enough"] and by_label["GPU2"]["nccl"] == "PIX"
    # nothing to pair, and alone on its root complex: a pcieRoot claim never allocates it a NIC
    assert by_label["GPU3"]["gdr"] is False and not by_label["GPU3"]["pcie_root_enough"]
    assert pcitopo_main(["pairs", "--sysfs", src]) == 0
    text = capsys.readouterr().out
    assert "not enough on this host for 2 GPU(s): GPU0, GPU1" in text
    assert "can never be satisfied for 1 GPU(s): GPU3" in text
    assert "no: also NIC1 PHB" in text



def test_pcie_root_enough_only_where_a_claim_can_be_satisfied(capsys):
    """On pcie-2socket no GPU shares a pcieRoot with a NIC, so a claim
    matching GPU and NIC on pcieRoot never allocates there: not "enough", for either GPU."""
    src = str(FIXTURES / "pcie-2socket")
    doc = _json(capsys, ["pairs", "--json", "--sysfs", src])
    assert all(g["same_pcie_root_nics"] == [] for g in doc["gpus"]) and len(doc["gpus"]) == 2
    assert doc["pcie_root_enough"] is False
    assert doc["pcie_root_not_enough_for"] == ["GPU0", "GPU1"]
    assert [g["pcie_root_enough"] for g in doc["gpus"]] == [False, False]
    assert pcitopo_main(["pairs", "--sysfs", src]) == 0
    text = capsys.readouterr().out
    assert "is enough" not in text
    assert "can never be satisfied for 2 GPU(s): GPU0, GPU1" in text
    assert text.count("no: no NIC on its pcieRoot") == 2
    assert "none at PXB or closer" in text  # and they lose nothing by it: no NIC is at PXB or closer


def test_b300_pairs_are_pxb_and_named(capsys):
    assert pcitopo_main(["pairs", "--sysfs", str(FIXTURES / "hgx-b300")]) == 0
    text = capsys.readouterr().out
    assert text.count(" PXB   PXB ") == 8
    assert "GPU0  0000:1a:00.0  pci0000:14  NIC0      0000:17:00.0" in text
    assert "gives every GPU a NIC of its best class on this host" in text


# -- the VM's allocation -----------------------------------------------------------------------------

def _host(name: str) -> Topology:
    return open_host(FIXTURES / name)


def test_a_gpu_given_a_nic_from_another_switch_is_named_with_the_better_nic():
    host = _host("hgx-b300")
    v = check_vm_pairs(host, [Bdf.parse("1a:00.0"), Bdf.parse("39:00.0")])
    assert v.status == "worse" and len(v.findings) == 1
    assert v.lines == ["host GPU0 (0000:1a:00.0) got host NIC1 (0000:39:00.0) at PHB (nvidia-smi NODE); "
                       "host NIC0 (0000:17:00.0) would be PXB"]


@pytest.mark.parametrize("name", ["hgx-b300", "hgx-h100", "dgx-h100", "hgx-b200"])
def test_matched_pairs_are_never_warned(name):
    host = _host(name)
    hp = host_pairs(host)
    for p in hp.pairs:
        assert check_vm_pairs(host, [p.best.gpu.bdf, p.best.nic.bdf]).status == "ok"
    everything = [p.best.gpu.bdf for p in hp.pairs] + [p.best.nic.bdf for p in hp.pairs]
    assert check_vm_pairs(host, everything).status == "ok"


def test_no_nics_and_nothing_to_pair_are_never_warned(tmp_path):
    host = _host("hgx-b300")
    assert check_vm_pairs(host, [Bdf.parse("1a:00.0")]).status == "no-nics"
    # pcie-2socket: its GPUs have no NIC closer than PHB
    flat = _host("pcie-2socket")
    hp = host_pairs(flat)
    assert hp.pairs and not any(p.best.gdr for p in hp.pairs)
    nics = [b for b in (p.best.nic.bdf for p in hp.pairs)]
    for p in hp.pairs:
        assert check_vm_pairs(flat, [p.best.gpu.bdf] + nics).status == "ok"


def test_the_broadcom_neighbour_nic_is_not_worse_in_nccl_view():
    """hgx-b200: NCCL flattens the two-level complex, so GPU0 is PIX to both NICs of it;
    nvidia-smi says PXB to the neighbour's. GPUDirect RDMA is the same: no warning."""
    host = _host("hgx-b200")
    assert check_vm_pairs(host, [Bdf.parse("1a:00.0"), Bdf.parse("1f:00.0")]).status == "ok"


def test_the_amd_host_warns_the_other_switch_nic(tmp_path):
    host = host_from_topo(AMD.read_text())
    v = check_vm_pairs(host, [Bdf.parse("03:00.0"), Bdf.parse("08:00.0")])
    assert v.lines == ["host GPU0 (0000:03:00.0) got host NIC1 (0000:08:00.0) at PHB; host NIC0 (0000:04:00.0) would be PIX"]


# -- the hook and xmlfix ----------------------------------------------------------------------------

def _vmi(policy: str | None) -> bytes:
    ann = {"pcitopo.kubevirt.io/pairing": policy} if policy else {}
    return json.dumps({"metadata": {"name": "vm", "namespace": "ml", "annotations": ann}}).encode()


def _domain(host: Topology, *bdfs: str) -> bytes:
    return kubevirt_domain(host, DomainSpec("pairs", tuple(Bdf.parse(b) for b in bdfs)))


def test_the_hook_warns_by_default_and_boots():
    host = _host("hgx-b300")
    out = handle_define_domain(_domain(host, "1a:00.0", "39:00.0"), _vmi(None), host)
    assert out.outcome == "rewritten"
    assert out.summary["pairing"] == "worse"
    assert out.summary["pairing_findings"][0].startswith("host GPU0 (0000:1a:00.0) got host NIC1 (0000:39:00.0)")
    assert any(n.startswith("pairing: host GPU0 (0000:1a:00.0) got host NIC1") for n in out.result.report.notes)


def test_the_hook_refuses_under_require_whatever_on_error_says():
    host = _host("hgx-b300")
    for on_error in ("fail", "passthrough"):
        vmi = json.dumps({"metadata": {"annotations": {"pcitopo.kubevirt.io/pairing": "require",
                                                       "pcitopo.kubevirt.io/on-error": on_error}}}).encode()
        with pytest.raises(PairingError) as e:
            handle_define_domain(_domain(host, "1a:00.0", "39:00.0"), vmi, host)
        assert "host NIC0 (0000:17:00.0) would be PXB" in e.value.reason
        assert "pcitopo.kubevirt.io/pairing is require" in e.value.reason


def test_the_hook_is_quiet_for_matched_pairs_and_off():
    host = _host("hgx-b300")
    ok = handle_define_domain(_domain(host, "1a:00.0", "17:00.0"), _vmi("require"), host)
    assert ok.summary["pairing"] == "ok" and "pairing_findings" not in ok.summary
    off = handle_define_domain(_domain(host, "1a:00.0", "39:00.0"), _vmi("off"), host)
    assert "pairing" not in off.summary


def _xmlfix(tmp_path: Path, capsys, policy: str | None, *args: str) -> tuple[int, str, str]:
    host = _host("hgx-b300")
    dom = tmp_path / "d.xml"
    dom.write_bytes(_domain(host, "1a:00.0", "39:00.0"))
    argv = ["--sysfs", str(FIXTURES / "hgx-b300"), *args, str(dom)]
    if policy:
        vmi = tmp_path / "vmi.json"
        vmi.write_bytes(_vmi(policy))
        argv = ["--vmi", str(vmi), *argv]
    rc = xmlfix_main(argv)
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def test_xmlfix_check_fails_a_gpu_without_gdr_under_warn_and_passes_under_pairing_off(tmp_path, capsys):
    """``pairing: warn`` boots the VM; ``--check`` asks whether the VM is what the user wants: a
    GPU without GPUDirect RDMA where the node has it is not. ``--pairing off`` keeps the warning."""
    rc, _, err = _xmlfix(tmp_path, capsys, None, "--check")
    assert rc == 1
    assert ("xmlfix: check: GPUDirect RDMA: host GPU0 (0000:1a:00.0) has no NIC at PIX or PXB in the guest (its nearest: "
            "host NIC1 (0000:39:00.0), PHB in the guest); the node has host NIC0 (0000:17:00.0) at PXB for it") in err.splitlines()
    assert "xmlfix: check: failed: " in err and "GPUDirect RDMA: 0/1 GPUs have a NIC at PIX or PXB in the guest" in err
    rc, _, err = _xmlfix(tmp_path, capsys, None, "--check", "--pairing", "off")
    assert rc == 0
    assert ("xmlfix: warning: pairing: host GPU0 (0000:1a:00.0) got host NIC1 (0000:39:00.0) at PHB (nvidia-smi NODE); "
            "host NIC0 (0000:17:00.0) would be PXB") in err.splitlines()
    assert "xmlfix: check: ok: " in err and "pairing: 1 GPU(s) given a worse NIC than the host offers" in err


def test_xmlfix_fails_under_require(tmp_path, capsys):
    rc, out, err = _xmlfix(tmp_path, capsys, "require", "--check")
    assert rc == 2 and out == ""
    (line,) = err.splitlines()
    assert "host GPU0 (0000:1a:00.0) got host NIC1" in line and "would be PXB" in line


def test_xmlfix_explain_and_json_carry_the_verdict(tmp_path, capsys):
    rc, out, _ = _xmlfix(tmp_path, capsys, None, "--explain")
    assert rc == 0
    out = out.replace("\n    ", " ")  # --explain folds its lines at 100 columns
    first = out.splitlines()[0]
    assert first.startswith("Verdict: ") and first.endswith("; pairing: 1 GPU(s) given a worse NIC than the host offers (host GPU0)")
    assert "note: pairing: host GPU0 (0000:1a:00.0) got host NIC1" in out
    rc, out, _ = _xmlfix(tmp_path, capsys, None, "--json")
    doc = json.loads(out)
    assert doc["pairing"]["status"] == "worse" and doc["pairing"]["policy"] == "warn"
    assert doc["pairing"]["findings"][0].startswith("host GPU0 (0000:1a:00.0) got host NIC1")


# -- the doctor's count per node ----------------------------------------------------------------------

def test_the_doctor_exports_the_gpus_pcie_root_does_not_serve(tmp_path):
    from prometheus_client.parser import text_string_to_metric_families

    # pcie-2socket: no GPU has a NIC at PXB or closer, so pcieRoot alignment loses none of them one
    for src, want in ((str(FIXTURES / "hgx-b300"), 0), (str(_amd_dir(tmp_path)), 2), (str(FIXTURES / "pcie-2socket"), 0)):
        prom = tmp_path / "p.prom"
        assert pcitopo_main(["doctor", "--sysfs", src, "--prometheus-out", str(prom)]) in (0, 1)
        fam = {f.name: f for f in text_string_to_metric_families(prom.read_text())}
        (sample,) = fam["pcitopo_gpus_pcieroot_not_enough"].samples
        assert sample.value == want, src


# -- names and the doctor on the ConnectX-8 switch ------------------------------------------------------

def test_b300_and_connectx8_are_named(capsys):
    assert pcitopo_main(["topo", "--sysfs", str(FIXTURES / "hgx-b300")]) == 0
    text = capsys.readouterr().out
    assert "GPU0: 0000:1a:00.0  NVIDIA B300" in text and "NIC0: 0000:17:00.0  Mellanox ConnectX-8" in text
    assert "NV18" in text
    assert pcitopo_main(["topo", "--tree", "--sysfs", str(FIXTURES / "hgx-b300")]) == 0
    tree = capsys.readouterr().out
    assert "[15b3:197c] upstream-port (ConnectX integrated switch) Mellanox ConnectX-8 PCIe switch port" in tree
    assert "[15b3:2100] other Mellanox ConnectX-8 Data Direct" in tree


def _b300_with(fault_line: str, fault: str) -> Topology:
    text = (FIXTURES / "hgx-b300" / "host.topo").read_text()
    assert text.count(fault_line) == 1
    return Topology(SysfsReader(build_tree(parse_topo(text.replace(fault_line, f"{fault_line} fault={fault}"), "b300"))))


def test_the_doctor_checks_the_connectx8_switch_ports_and_nic_as_rdma_topo_does():
    from pcitopo.checks.doctor import run_checks

    clean = run_checks(_host("hgx-b300"))
    acs = {f.bdf: f for f in clean.findings if f.check == "acs"}
    # NIC0's downstream port, GPU0's two downstream ports and both CX-8 upstream ports are checked
    for bdf in ("0000:16:00.0", "0000:16:01.0", "0000:19:00.0", "0000:14:01.0"):
        assert acs[bdf].status == "ok", acs.get(bdf)
    assert "Direct Translated" not in acs["0000:16:00.0"].message
    ats = {f.bdf: f for f in clean.findings if f.check == "ats"}
    assert len(ats) == 8 and all(f.status == "ok" for f in ats.values())
    groups = {f.bdf: f for f in clean.findings if f.check == "iommu-group"}
    assert groups["0000:17:00.0"].status == groups["0000:1a:00.0"].status == "ok"  # NIC and GPU apart

    bad = run_checks(_b300_with("      ds 16:00.0", "acs-dt-off"))
    (f,) = [f for f in bad.failed if f.check == "acs"]
    assert f.bdf == "0000:16:00.0" and "Direct Translated P2P off" in f.message and "NIC0" in f.label
    bad = run_checks(_b300_with("        ep 17:00.0 preset=cx8-ib driver=vfio-pci", "no-ats"))
    (f,) = [f for f in bad.failed if f.check == "ats"]
    assert f.bdf == "0000:17:00.0" and "ATS_ENABLED" in (f.fix or "")
