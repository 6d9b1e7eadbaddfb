"""The rewrite against golden files, libvirt's own schema tool, and KubeVirt's call pattern."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest
from lxml import etree

from pcitopo.errors import DomainError, PlanError
from pcitopo.guest.rewrite import Why, rewrite_domain
from pcitopo.host.sysfs import open_host
from pcitopo.kubevirt.launcher.release_groups import RELEASES, Release
from testkit import REPO as ROOT, fixture_script
from testkit.hookkit import placement
from testkit.kubevirt_sim import canonical, hook_calls, kubevirt_reparse, non_owned_elements
from testkit.stack import StackMissing, debian13

golden = fixture_script("golden")

GOLDEN_CASES = [
    (host, case)
    for host in golden.GOLDEN_HOSTS
    for case in ["."] + [f"cases/{c.name}" for c in golden.CASES]
]


@pytest.fixture(scope="module")
def hosts():
    return {name: open_host(ROOT / "fixtures" / name) for name in golden.GOLDEN_HOSTS}


@pytest.mark.parametrize("name,case", GOLDEN_CASES)
def test_golden_output_is_exact(hosts, name, case):
    d = ROOT / "fixtures" / name / case
    out = rewrite_domain((d / "domain.xml").read_bytes(), hosts[name])
    assert out.xml == (d / "expected.xml").read_bytes(), f"run `make golden` and review the diff for {d}"


@pytest.mark.parametrize("name,case", GOLDEN_CASES)
def test_the_guest_tree_is_judged_on_the_output_as_read_afresh(hosts, name, case):
    """The rewrite reads the placed domain's layout once, taking the controllers it copied in
    as read off their templates: that layout is the output's, read from its bytes alone."""
    from pcitopo.guest.view import layout_of
    from pcitopo.libvirt.document import parse_domain

    d = ROOT / "fixtures" / name / case
    out = rewrite_domain((d / "domain.xml").read_bytes(), hosts[name])
    assert out.guest.layout == layout_of(parse_domain(out.xml))


def test_golden_inputs_follow_the_fixtures():
    """The committed inputs are what the generator builds from today's fixtures."""
    assert golden.main(["--check"]) == 0


@pytest.mark.skipif(shutil.which("virt-xml-validate") is None, reason="virt-xml-validate not installed (make setup)")
@pytest.mark.parametrize("name,case", GOLDEN_CASES)
def test_golden_output_passes_libvirt_schema(name, case):
    """libvirt 9.0's schema (the machine's Debian 12 `virt-xml-validate`)."""
    path = ROOT / "fixtures" / name / case / "expected.xml"
    r = subprocess.run(["virt-xml-validate", str(path), "domain"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.fixture(scope="module")
def libvirt11_schema() -> tuple[etree.RelaxNG, str]:
    """The domain RelaxNG of the Debian 13 root (libvirt 11.3, what the e2e tier boots on)."""
    try:
        stack = debian13()
    except StackMissing as e:
        if os.environ.get("CI"):
            pytest.fail(str(e))
        pytest.skip(str(e))
    return etree.RelaxNG(file=str(stack.domain_rng)), f"libvirt {stack.versions().libvirt}"


@pytest.mark.parametrize("name,case", GOLDEN_CASES)
def test_golden_output_passes_libvirt11_schema(libvirt11_schema, name, case):
    """The same golden outputs against libvirt 11.3's schema (the Debian 13 root's
    /usr/share/libvirt/schemas/domain.rng, what `virt-xml-validate` there reads)."""
    rng, which = libvirt11_schema
    assert which.startswith("libvirt 11."), which
    doc = etree.parse(str(ROOT / "fixtures" / name / case / "expected.xml"))
    assert rng.validate(doc), f"{which}: {rng.error_log}"


@pytest.mark.parametrize("name", golden.GOLDEN_HOSTS)
def test_every_pair_keeps_its_class(hosts, name):
    d = ROOT / "fixtures" / name
    report = rewrite_domain((d / "domain.xml").read_bytes(), hosts[name]).report
    assert report.pairs and not report.fidelity_lost
    assert all(p.nccl_same for p in report.pairs)
    for p in report.pairs:
        if not p.nvml_same:
            # Only where a Broadcom two-level complex collapsed the way NCCL flattens it.
            assert (p.host.nvml.value, p.guest.nvml.value, p.host.nccl.value) == ("PXB", "PIX", "PIX")
            assert p.why is Why.BROADCOM_COLLAPSE and "Broadcom" in p.reason
    if name not in ("hgx-b200", "dgx-a100"):  # the two with a folded Broadcom second level above a GPU and NIC
        assert all(p.nvml_same for p in report.pairs)


def test_no_numa_case_explains_why_sys_is_lost(hosts):
    d = ROOT / "fixtures" / "hgx-h100" / "cases" / "no-numa"
    report = rewrite_domain((d / "domain.xml").read_bytes(), hosts["hgx-h100"]).report
    lost = [p for p in report.pairs if p.host.nccl.value == "SYS"]
    assert lost and all(p.guest.nccl.value == "PHB" and p.why is Why.NO_CELLS and "NUMA" in p.why for p in lost)
    assert any("no guest NUMA cells" in n for n in report.notes)
    # PIX survives without NUMA: GPUDirect RDMA does not depend on cells.
    assert all(p.nccl_same for p in report.pairs if p.host.nccl.value == "PIX")


@pytest.mark.parametrize("release", RELEASES, ids=lambda r: r.value)
@pytest.mark.parametrize("name,case", GOLDEN_CASES)
def test_idempotent_and_through_kubevirt_reparse(hosts, name, case, release):
    host = hosts[name]
    d = ROOT / "fixtures" / name / case
    first = rewrite_domain((d / "domain.xml").read_bytes(), host).xml
    assert rewrite_domain(first, host).xml == first
    again = rewrite_domain(kubevirt_reparse(first, release=release), host).xml
    assert canonical(again) == canonical(rewrite_domain(again, host).xml)
    # The lossy re-parse drops model names, chassis, multifunction: we re-emit them all.
    assert placement(again) == placement(first)
    if case == "cases/reparsed" and release is not Release.MAIN:
        return  # main's re-parse made that input; another release's re-parse changes libvirt's own ports
    assert canonical(again) == canonical(first)


@pytest.mark.parametrize("release", RELEASES, ids=lambda r: r.value)
@pytest.mark.parametrize("name", golden.GOLDEN_HOSTS)
def test_three_chained_calls_keep_placement_and_leave_the_rest(hosts, name, release):
    """Three calls through each KubeVirt release's re-parse: the last raw string,
    the one virt-launcher defines, places everything as call 1 did."""
    host = hosts[name]
    domain = (ROOT / "fixtures" / name / "domain.xml").read_bytes()
    outs = hook_calls(domain, lambda x: rewrite_domain(x, host).xml, calls=3, decimal_bus=True, release=release)

    def alias(c):
        a = c.find("alias")
        return a.get("name", "") if a is not None else ""

    def ours(xml):
        root = etree.fromstring(xml, etree.XMLParser(remove_blank_text=True))
        ctrls = [etree.tostring(c, method="c14n", exclusive=True) for c in root.iter("controller") if alias(c).startswith("ua-pcitopo-")]
        hds = [etree.tostring(h.find("address"), method="c14n", exclusive=True) for h in root.iter("hostdev")]
        return sorted(ctrls), hds

    assert ours(outs[1]) == ours(outs[0]) == ours(outs[2])
    assert non_owned_elements(outs[0]) == non_owned_elements(domain)
    # libvirt's root ports for the other devices survive later calls, untouched.
    final = etree.fromstring(outs[2])
    theirs = [c for c in final.iter("controller") if c.get("model") == "pcie-root-port" and not alias(c).startswith("ua-pcitopo-")]
    assert theirs and all(alias(c).startswith("pci.") for c in theirs)


def test_kubevirt_numa_preplacement_is_taken_over_cleanly(hosts):
    d = ROOT / "fixtures" / "hgx-h100" / "cases" / "kubevirt-numa"
    inp = (d / "domain.xml").read_bytes()
    out = rewrite_domain(inp, hosts["hgx-h100"])
    root = etree.fromstring(out.xml)
    pci = [c for c in root.iter("controller") if c.get("type") == "pci"]
    indexes = sorted(int(c.get("index")) for c in pci)
    assert indexes == list(range(len(indexes))), "unique indexes, no gaps"
    assert all(c.get("model") == "pcie-root" or c.find("alias").get("name").startswith("ua-pcitopo-") for c in pci)
    assert out.report.removed > 0 and not out.report.fidelity_lost
    # and the result is the same as rewriting the un-placed domain
    plain = rewrite_domain((ROOT / "fixtures" / "hgx-h100" / "domain.xml").read_bytes(), hosts["hgx-h100"]).xml
    assert canonical(out.xml) == canonical(plain)


def test_bus_numbers_do_not_overlap_and_fit(hosts):
    out = rewrite_domain((ROOT / "fixtures" / "hgx-b200" / "domain.xml").read_bytes(), hosts["hgx-b200"])
    root = etree.fromstring(out.xml)
    pxbs = sorted(int(c.find("target").get("busNr")) for c in root.iter("controller") if c.get("model") == "pcie-expander-bus")
    guest = out.guest.topology
    ranges = {}
    for b in guest.bdfs():
        rc = guest.function(b).root_complex
        ranges.setdefault(rc, set()).add(b.bus)
    spans = sorted((min(v), max(v)) for k, v in ranges.items() if k != "pci0000:00")
    assert [s[0] for s in spans] == pxbs
    for (_lo, hi), nxt in zip(spans, pxbs[1:] + [256]):
        assert hi < nxt  # a pxb's subtree never reaches the next pxb
    assert max(s[1] for s in spans) <= 255


def test_not_q35_is_a_clear_error(hosts):
    xml = (ROOT / "fixtures" / "hgx-h100" / "domain.xml").read_bytes().replace(b"pc-q35-rhel9.6.0", b"pc-i440fx-9.0")
    with pytest.raises(DomainError, match="not q35"):
        rewrite_domain(xml, hosts["hgx-h100"])


def test_unknown_hostdev_is_a_clear_error(hosts):
    xml = (ROOT / "fixtures" / "hgx-h100" / "domain.xml").read_bytes().replace(b'bus="0x18"', b'bus="0x77"', 1)
    with pytest.raises(DomainError, match="0000:77:00.0 is not a PCI function on this host"):
        rewrite_domain(xml, hosts["hgx-h100"])


def test_out_of_buses_is_a_clear_error():
    from pcitopo.synth import host_from_topo
    from testkit.kubevirt_sim import DomainSpec, kubevirt_domain

    # Two PCI domains' worth of switches: the host has room, one guest domain does not.
    lines = ["numa 0 cpus=0-3"]
    for dom in (0, 1):
        for b in range(0x10, 0xF0, 7):
            lines += [f"rc {dom:04x}:{b:02x} numa=0", f"  rp {b:02x}:01.0 preset=intel-rp",
                      f"    us {b+1:02x}:00.0 preset=pex-gen5-oem"]
            for s in range(4):
                lines += [f"      ds {b+2:02x}:{s:02x}.0", f"        ep {b+3+s:02x}:00.0 preset=h100"]
    text = "\n".join(ln for ln in lines if ln)
    host = host_from_topo(text)
    from pcitopo.model.tree import Role
    devs = [f.bdf for f in host.functions() if host.role(f) == Role.GPU]
    xml = kubevirt_domain(host, DomainSpec("big", tuple(devs)))
    with pytest.raises(PlanError, match="out of PCI buses"):
        rewrite_domain(xml, host)


def test_broadcom_collapse_is_explained_as_such_without_numa_too(hosts):
    d = ROOT / "fixtures" / "hgx-b200" / "cases" / "no-numa"
    report = rewrite_domain((d / "domain.xml").read_bytes(), hosts["hgx-b200"]).report
    collapsed = [p for p in report.pairs if p.host.nccl == p.guest.nccl and (p.host.nvml.value, p.guest.nvml.value) == ("PXB", "PIX")]
    assert len(collapsed) == 16
    assert all(p.why is Why.BROADCOM_COLLAPSE for p in collapsed)
    assert all(p.why is Why.NO_CELLS for p in report.pairs if p.host.nccl.value == "SYS")
