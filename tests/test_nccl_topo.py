"""The host's link speeds in the guest: root ports (``link``) and NCCL's topology file
through fw_cfg (``nccl-topo``), the prediction's bandwidths, and ``pcitopo verify`` on them."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path

import pytest
from lxml import etree

from pcitopo.checks.verify import load_expectation, verify_guest
from pcitopo.guest.rewrite import rewrite_domain
from pcitopo.guest.verdict import prediction
from pcitopo.host.sysfs import open_host
from pcitopo.libvirt import fwcfg
from pcitopo.libvirt.define_sim import libvirt_define
from pcitopo.libvirt.links import QEMU_SINCE, X_SPEED, X_WIDTH
from pcitopo.libvirt.overrides import properties
from pcitopo.nccl import topoxml as ncclxml
from pcitopo.nccl.price import nccl_tree, path_bandwidth
from pcitopo.serve.options import HookOptions, options_from_annotations
from testkit.kubevirt_sim import hook_calls, kubevirt_reparse

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "fixtures"
GOLDENS = ("hgx-b200", "hgx-h100", "dgx-h100")
BIN = Path(sys.executable).parent


def _golden(name: str, **options):
    host = open_host(FIXTURES / name)
    return host, rewrite_domain((FIXTURES / name / "domain.xml").read_bytes(), host, **options)


@pytest.mark.parametrize("name", GOLDENS)
def test_options_off_give_the_output_before_them(name):
    """link: off and nccl-topo: off: the rewrite is byte for byte what it was before them."""
    _, res = _golden(name, link=False, nccl_topo=False)
    assert res.xml == (REPO / "tests" / "data" / "options-off" / f"{name}.xml").read_bytes()


def test_the_options_are_declared_once_with_their_defaults():
    assert HookOptions().link == "auto" and HookOptions().nccl_topo == "fwcfg"
    opts = options_from_annotations({"pcitopo.kubevirt.io/link": "off", "pcitopo.kubevirt.io/nccl-topo": "off"})
    assert (opts.link, opts.nccl_topo) == ("off", "off")


@pytest.mark.parametrize("name", GOLDENS)
def test_root_ports_carry_the_host_link_as_strings(name):
    host, res = _golden(name)
    props = properties(etree.fromstring(res.xml))
    ours = {a: p for a, p in props.items() if X_SPEED in p}
    assert ours, "no root port got x-speed"
    for alias, p in ours.items():
        assert alias.startswith("ua-pcitopo-rp-")
        assert p[X_SPEED].type == "string" and p[X_SPEED].value in ("2_5", "5", "8", "16", "32", "64")
        assert p[X_WIDTH].type == "string" and p[X_WIDTH].value in ("1", "2", "4", "8", "12", "16", "32")
    # every golden host has Gen5 links: 32 GT/s, which needs QEMU 9.0
    assert {p[X_SPEED].value for p in ours.values()} == {"32"} and QEMU_SINCE["32"] == "9.0"
    assert any("QEMU 9.0" in n for n in res.report.notes)


@pytest.mark.parametrize("name", GOLDENS)
def test_the_file_rides_in_fwcfg_and_parses_under_nccls_rules(name):
    host, res = _golden(name)
    root = etree.fromstring(res.xml)
    entries = fwcfg.entries(root)
    assert list(entries) == [ncclxml.FWCFG_NAME]
    data = base64.b64decode(entries[ncclxml.FWCFG_NAME], validate=True)
    assert data == res.nccl_topo.data
    system = ncclxml.parse(data)
    pcis = [n for n in system.walk() if n.name == "pci"]
    switches = [n for n in pcis if n.get("class") == ncclxml.BRIDGE_CLASS]
    assert switches and all(n.get("vendor") is None and n.get("device") is None for n in switches)
    assert all(n.get("link_speed") in ncclxml.CANONICAL_SPEED.values() for n in pcis)
    # every GPU and NIC at its predicted guest address, on its guest cell
    guest_of = {str(d.host): d for d in res.report.placed}
    busids = {n.get("busid") for n in pcis}
    for d in res.report.placed:
        if d.role == "gpu":
            assert str(d.guest) in busids
    cells = {n.get("numaid") for n in system.subs}
    assert cells == {str(d.guest_cell) for d in res.report.placed if d.role in ("gpu", "nic")}
    assert guest_of


@pytest.mark.parametrize("name", GOLDENS)
def test_guest_bandwidth_with_the_file_is_the_hosts(name):
    """The predicted guest read NCCL's way plus the file gives every GPU path the host's
    bandwidth; the emulated switches alone do not (QEMU's 2.5 GT/s x1 upstream ports)."""
    host, res = _golden(name)
    guest = res.guest.topology
    htree = nccl_tree(host)
    gtree = nccl_tree(guest, ncclxml.parse(res.nccl_topo.data))
    placed = [d for d in res.report.placed if d.guest is not None]
    n = 0
    for i, a in enumerate(placed):
        for b in [None] + placed[i + 1:]:
            hb = path_bandwidth(htree, host, host.function(a.host), None if b is None else host.function(b.host))
            if hb is None:
                continue
            gb = path_bandwidth(gtree, guest, guest.function(a.guest), None if b is None else guest.function(b.guest))
            assert gb == hb, (a.host, b and b.host, gb, hb)
            n += 1
    assert n > 50


def test_the_hook_re_emits_after_kubevirts_reparse_and_keeps_kubevirts_sysinfo():
    host = open_host(FIXTURES / "hgx-h100")
    src = etree.fromstring((FIXTURES / "hgx-h100" / "domain.xml").read_bytes())
    smbios = etree.SubElement(src, "sysinfo", type="smbios")
    etree.SubElement(etree.SubElement(smbios, "system"), "entry", name="uuid").text = "5e3f"
    xml = etree.tostring(src)
    outs = hook_calls(xml, lambda x: rewrite_domain(x, host).xml)
    assert len({o for o in outs}) >= 1
    for out in outs:
        root = etree.fromstring(out)
        kinds = [s.get("type") for s in root.iter("sysinfo")]
        assert kinds == ["fwcfg", "smbios"], kinds  # ours first: KubeVirt's struct keeps its own
        assert list(fwcfg.entries(root)) == [ncclxml.FWCFG_NAME]
    again = kubevirt_reparse(libvirt_define(outs[-1]))
    root = etree.fromstring(again)
    assert [s.get("type") for s in root.iter("sysinfo")] == ["smbios"]
    assert root.find("sysinfo/system/entry").text == "5e3f"
    assert rewrite_domain(again, host).xml == rewrite_domain(outs[-1], host).xml


def _run(*args) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / str(args[0])), *map(str, args[1:])], capture_output=True, timeout=120, cwd=REPO)


def test_xmlfix_nccl_topo_prints_the_file_the_domain_carries(tmp_path):
    host_dir, dom = FIXTURES / "hgx-h100", FIXTURES / "hgx-h100" / "domain.xml"
    r = _run("xmlfix", "--nccl-topo", "--sysfs", host_dir, dom)
    assert r.returncode == 0, r.stderr
    out = _run("xmlfix", "--sysfs", host_dir, dom).stdout
    assert base64.b64decode(fwcfg.entries(etree.fromstring(out))[ncclxml.FWCFG_NAME]) == r.stdout
    ncclxml.parse(r.stdout)
    bad = _run("xmlfix", "--nccl-topo", "--json", "--sysfs", host_dir, dom)
    assert bad.returncode == 2 and len(bad.stderr.decode().strip().splitlines()) == 1


def test_install_nccl_topo(tmp_path):
    host_dir, dom = FIXTURES / "hgx-h100", FIXTURES / "hgx-h100" / "domain.xml"
    data = _run("xmlfix", "--nccl-topo", "--sysfs", host_dir, dom).stdout
    raw = tmp_path / "raw"
    raw.write_bytes(base64.b64encode(data))
    dest = tmp_path / "run" / "nvidia-topologyd" / "virtualTopology.xml"
    r = _run("pcitopo", "guest", "install-nccl-topo", "--from", raw, "--dest", dest)
    assert r.returncode == 0, r.stderr
    assert dest.read_bytes() == data
    r = _run("pcitopo", "guest", "install-nccl-topo", "--from", tmp_path / "absent", "--dest", dest)
    assert r.returncode == 1 and b"no NCCL topology offered" in r.stderr
    raw.write_bytes(base64.b64encode(b'<?xml version="1.0"?>' + data))
    r = _run("pcitopo", "guest", "install-nccl-topo", "--from", raw, "--dest", dest)
    assert r.returncode == 2 and len(r.stderr.decode().strip().splitlines()) == 1
    assert dest.read_bytes() == data  # nothing written over the good file


def test_verify_names_every_path_whose_bandwidth_differs():
    """verify in the predicted guest: equal with the file, and without it every path that
    leaves a switch is named with both numbers."""
    host, res = _golden("hgx-h100")
    pred = prediction(res, host)
    assert all("nccl_gbps" in p for p in pred["pairs"])
    assert any(p["nccl_gbps"] == 48.0 for p in pred["pairs"])
    expect = load_expectation(json.dumps(pred).encode(), "predicted.json")
    guest = res.guest.topology
    ok = verify_guest(expect, guest, ncclxml.parse(res.nccl_topo.data))
    assert ok.problems == [] and ok.bandwidths_checked > 50
    # predicted guest without the file: its switches have no link at all (Gen3 x16 fallback)
    bare = verify_guest(expect, guest, None)
    lines = [p for p in bare.problems if "NCCL bandwidth" in p]
    assert lines and all("GB/s in the guest" in p and "host 48" in p for p in lines), lines[:3]


def test_a_domains_own_fwcfg_entries_are_kept_and_ours_join_them():
    host = open_host(FIXTURES / "hgx-h100")
    src = etree.fromstring((FIXTURES / "hgx-h100" / "domain.xml").read_bytes())
    own = etree.SubElement(src, "sysinfo", type="fwcfg")
    etree.SubElement(own, "entry", name="opt/com.example/config").text = "x"
    out = rewrite_domain(rewrite_domain(etree.tostring(src), host).xml, host).xml
    root = etree.fromstring(out)
    assert [s.get("type") for s in root.iter("sysinfo")] == ["fwcfg"]
    assert list(fwcfg.entries(root)) == ["opt/com.example/config", ncclxml.FWCFG_NAME]
    off = rewrite_domain(out, host, nccl_topo=False).xml
    assert list(fwcfg.entries(etree.fromstring(off))) == ["opt/com.example/config"]
