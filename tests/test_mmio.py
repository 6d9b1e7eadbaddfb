"""The 64-bit MMIO budget, the settings it writes, and P2P cliques (the SeaBIOS
placement model itself: tests/test_seabios.py)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest
from lxml import etree

from pcitopo.guest.cliques import CLIQUE_PROPERTY
from pcitopo.guest.mmio import (
    FirmwareWarning,
    MmioError,
    host_phys_bits,
    ovmf_bits,
    window_of,
)
from pcitopo.guest.rewrite import rewrite_domain
from pcitopo.host.sysfs import open_host
from pcitopo.kubevirt.launcher.release_groups import RELEASES
from pcitopo.libvirt.machine import firmware_of
from pcitopo.libvirt.overrides import properties
from pcitopo.model.bars import GiB, MiB, TiB, pow2ceil
from pcitopo.serve.core import handle_define_domain
from testkit import REPO as ROOT
from testkit.kubevirt_sim import DomainSpec, canonical, gpus_and_nics, hook_calls, kubevirt_domain, kubevirt_reparse, with_efi

SCHEMA = "/usr/share/libvirt/schemas/domain.rng"


def mmio_properties(root):
    """The <qemu:override> properties the MMIO budget and cliques own: the root ports' link
    speeds are another option's."""
    out = {}
    for alias, props in properties(root).items():
        mine = {n: p for n, p in props.items() if n not in ("x-speed", "x-width")}
        if mine:
            out[alias] = mine
    return out


@pytest.fixture(scope="module")
def h100():
    return open_host(ROOT / "fixtures" / "hgx-h100")


@pytest.fixture(scope="module")
def b200():
    return open_host(ROOT / "fixtures" / "hgx-b200")


def _gpus(host):
    return tuple(b for b in gpus_and_nics(host) if host.role(b).value == "gpu")


def _domain(host, devices, cpu_mode="host-passthrough", efi=False) -> bytes:
    xml = kubevirt_domain(host, DomainSpec("t", tuple(devices)))
    root = etree.fromstring(xml)
    root.find("cpu").set("mode", cpu_mode)
    if cpu_mode == "custom":
        m = etree.Element("model", fallback="allow")
        m.text = "Skylake-Server"
        root.find("cpu").insert(0, m)
    xml = etree.tostring(root)
    return with_efi(xml) if efi else xml


def _root(xml: bytes) -> etree._Element:
    return etree.fromstring(xml)


# -- arithmetic ---------------------------------------------------------------------------------

def test_windows_round_to_the_largest_alignment():
    # an H100 below a root port: 128 GiB + 32 MiB needs a 256 GiB window
    assert window_of([128 * GiB, 32 * MiB], [128 * GiB, 32 * MiB]) == (256 * GiB, 128 * GiB)
    # a switch with the GPU port (256 GiB window) and a NIC port (32 MiB): 384 GiB, not 512
    assert window_of([256 * GiB, 32 * MiB], [128 * GiB, 32 * MiB]) == (384 * GiB, 128 * GiB)
    assert window_of([], []) == (0, 0)
    assert pow2ceil(3) == 4 and pow2ceil(64) == 64 and pow2ceil(0) == 0


def test_ovmf_width():
    # OVMF: the top eighth of the address space, at least 41 bits; its default window is 32 GiB
    assert ovmf_bits(32 * GiB) is None
    assert ovmf_bits(2 * TiB) == 44
    assert ovmf_bits(33 * GiB) == 41


def test_host_width_from_cpuinfo(tmp_path):
    p = tmp_path / "cpuinfo"
    p.write_text("processor\t: 0\nflags\t\t: fpu\naddress sizes\t: 52 bits physical, 57 bits virtual\n")
    assert host_phys_bits(str(p)) == 52
    p.write_text("address sizes\t: 39 bits physical\n")
    assert host_phys_bits(str(p)) == 52  # read once per path: the CPU does not change
    q = tmp_path / "no-line"
    q.write_text("processor\t: 0\n")
    assert host_phys_bits(str(q)) is None
    link = tmp_path / "link"
    link.symlink_to(p)
    assert host_phys_bits(str(link)) is None  # never through a symlink
    assert host_phys_bits(str(tmp_path / "absent")) is None
    assert host_phys_bits() == 46  # tests pin PCITOPO_CPUINFO (conftest.py)
    if os.path.exists("/proc/cpuinfo"):
        assert isinstance(host_phys_bits("/proc/cpuinfo"), (int, type(None)))


@pytest.mark.parametrize("os_xml,fw", [
    ("<os><type>hvm</type></os>", "seabios"),
    ("<os firmware='efi'><type>hvm</type></os>", "ovmf"),
    ("<os><type>hvm</type><loader type='pflash'>/x/CODE.fd</loader></os>", "ovmf"),
    ("<os><type>hvm</type><loader readonly='yes'>/usr/share/OVMF/OVMF_CODE.fd</loader></os>", "ovmf"),
    ("<os><type>hvm</type><loader type='rom'>/usr/share/seabios/bios.bin</loader></os>", "seabios"),
])
def test_firmware_from_os(os_xml, fw):
    assert firmware_of(etree.fromstring(f"<domain>{os_xml}</domain>")) == fw


# -- what is written, by CPU mode and firmware --------------------------------------------------

def test_host_passthrough_seabios_gets_passthrough_width_and_root_port_reserves(h100):
    r = rewrite_domain(_domain(h100, _gpus(h100)), h100, host_phys_bits=46)
    root = _root(r.xml)
    m = root.find("cpu/maxphysaddr")
    assert m.attrib == {"mode": "passthrough"}
    assert root.find("cpu/feature") is None
    props = mmio_properties(root)
    assert set(props) == {p.alias for p in r.report.mmio.ports}
    assert all(a.startswith("ua-pcitopo-rp-") for a in props)
    # SeaBIOS 1.16.3 at the host's 46 bits aligns the ports to 32 GiB: a 192 GiB port window
    # (128 GiB + 32 MiB GPU, 32 MiB NIC) becomes a 256 GiB reserve, so every GPU BAR is aligned
    assert {p["pref64-reserve"].value for p in props.values()} == {str(256 * GiB)}
    plan = r.report.mmio.seabios
    assert r.report.mmio.seabios_bits == 46 and plan.complete and not r.report.warnings
    assert plan.baseline.assigned < len(plan.baseline.bars)  # without the reserves: not all


def test_host_model_ovmf_gets_emulated_bits_and_1g_pages_and_no_reserves(h100):
    r = rewrite_domain(_domain(h100, gpus_and_nics(h100), "host-model", efi=True), h100, host_phys_bits=46)
    root = _root(r.xml)
    b = r.report.mmio
    assert b.firmware == "ovmf" and b.ovmf_bits == 45  # 3 TiB of windows -> top eighth of 2^45
    assert root.find("cpu/maxphysaddr").attrib == {"mode": "emulate", "bits": "45"}
    assert [f.attrib for f in root.findall("cpu/feature")] == [{"policy": "require", "name": "pdpe1gb"}]
    assert mmio_properties(root) == {}  # no pref64-reserve under OVMF


def test_custom_cpu_keeps_libvirt_element_order(h100):
    r = rewrite_domain(_domain(h100, _gpus(h100), "custom", efi=True), h100, host_phys_bits=46)
    cpu = _root(r.xml).find("cpu")
    assert [c.tag for c in cpu] == ["model", "topology", "maxphysaddr", "feature", "numa"]


def test_host_too_narrow_is_a_typed_error(h100):
    with pytest.raises(MmioError, match="host CPU has 40"):
        rewrite_domain(_domain(h100, _gpus(h100)), h100, host_phys_bits=40)


def test_small_devices_need_nothing(h100):
    nics = [b for b in gpus_and_nics(h100) if h100.role(b).value == "nic"]
    r = rewrite_domain(_domain(h100, nics), h100, host_phys_bits=46)
    root = _root(r.xml)
    assert root.find("cpu/maxphysaddr") is None and mmio_properties(root) == {}
    assert r.report.mmio.applied == []


# -- idempotence through KubeVirt's calls -------------------------------------------------------

@pytest.mark.parametrize("release", RELEASES, ids=lambda r: r.value)
@pytest.mark.parametrize("cpu_mode,efi", [("host-passthrough", False), ("host-model", False),
                                          ("host-model", True), ("custom", True)])
def test_every_call_reemits_what_the_struct_drops(h100, cpu_mode, efi, release):
    xml = _domain(h100, gpus_and_nics(h100), cpu_mode, efi)

    def rw(x):
        return rewrite_domain(x, h100, host_phys_bits=46).xml

    outs = hook_calls(xml, rw, calls=3, decimal_bus=True, release=release)
    # every release's re-parse drops <maxphysaddr> and <qemu:override>; every call writes them back
    reparsed = kubevirt_reparse(outs[0], release=release)
    assert _root(reparsed).find("cpu/maxphysaddr") is None and mmio_properties(_root(reparsed)) == {}
    for out in outs:
        root = _root(out)
        assert root.find("cpu/maxphysaddr") is not None
        assert mmio_properties(root) == mmio_properties(_root(outs[0]))
        assert len(root.findall("cpu/feature[@name='pdpe1gb']")) == (1 if efi and cpu_mode != "host-passthrough" else 0)
    assert rw(outs[-1]) == outs[-1]


def test_a_later_call_replaces_what_an_earlier_one_wrote(h100):
    seabios = rewrite_domain(_domain(h100, _gpus(h100), "host-model"), h100, host_phys_bits=46).xml
    root = _root(seabios)
    assert mmio_properties(root) and root.find("cpu/maxphysaddr").get("bits") == "42"
    # someone else's property on a hostdev stays; ours go when the firmware turns EFI
    ov = root.find("{http://libvirt.org/schemas/domain/qemu/1.0}override")
    dev = etree.SubElement(ov, "{http://libvirt.org/schemas/domain/qemu/1.0}device", alias="ua-gpu-gpu0")
    fe = etree.SubElement(dev, "{http://libvirt.org/schemas/domain/qemu/1.0}frontend")
    etree.SubElement(fe, "{http://libvirt.org/schemas/domain/qemu/1.0}property", name="x-custom", type="string", value="v")
    efi = rewrite_domain(with_efi(etree.tostring(root)), h100, host_phys_bits=46).xml
    props = mmio_properties(_root(efi))
    assert set(props) == {"ua-gpu-gpu0"} and set(props["ua-gpu-gpu0"]) == {"x-custom"}
    assert _root(efi).find("cpu/maxphysaddr").get("bits") == "44"  # 1 TiB of windows under OVMF


def test_mmio_off_and_p2p_off_write_nothing(h100):
    xml = _domain(h100, gpus_and_nics(h100))
    r = rewrite_domain(xml, h100, mmio=False, p2p_clique=False, host_phys_bits=46)
    root = _root(r.xml)
    assert root.find("cpu/maxphysaddr") is None and mmio_properties(root) == {}
    assert r.report.mmio is None and r.report.cliques is None


@pytest.mark.parametrize("cpu_mode,efi", [("host-passthrough", False), ("host-model", True), ("custom", True)])
def test_output_is_valid_against_libvirts_schema(h100, cpu_mode, efi):
    if not os.path.exists(SCHEMA):
        pytest.skip("libvirt schema missing (make setup)")
    r = rewrite_domain(_domain(h100, gpus_and_nics(h100), cpu_mode, efi), h100, host_phys_bits=46)
    rng = etree.RelaxNG(file=SCHEMA)
    doc = etree.fromstring(r.xml)
    assert rng.validate(doc), rng.error_log.last_error


@pytest.mark.skipif(shutil.which("virt-xml-validate") is None, reason="virt-xml-validate not installed")
def test_virt_xml_validate_accepts_the_settings(h100, tmp_path):
    r = rewrite_domain(_domain(h100, gpus_and_nics(h100), "host-model", efi=True), h100, host_phys_bits=46)
    f = tmp_path / "d.xml"
    f.write_bytes(r.xml)
    p = subprocess.run(["virt-xml-validate", str(f), "domain"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr


# -- SeaBIOS 1.16.3 and on-error ---------------------------------------------------------------

def _vmi(**annotations) -> bytes:
    """A VMI the pcitopo Plugin selects, with these hook options."""
    return json.dumps({"metadata": {"labels": {"pcitopo.kubevirt.io/plugin": "true"},
                                    "annotations": {f"pcitopo.kubevirt.io/{k.replace('_', '-')}": v
                                                    for k, v in annotations.items()}}}).encode()


def test_two_large_bars_below_one_switch_under_seabios_warn_subject_to_on_error(b200):
    seabios = _domain(b200, gpus_and_nics(b200))
    r = rewrite_domain(seabios, b200, host_phys_bits=46)
    assert [w.kind for w in r.report.warnings] == ["mmio-firmware"]
    with pytest.raises(FirmwareWarning, match="EFI"):
        handle_define_domain(seabios, None, b200)
    out = handle_define_domain(seabios, _vmi(on_error="passthrough"), b200)
    assert out.outcome == "rewritten" and out.xml == r.xml
    assert out.summary["warnings"] and out.summary["warnings"][0].startswith("mmio-firmware")
    # EFI: no warning; one GPU per switch (H100): no warning either
    assert not rewrite_domain(with_efi(seabios), b200, host_phys_bits=46).report.warnings


def _seabios_fixture(tmp_path) -> str:
    """fixtures/hgx-b200's domain without its EFI loader: KubeVirt's default SeaBIOS."""
    root = etree.fromstring((ROOT / "fixtures" / "hgx-b200" / "domain.xml").read_bytes())
    os_el = root.find("os")
    for loader in os_el.findall("loader"):
        os_el.remove(loader)
    os_el.attrib.pop("firmware", None)
    path = tmp_path / "domain.xml"
    path.write_bytes(etree.tostring(root))
    return str(path)


def test_the_firmware_warning_is_never_silent_in_xmlfix(tmp_path, capsys):
    """Under on-error: passthrough the SeaBIOS warning boots the rewritten domain; xmlfix says so
    on stderr, --check fails on it and --json carries it in the notes."""
    from pcitopo.cli.main import xmlfix_main

    dom = _seabios_fixture(tmp_path)
    vmi = tmp_path / "vmi.json"
    vmi.write_bytes(_vmi(on_error="passthrough", doctor="off"))
    base = ["--sysfs", str(ROOT / "fixtures" / "hgx-b200"), "--vmi", str(vmi), dom]
    assert xmlfix_main(base) == 0
    out = capsys.readouterr()
    assert out.out.startswith("<domain")
    assert [line[:40] for line in out.err.splitlines()] == ["xmlfix: warning: mmio-firmware: SeaBIOS "]
    # label only: judged on a release with kubevirt PR #18866, where the Plugin alone is the door
    assert xmlfix_main(["--check", "--kubevirt", "main+pr18866", *base]) == 1
    err = capsys.readouterr().err.splitlines()
    assert "xmlfix: check: mmio-firmware: SeaBIOS 1.16.3" in "\n".join(err)
    assert err[-1].startswith("xmlfix: check: failed: NCCL: 190/190 pairs as on the host") and err[-1].endswith("; mmio-firmware (above)")
    assert sum("SeaBIOS 1.16.3" in line for line in err) == 1  # said once
    assert xmlfix_main(["--json", *base]) == 0
    notes = json.loads(capsys.readouterr().out)["notes"]
    assert [n for n in notes if n.startswith("mmio-firmware: SeaBIOS 1.16.3")] != []


def test_check_problems_and_prediction_carry_the_firmware_warning(b200):
    from pcitopo.guest.verdict import check_reasons, prediction

    seabios = _domain(b200, gpus_and_nics(b200))
    r = rewrite_domain(seabios, b200, host_phys_bits=46)
    assert [p for p in check_reasons(r, b200) if p.text.startswith("mmio-firmware: ") and p.code == "firmware"] != []
    assert prediction(r, b200)["notes"][-1].startswith("mmio-firmware: ")
    efi = rewrite_domain(with_efi(seabios), b200, host_phys_bits=46)
    assert not [p for p in check_reasons(efi, b200) if "mmio-firmware" in p.text]


def test_mmio_off_annotation_reaches_the_rewrite(b200):
    out = handle_define_domain(_domain(b200, gpus_and_nics(b200)), _vmi(mmio="off"), b200)
    assert out.outcome == "rewritten" and _root(out.xml).find("cpu/maxphysaddr") is None


# -- P2P cliques --------------------------------------------------------------------------------

PCIE_HOST = """\
numa 0 cpus=0-7
rc 0000:10 numa=0
  rp 10:01.0 preset=intel-rp
    us 11:00.0 preset=pex-gen4
      ds 12:00.0
        ep 13:00.0 preset=l40s
      ds 12:01.0
        ep 14:00.0 preset=l40s
      ds 12:02.0
        ep 15:00.0 preset=cx7-eth
  rp 10:02.0 preset=intel-rp
    ep 20:00.0 preset=l40s
  rp 10:03.0 preset=intel-rp
    us 30:00.0 preset=pex-gen4
      ds 31:00.0
        ep 32:00.0 preset=l40s
      ds 31:01.0
        ep 33:00.0 preset=l40s
"""


def test_pcie_gpus_below_one_switch_share_a_clique(topo):
    host = topo(PCIE_HOST)
    r = rewrite_domain(kubevirt_domain(host, DomainSpec("p", tuple(gpus_and_nics(host)))), host, host_phys_bits=46)
    props = mmio_properties(_root(r.xml))
    cliques = {a: int(p[CLIQUE_PROPERTY].value) for a, p in props.items() if CLIQUE_PROPERTY in p}
    # GPUs 13/14 below switch 11, 32/33 below switch 30; 20 alone on its root port: none
    assert sorted(cliques.values()) == [0, 0, 1, 1]
    assert r.report.cliques.members == {0: tuple(map(_bdf, ("13", "14"))), 1: tuple(map(_bdf, ("32", "33")))}
    assert all(a.startswith("ua-gpu-") for a in cliques)
    # idempotent through the re-parse (which drops <qemu:override>)
    again = rewrite_domain(kubevirt_reparse(r.xml), host, host_phys_bits=46).xml
    assert canonical(again) == canonical(r.xml)
    off = rewrite_domain(r.xml, host, p2p_clique=False, host_phys_bits=46)
    assert mmio_properties(_root(off.xml)) == props  # off: leaves the property alone


def _bdf(bus: str):
    from pcitopo.model.tree import Bdf

    return Bdf(0, int(bus, 16), 0, 0)


def test_sxm_gpus_get_no_clique(h100, b200):
    for host in (h100, b200):
        r = rewrite_domain(_domain(host, gpus_and_nics(host)), host, host_phys_bits=46)
        assert r.report.cliques.members == {}
        assert not any(CLIQUE_PROPERTY in p for p in mmio_properties(_root(r.xml)).values())


def test_explain_shows_the_budget_per_root_port_and_firmware(h100):
    from pcitopo.views.explain import explain_text

    r = rewrite_domain(_domain(h100, gpus_and_nics(h100), "host-model", efi=True), h100, host_phys_bits=46)
    text = explain_text(r, h100)
    assert "pcihole64" not in text
    assert "64-bit MMIO budget (ovmf, CPU host-model" in text
    assert text.count("window 384 GiB (largest BAR 128 GiB") == 8
    assert "ovmf: total 3.00 TiB, needs 45 bits, window 4 TiB  <- this domain" in text
    # the rule used and the firmware version assumed, for both firmwares
    # an EFI domain: SeaBIOS is named, its model's count not shown
    assert "seabios (SeaBIOS 1.16.3, as KubeVirt 1.8-1.9's virt-launcher ships it): not this domain's firmware" in text
    assert "ovmf (edk2 20241117, as KubeVirt 1.8-1.9's virt-launcher ships it): rule: " in text
    assert "applied: <maxphysaddr mode='emulate' bits='45'/>; <feature policy='require' name='pdpe1gb'/>" in text
    off = explain_text(rewrite_domain(_domain(h100, gpus_and_nics(h100)), h100, mmio=False), h100)
    assert "64-bit MMIO: not managed (mmio: off)" in off


def test_seabios_needs_nothing_when_the_model_places_every_bar_without(h100):
    """One H100 and its NIC on a host-passthrough CPU: SeaBIOS 1.16.3 at the host's width puts the
    one port window at the top of the space, on a multiple of its size: nothing to write."""
    r = rewrite_domain((ROOT / "fixtures/hgx-h100/cases/one-pair/domain.xml").read_bytes(), h100, host_phys_bits=46)
    root = _root(r.xml)
    plan = r.report.mmio.seabios
    assert plan.complete and plan.bits is None and plan.reserves == {}
    assert root.find("cpu/maxphysaddr") is None and mmio_properties(root) == {}
    nics = [b for b in gpus_and_nics(h100) if h100.role(b).value == "nic"][:2]
    assert mmio_properties(_root(rewrite_domain(_domain(h100, nics), h100).xml)) == {}  # 32 MiB BARs: nothing


def test_no_setting_is_written_that_the_model_says_places_fewer(h100, b200):
    """Every fixture host and CPU mode under SeaBIOS: with the settings the model places at least
    as many BARs as without (tests/e2e/test_mmio_boot.py checks the same on the real firmware)."""
    for host in (h100, b200):
        for mode in ("host-passthrough", "host-model", "custom"):
            plan = rewrite_domain(_domain(host, gpus_and_nics(host), mode), host, host_phys_bits=46).report.mmio.seabios
            assert plan.placement.assigned >= plan.baseline.assigned, (host, mode)


def test_mmio_errors_live_in_topology_errors():
    """House rule: typed errors are defined in src/pcitopo/errors.py (mmio.py only raises them)."""
    from pcitopo import errors

    assert MmioError is errors.MmioError and MmioError.__module__ == "pcitopo.errors"
    assert FirmwareWarning is errors.FirmwareWarning and FirmwareWarning.__module__ == "pcitopo.errors"
    assert (MmioError.kind, FirmwareWarning.kind) == ("mmio", "mmio-firmware")
    assert issubclass(MmioError, errors.PcitopoError) and issubclass(FirmwareWarning, errors.PcitopoError)


# -- the host width comes from the host's source (a capture records it) ----------------------

def _cpuinfo(tmp_path, bits: int):
    p = tmp_path / f"cpuinfo-{bits}"
    p.write_text(f"processor\t: 0\naddress sizes\t: {bits} bits physical, 57 bits virtual\n")
    return str(p)


def _live_node(tmp_path, name: str = "hgx-h100"):
    """A sysfs tree that records no width, as a live /sys does (the committed fixtures record
    their node's): it stands for the machine reading it."""
    from pcitopo.synth import build_tree, parse_topo

    node = tmp_path / f"live-{name}"
    if node.is_dir():
        return node
    node.mkdir()
    text = (ROOT / "fixtures" / name / "host.topo").read_text()
    no_width = "".join(line for line in text.splitlines(keepends=True) if not line.startswith("cpu "))  # the fixture's `cpu` line
    build_tree(parse_topo(no_width, name)).write_tarball(node / "sysfs.tar.gz")
    return node


def test_capture_records_the_width_and_replays_it_elsewhere(tmp_path, monkeypatch):
    """An operator's dry run: `pcitopo capture` on the node (46 bits), `xmlfix --sysfs node.tar.gz`
    on a laptop whose CPU has 39 bits: the node's MMIO is judged with the node's width."""
    from pcitopo.host.capture import capture
    from pcitopo.host.sources import MemoryTree
    from pcitopo.model.cpuinfo import ADDRESS_SIZES_MEMBER

    node = tmp_path / "node.tar.gz"
    # a directory cannot say whose CPU it is: the operator gives the node's width (--phys-bits)
    assert capture(_live_node(tmp_path), node, phys_bits=46).host_bits == 46
    recorded = MemoryTree.from_tarball(node).read(ADDRESS_SIZES_MEMBER)
    assert recorded == b"address sizes\t: 46 bits physical\n"
    monkeypatch.setenv("PCITOPO_CPUINFO", _cpuinfo(tmp_path, 39))  # the laptop
    host = open_host(node)
    width = host.host_width()
    assert width.bits == 46 and "recorded in" in width.origin and ADDRESS_SIZES_MEMBER in width.origin
    assert host.host_width() is width  # read once per host
    out = handle_define_domain(_domain(host, _gpus(host)), None, host)  # the hook's one call
    assert out.outcome == "rewritten" and out.result.report.mmio.host_bits == 46
    # a tree that records no width (a live /sys) stands for this machine
    fixture = open_host(_live_node(tmp_path))
    assert fixture.host_width().bits == 39
    with pytest.raises(MmioError, match="host CPU has 39"):
        handle_define_domain(_domain(fixture, _gpus(fixture)), None, fixture)


def test_capture_without_the_record_is_unknown_not_this_machine(tmp_path, monkeypatch):
    from pcitopo.host.capture import capture

    old = tmp_path / "old.tar.gz"
    # this machine's CPU is readable, but a directory is not this machine's sysfs: not recorded
    monkeypatch.setenv("PCITOPO_CPUINFO", _cpuinfo(tmp_path, 46))
    summary = capture(_live_node(tmp_path), old)
    assert summary.host_bits is None and any("address width unknown" in s and "--phys-bits" in s for s in summary.skipped)
    monkeypatch.setenv("PCITOPO_CPUINFO", _cpuinfo(tmp_path, 39))
    host = open_host(old)
    assert host.host_width().bits is None and "not recorded" in host.host_width().origin
    out = handle_define_domain(_domain(host, _gpus(host)), None, host)  # not judged by 39 bits
    (line,) = out.result.report.mmio.unknown  # so xmlfix --check says unknown, not ok
    assert "address width is unknown" in line and "not recorded" in line


def test_explain_says_where_the_width_came_from(tmp_path, monkeypatch, capsys):
    from pcitopo.cli.xmlfix import xmlfix
    from pcitopo.host.capture import capture

    node = tmp_path / "node.tar.gz"
    capture(_live_node(tmp_path), node, phys_bits=46)
    monkeypatch.setenv("PCITOPO_CPUINFO", _cpuinfo(tmp_path, 39))
    dom = tmp_path / "domain.xml"
    dom.write_bytes(_domain(h100_host := open_host(node), _gpus(h100_host)))
    assert xmlfix(["--sysfs", str(node), "--explain", str(dom)]) == 0
    text = capsys.readouterr().out
    # folded at 100 columns
    assert "host width 46 bits, recorded in node.tar.gz sha256:" in " ".join(text.split())  # its name, not its path
    # a tree that records no width (a live /sys) stands for this machine; the error says so
    with pytest.raises(MmioError, match=r"host CPU has 39 \(\$PCITOPO_CPUINFO=.*cpuinfo-39 on this machine\)"):
        xmlfix(["--sysfs", str(_live_node(tmp_path)), "--explain", str(dom)])
