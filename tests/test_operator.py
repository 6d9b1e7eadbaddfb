"""Issue 14, "The operator's day": the doors as an operator meets them. Each test names the
finding it covers (f1 ... f12); every one runs the installed console scripts on fixtures."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from lxml import etree

from conftest import ROOT

BIN = Path(sys.executable).parent
H100 = ROOT / "fixtures" / "hgx-h100"


def run(cmd: str, *args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / cmd), *args], cwd=ROOT, input=stdin, capture_output=True, timeout=120)


def edited(src: Path, dest: Path, edit) -> Path:
    """A copy of a fixture domain with ``edit(tree)`` applied (lxml, no string surgery)."""
    tree = etree.parse(str(src))
    edit(tree)
    tree.write(str(dest), encoding="utf-8")
    return dest


# -- finding 1: --diff shows only what changed in meaning ---------------------------------------

def test_f1_diff_shows_only_meaningful_changes(tmp_path):
    """Finding 1: the diff of hgx-h100 was 605 changed lines, 154 of them removals that only
    re-serialised (``<x></x>`` → ``<x/>``). Now the only removals are the 20 hostdev source
    addresses that lose ``type='pci'``, and the diff applied to the input gives the output."""
    r = run("xmlfix", "--diff", "--sysfs", str(H100), str(H100 / "domain.xml"))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.decode().splitlines()
    removed = [x for x in lines if x.startswith("-") and not x.startswith("---")]
    assert len(removed) == 20, removed[:5]
    assert all('<address type="pci" domain="0x0000"' in x for x in removed)
    assert not any("></" in x for x in lines if x[:1] in "+-")
    # The diff is exact: applying it to the (re-serialised) input gives xmlfix's output.
    from topology.domain import parse_domain, serialize

    src = (H100 / "domain.xml").read_bytes()
    base = tmp_path / "base.xml"
    base.write_bytes(serialize(parse_domain(src), src))
    patch = subprocess.run(["patch", "-s", str(base)], input=r.stdout, capture_output=True)
    assert patch.returncode == 0, patch.stderr
    assert base.read_bytes() == (H100 / "expected.xml").read_bytes()
    # Nothing to change: nothing printed.
    assert run("xmlfix", "--diff", "--sysfs", str(H100), str(H100 / "expected.xml")).stdout == b""


# -- finding 2: --check means "the guest will see what the host has" --------------------------

def _drop_hostdevs(tree):
    devices = tree.find("devices")
    for hd in devices.findall("hostdev"):
        devices.remove(hd)


def test_f2_check_passes_without_hostdevs(tmp_path):
    """Finding 2: a domain with no hostdevs only gains a pcie-root; the guest sees what the host
    gives it (nothing), so --check passes."""
    d = edited(H100 / "domain.xml", tmp_path / "none.xml", _drop_hostdevs)
    r = run("xmlfix", "--check", "--sysfs", str(H100), str(d))
    assert r.returncode == 0, r.stderr
    assert b"no PCI hostdevs" in r.stderr


def _one_cell(tree):
    """kubevirt-numa with only guest cell 0 (backed by host node 0); host node 1's devices stay."""
    numa = tree.find("cpu/numa")
    numa.remove(numa.find("cell[@id='1']"))
    numa.find("cell[@id='0']").set("cpus", "0-7")
    tune = tree.find("numatune")
    tune.remove(tune.find("memnode[@cellid='1']"))


def test_f2_check_fails_when_a_host_node_has_no_guest_cell(tmp_path):
    """Finding 2: one guest cell leaves host node 1's devices without a cell: --check fails and
    names them; --explain no longer claims everything equals the host."""
    d = edited(H100 / "cases" / "kubevirt-numa" / "domain.xml", tmp_path / "one-cell.xml", _one_cell)
    r = run("xmlfix", "--check", "--sysfs", str(H100), str(d))
    assert r.returncode == 1
    err = r.stderr.decode()
    assert "10 device(s) of host NUMA node 1" in err and "no guest cell" in err and "check: failed" in err
    out = run("xmlfix", "--explain", "--sysfs", str(H100), str(d)).stdout.decode()
    assert "Every pair" not in out and "equals the host" not in out
    assert "NUMA: 10 device(s) of host node 1 have no guest cell" in out


def _passthrough_vmi(tmp_path) -> Path:
    vmi = tmp_path / "vmi.json"
    vmi.write_text(json.dumps({"metadata": {"name": "vm", "namespace": "ns",
                                            "annotations": {"pcitopo.kubevirt.io/on-error": "passthrough"}}}))
    return vmi


def _missing_bdf(tree):
    tree.find("devices/hostdev/source/address").set("bus", "0x77")


def test_f2_passthrough_is_never_silent(tmp_path):
    """Finding 2: on-error passthrough with a hostdev the host lacks printed nothing and exited
    0; now the reason is on stderr, and --check fails."""
    d = edited(H100 / "domain.xml", tmp_path / "missing.xml", _missing_bdf)
    vmi = _passthrough_vmi(tmp_path)
    r = run("xmlfix", "--vmi", str(vmi), "--sysfs", str(H100), str(d))
    assert r.returncode == 0 and r.stdout == d.read_bytes()
    assert b"left unchanged (passthrough)" in r.stderr and b"0000:77:00.0" in r.stderr
    r = run("xmlfix", "--check", "--vmi", str(vmi), "--sysfs", str(H100), str(d))
    assert r.returncode == 1 and b"0000:77:00.0" in r.stderr and b"would not rewrite" in r.stderr


# -- finding 3: --explain opens with a verdict, groups reasons, NVLink pairs are not PCIe diffs --

def test_f3_explain_verdict_and_grouped_reasons():
    """Finding 3: one verdict line first; each reason once; an NV18 GPU pair is not listed as a
    PIX/PXB difference (hgx-b200)."""
    r = run("xmlfix", "--explain", "--sysfs", "fixtures/hgx-b200", "fixtures/hgx-b200/domain.xml")
    out = r.stdout.decode()
    first = out.splitlines()[0]
    assert first == ("Verdict: NCCL: 190/190 pairs as on the host; nvidia-smi: 178/190 pairs as on the host, "
                     "12 PXB→PIX by design (Broadcom flattening)")
    assert out.count("Broadcom two-level complex collapsed") == 1
    diffs = out.split("Differences")[1].split("NUMA map")[0]
    assert "GPU0-GPU1" not in diffs and "NIC0-GPU1" in diffs
    assert "joined by NVLink" in diffs


def test_f3_explain_without_guest_cells_says_what_to_set_in_kubevirt():
    """Finding 3: no guest NUMA cells → the KubeVirt settings that create them; the same reason
    is printed once for its 84 pairs, with a bounded list."""
    r = run("xmlfix", "--explain", "--sysfs", str(H100), str(H100 / "cases" / "no-numa" / "domain.xml"))
    out = r.stdout.decode()
    assert out.startswith("Verdict: NCCL: 106/190 pairs as on the host, 84 SYS→PHB (no guest NUMA cells)")
    assert "guestMappingPassthrough" in out and "dedicatedCpuPlacement" in out and "hugepages" in out
    assert out.count("cross-node pairs cannot show SYS") == 1
    assert "... and 72 more" in out
