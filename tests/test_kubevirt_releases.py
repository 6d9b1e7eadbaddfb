"""Part 3: every KubeVirt release's re-parse between hook calls (v1.6–1.7, v1.8–1.9,
main; src/pcitopo/kubevirt/launcher/reparse.py, docs/SOURCES.md), three calls through each, and the hook
restoring what each release drops."""

from __future__ import annotations

import pytest
from lxml import etree

from pcitopo.guest.rewrite import rewrite_domain
from pcitopo.host.sysfs import open_host
from pcitopo.kubevirt.launcher.release_groups import RELEASES, Release
from pcitopo.libvirt.domain import QEMU_NS
from testkit import REPO as ROOT
from testkit.hookkit import VirtLauncher, fixture_sysfs, placement, vmi_json
from testkit.kubevirt_sim import (
    DomainSpec,
    gpus_and_nics,
    hook_calls,
    kubevirt_domain,
    kubevirt_reparse,
    next_call_input,
)
from testkit.server_proc import ServerProcess, serve_argv

Q = f"{{{QEMU_NS}}}"
IDS = [r.value for r in RELEASES]


@pytest.fixture(scope="module")
def h100():
    return open_host(ROOT / "fixtures" / "hgx-h100")


def _seabios(host) -> bytes:
    """SeaBIOS, host-model CPU: the rewrite writes maxphysaddr and pref64-reserve overrides."""
    root = etree.fromstring(kubevirt_domain(host, DomainSpec("t", tuple(gpus_and_nics(host)))))
    root.find("cpu").set("mode", "host-model")
    return etree.tostring(root)


def _rewrite(host):
    return lambda xml: rewrite_domain(xml, host, host_phys_bits=46).xml


def _pxbs(root: etree._Element) -> list[etree._Element]:
    return [c for c in root.iter("controller") if c.get("model") == "pcie-expander-bus"]


def _source_types(root: etree._Element) -> set:
    return {a.get("type") for a in root.iter("address") if a.getparent().tag == "source"}


# -- the simulation says what each release's struct says ------------------------------------------

DEFINED = b"""<domain type="kvm" xmlns:qemu="http://libvirt.org/schemas/domain/qemu/1.0"><name>t</name>
<os><type arch="x86_64" machine="q35">hvm</type><loader readonly="yes" secure="no" type="pflash">/OVMF_CODE.fd</loader></os>
<cpu mode="host-model"><maxphysaddr mode="emulate" bits="46"/><feature policy="require" name="pdpe1gb"/>
<numa><cell id="0" cpus="0-3" memory="4" unit="GiB"/></numa></cpu>
<devices>
<controller type="pci" index="1" model="pcie-expander-bus"><model name="pxb-pcie"/><target busNr="200" hotplug="off"><node>0</node></target><alias name="ua-pcitopo-pxb"/><address type="pci" domain="0x0000" bus="0x00" slot="0x10" function="0x0" multifunction="on"/></controller>
<controller type="pci" index="2" model="pcie-root-port"><model name="pcie-root-port"/><target chassis="2" port="0x0"/><alias name="ua-pcitopo-rp"/><address type="pci" domain="0x0000" bus="0x01" slot="0x00" function="0x0"/></controller>
<hostdev mode="subsystem" type="pci" managed="no"><driver name="vfio"/><source><address domain="0x0000" bus="0x1b" slot="0x00" function="0x0"/></source><alias name="ua-gpu-gpu0"/><rom bar="off"/><address type="pci" domain="0x0000" bus="0x02" slot="0x00" function="0x0"/></hostdev>
</devices>
<qemu:commandline><qemu:arg value="-S"/></qemu:commandline>
<qemu:override><qemu:device alias="ua-pcitopo-rp"><qemu:frontend><qemu:property name="pref64-reserve" type="unsigned" value="1"/></qemu:frontend></qemu:device></qemu:override>
</domain>"""  # noqa: E501 -- libvirt's defined domain, one element a line: a break would add text to the XML


@pytest.mark.parametrize("release", RELEASES, ids=IDS)
def test_each_release_keeps_what_its_struct_has_fields_for(release):
    root = etree.fromstring(kubevirt_reparse(DEFINED, release=release))
    pxb, rp = root.findall("devices/controller")
    hd = root.find("devices/hostdev")
    # controller Target: absent up to v1.7, BusNr/NUMANode from v1.8, Hotplug on main only
    assert (pxb.find("target") is not None) == (release is not Release.V1_7)
    if release is not Release.V1_7:
        assert pxb.find("target").get("busNr") == "200" and pxb.findtext("target/node") == "0"
        assert (pxb.find("target").get("hotplug") == "off") == (release is Release.MAIN)
        assert rp.find("target") is not None and dict(rp.find("target").attrib) == {}  # empty, pointer set
    # <qemu:commandline>: restored on main only; the root's xmlns:qemu goes with it
    assert (root.find(f"{Q}commandline") is not None) == (release is Release.MAIN)
    assert ("qemu" in root.nsmap) == (release is Release.MAIN)
    # v1.7's Address.Type has no omitempty: the source address comes back with type=""
    assert _source_types(root) == ({""} if release is Release.V1_7 else {None})
    # v1.9 has HostDevice.Driver with only iommufd; v1.7 none
    assert (hd.find("driver") is not None) == (release is not Release.V1_7)
    # never kept, by any release
    assert root.find("cpu/maxphysaddr") is None and root.find(f"{Q}override") is None
    assert all(c.find("model") is None for c in (pxb, rp)) and rp.find("target[@chassis]") is None
    assert root.find(".//address[@multifunction]") is None and hd.find("rom") is None
    # kept by every release
    assert root.find("cpu/feature[@name='pdpe1gb']") is not None and root.find("cpu/numa/cell") is not None
    assert root.findtext("os/loader") == "/OVMF_CODE.fd" and hd.get("mode") == "subsystem"
    assert [c.findtext("alias") or c.find("alias").get("name") for c in (pxb, rp)] == ["ua-pcitopo-pxb", "ua-pcitopo-rp"]


# -- three calls through each release -------------------------------------------------------------

@pytest.mark.parametrize("release", RELEASES, ids=IDS)
def test_three_calls_through_each_release_define_every_setting(h100, release):
    """The last call's raw reply, the one virt-launcher defines, carries every setting of call 1:
    busNr and <node>, maxphysaddr and the pref64-reserve overrides, whatever the release dropped."""
    outs = hook_calls(_seabios(h100), _rewrite(h100), calls=3, decimal_bus=True, release=release)
    first, last = etree.fromstring(outs[0]), etree.fromstring(outs[-1])
    assert placement(outs[-1]) == placement(outs[0])
    assert [(c.get("busNr"), c.findtext("node")) for c in (p.find("target") for p in _pxbs(last))] == \
           [(c.get("busNr"), c.findtext("node")) for c in (p.find("target") for p in _pxbs(first))]
    assert dict(last.find("cpu/maxphysaddr").attrib) == dict(first.find("cpu/maxphysaddr").attrib)
    assert len(last.findall(f"{Q}override/{Q}device")) == len(first.findall(f"{Q}override/{Q}device")) > 0
    assert outs[1] == outs[2]


def test_the_hook_restores_busnr_and_node_after_v17_drops_them(h100):
    """V1.7's struct has no Controller.Target, so call 2 sees expander buses without
    busNr and <node>; the hook writes both back."""
    out1 = rewrite_domain(_seabios(h100), h100, host_phys_bits=46).xml
    call2 = next_call_input(out1, Release.V1_7)
    pxbs = _pxbs(etree.fromstring(call2))
    assert pxbs and all(p.find("target") is None for p in pxbs)
    out2 = etree.fromstring(rewrite_domain(call2, h100, host_phys_bits=46).xml)
    want = {p.find("alias").get("name"): (p.find("target").get("busNr"), p.findtext("target/node"))
            for p in _pxbs(etree.fromstring(out1))}
    got = {p.find("alias").get("name"): (p.find("target").get("busNr"), p.findtext("target/node")) for p in _pxbs(out2)}
    assert got == want and all(b and n for b, n in got.values())


def test_the_hook_accepts_v17s_empty_source_address_type(h100):
    """V1.7 writes <source><address type="" …> (Address.Type without omitempty). The
    hook reads the same host devices from it and writes the source address as libvirt does,
    without type, and says what it removed."""
    out1 = rewrite_domain(_seabios(h100), h100, host_phys_bits=46)
    call2 = next_call_input(out1.xml, Release.V1_7)
    assert _source_types(etree.fromstring(call2)) == {""}
    out2 = rewrite_domain(call2, h100, host_phys_bits=46)
    assert _source_types(etree.fromstring(out2.xml)) == {None}
    assert placement(out2.xml) == placement(out1.xml)
    assert [p.host for p in out2.report.pairs] == [p.host for p in out1.report.pairs]
    note = [n for n in out2.report.notes if "source address" in n]
    assert note and "type=''" in note[0]


def test_the_hook_drops_v19s_empty_hostdev_driver(h100):
    """v1.9's HostDevDriver has only iommufd: libvirt's <driver name='vfio'/> comes back as an
    empty <driver>, which libvirt's schema does not allow; the hook writes the hostdev without it."""
    out1 = rewrite_domain(_seabios(h100), h100, host_phys_bits=46).xml
    call2 = next_call_input(out1, Release.V1_9)
    assert all(len(d.attrib) == 0 for d in etree.fromstring(call2).iter("driver") if d.getparent().tag == "hostdev")
    out2 = etree.fromstring(rewrite_domain(call2, h100, host_phys_bits=46).xml)
    assert [d for d in out2.iter("driver") if d.getparent().tag == "hostdev" and not d.attrib] == []


# -- the sidecar over gRPC, each release between the calls ----------------------------------------

@pytest.mark.parametrize("release", RELEASES, ids=IDS)
def test_sidecar_boot_through_each_release(tmp_path, h100, release):
    hooks = tmp_path / "hooks"
    (hooks / "hook-sidecar-0").mkdir(parents=True)
    sock = hooks / "hook-sidecar-0" / "pcitopo.sock"
    domain = _seabios(h100)
    vmi = vmi_json(domain, name="train", namespace="ml")
    srv = ServerProcess(serve_argv(sock, fixture_sysfs("hgx-h100")), tmp_path / "server.log")
    try:
        launcher = VirtLauncher(hooks, supported=("v1alpha3",), poll_s=0.3)
        launcher.collect()
        history = launcher.boot(domain, vmi, calls=3, release=release)
        assert placement(history[2][1]) == placement(history[0][1])
        last = etree.fromstring(history[2][1])
        assert last.find("cpu/maxphysaddr") is not None and last.find(f"{Q}override") is not None
        assert all(p.find("target/node") is not None for p in _pxbs(last))
        calls = [r for r in srv.log_lines() if r.get("event") == "OnDefineDomain"]
        assert [r["outcome"] for r in calls] == ["rewritten"] * 3
        launcher.shutdown()
    finally:
        srv.stop()


# -- the docs say what the simulation does -----------------------------------------------------------

DEPLOY_MD = (ROOT / "docs" / "DEPLOY.md").read_text()
DOC_ROWS = {Release.V1_7: "v1.6, v1.7", Release.V1_9: "v1.8, v1.9", Release.MAIN: "main"}


@pytest.mark.parametrize("release", RELEASES, ids=IDS)
def test_deploy_md_reparse_table_matches_the_simulation(release):
    row = next(ln for ln in DEPLOY_MD.splitlines() if ln.startswith(f"| {DOC_ROWS[release]} |"))
    target, busnr_node, hotplug, commandline = [c.strip() for c in row.strip("|").split("|")][1:]
    assert (target == "kept") == release.controller_target and (busnr_node == "kept") == release.controller_target
    assert (hotplug == "kept") == release.target_hotplug
    assert commandline.startswith("kept") == release.commandline_restored


def test_deploy_md_quotes_the_serving_lines_relies_on():
    import json

    from pcitopo.serve.server import RELIES_ON

    for door, text in RELIES_ON.items():  # each door's serving line, as DEPLOY.md quotes it
        assert f'"door":"{door}"' in DEPLOY_MD and f'"relies_on":{json.dumps(text)}' in DEPLOY_MD, door
