"""``pcitopo verify`` in a booted guest against ``xmlfix --json``.

The operator's loop, for real: ``xmlfix --json`` predicts the guest of a domain; the rewritten
domain boots (stand-ins at the hostdevs' guest addresses, see guestboot.py); the guest's own
PCI printout becomes a sysfs-shaped tree; ``pcitopo verify --expect`` reads that tree with the
same reader as a live guest's /sys and must find it as predicted. A prediction broken on purpose
(one pair's NCCL class, one device's NUMA node) must exit 1 and name both differences.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pcitopo.nccl.topoxml import FWCFG_NAME
from testkit.e2e.guestboot import boot
from testkit.e2e.paths import REPO_ROOT

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60 + float(os.environ.get("PCITOPO_E2E_BOOT_TIMEOUT") or 240))]

CASE = REPO_ROOT / "fixtures" / "hgx-h100" / "cases" / "one-node"
HOST = REPO_ROOT / "fixtures" / "hgx-h100"
BIN = Path(sys.executable).parent


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / args[0]), *args[1:]], capture_output=True, timeout=120, cwd=REPO_ROOT)


def _guest(tool: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["/usr/bin/python3", "-S", "-I", str(tool), *args], capture_output=True, timeout=120, cwd=REPO_ROOT)


def test_verify_in_a_booted_guest(libvirtd, tmp_path):
    """Prediction → boot → verify passes; a wrong prediction fails, named."""
    pred = _run("xmlfix", "--json", "--sysfs", str(HOST), str(CASE / "domain.xml"))
    assert pred.returncode == 0, pred.stderr
    out = _run("xmlfix", "--sysfs", str(HOST), str(CASE / "domain.xml"))
    booted = boot(out.stdout, libvirtd=libvirtd, timeout=float(os.environ.get("PCITOPO_E2E_BOOT_TIMEOUT") or 240),
                  work_dir=tmp_path / "boot")
    t = booted.timings
    print(f"\n[e2e verify] one-node booted: start→end marker {t['run']:.1f}s, total {t['total']:.1f}s; "
          f"guest firmware {booted.firmware}; on {libvirtd.versions().line()}")
    tree = booted.sysfs_tree(tmp_path / "guest-sysfs")
    expect = tmp_path / "predicted.json"
    expect.write_bytes(pred.stdout)

    # the guest installs NCCL's topology file the domain passed through fw_cfg
    raw = tmp_path / "nccl-topo.b64"
    raw.write_bytes(booted.printout.fwcfg[FWCFG_NAME])
    installed = tmp_path / "run" / "nvidia-topologyd" / "virtualTopology.xml"
    r = _run("pcitopo", "guest", "install-nccl-topo", "--from", str(raw), "--dest", str(installed))
    assert r.returncode == 0, r.stderr.decode()
    r = _run("pcitopo", "verify", "--expect", str(expect), "--sysfs", str(tree), "--nccl-topo", str(installed))
    assert r.returncode == 0, r.stderr.decode()
    doc = json.loads(pred.stdout)
    n, m = len(doc["devices"]), len(doc["pairs"])
    assert f"as predicted: all {n} devices and all {m} pairs" in r.stderr.decode()
    # The guest tool (one file, standard library only) on the same tree,
    # under a plain python3 without site-packages: the guest image has no Python of its own.
    tool = tmp_path / "pcitopo-guest"
    assert _run("pcitopo", "guest-tool", "-o", str(tool)).returncode == 0
    g = _guest(tool, "verify", "--expect", str(expect), "--sysfs", str(tree), "--nccl-topo", str(installed))
    assert g.returncode == 0 and g.stderr == r.stderr.replace(b"pcitopo verify:", b"pcitopo-guest verify:"), g.stderr
    # the guest tool installs the blob as `pcitopo guest install-nccl-topo` does, byte for byte
    again = tmp_path / "again" / "virtualTopology.xml"
    assert _guest(tool, "install-nccl-topo", "--from", str(raw), "--dest", str(again)).returncode == 0
    assert again.read_bytes() == installed.read_bytes()
    # without the file NCCL misprices every path that leaves a switch: each one is named
    r = _run("pcitopo", "verify", "--expect", str(expect), "--sysfs", str(tree), "--nccl-topo", "none")
    assert r.returncode == 1 and "NCCL bandwidth 0.1875 GB/s in the guest, host 48 GB/s" in r.stderr.decode()

    # Broken on purpose: a PIX pair said to be SYS, and one device on another NUMA node.
    pix = next(p for p in doc["pairs"] if p["nccl"] == "PIX")
    pix["nccl"] = "SYS"
    doc["devices"][0]["numa"] = 7
    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps(doc))
    r = _run("pcitopo", "verify", "--expect", str(wrong), "--sysfs", str(tree), "--nccl-topo", str(installed))
    err = r.stderr.decode()
    assert r.returncode == 1, err
    assert f"host {pix['a']}-{pix['b']}" in err and "NCCL PIX, predicted SYS" in err
    assert f"host {doc['devices'][0]['host_bdf']}" in err and "predicted 7" in err
    assert f"devices: {n - 1} of {n} as predicted, 1 differs; pairs: {m - 1} of {m} as predicted, 1 differs" in err
    g = _guest(tool, "verify", "--expect", str(wrong), "--sysfs", str(tree), "--nccl-topo", str(installed))
    assert g.returncode == 1 and g.stderr == r.stderr.replace(b"pcitopo verify:", b"pcitopo-guest verify:")
