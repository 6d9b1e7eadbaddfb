"""Boot the golden rewritten domains and check the guest's own PCI tree.

For each golden case the rewrite of ``domain.xml`` must equal the committed ``expected.xml``;
that XML is booted (hostdevs swapped for stand-ins at the same guest addresses, everything the
planner wrote kept, see guestboot.make_bootable) on the session's private libvirtd (define +
start, so libvirt's own checks run), the guest's printout becomes a sysfs-shaped tree, and
``golden_check.check_booted`` judges it with the project's own reader and classifier against
the report's promises: every pair's guest class (NCCL and NVML) and every device's guest
``numa_node``. A failure prints the booted tree next to the predicted one.

``test_broken_golden_is_caught`` proves the tier can fail: a golden output broken on purpose
(a ``busNr`` one too low, an expander bus without ``<node>``, no ``<acpi/>``; schema validation
and ``virsh define`` accept all three) boots, and the same checker must report it.

Per-boot times are printed (``-s``) and summed up at the end of the module.
"""

from __future__ import annotations

import functools
import os
import time

import pytest
from lxml import etree

from pcitopo.guest.rewrite import RewriteResult, rewrite_domain
from pcitopo.host.sysfs import open_host
from pcitopo.model.tree import Topology
from testkit.e2e.golden_check import check_booted
from testkit.e2e.guestboot import GuestResult, boot
from testkit.e2e.nccl_check import check_nccl
from testkit.e2e.paths import REPO_ROOT
from testkit.e2e.terminal import show_past_capture

# seconds per boot; a loaded machine (many boots at once) may need more: PCITOPO_E2E_BOOT_TIMEOUT
BOOT_TIMEOUT = float(os.environ.get("PCITOPO_E2E_BOOT_TIMEOUT") or 240.0)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(BOOT_TIMEOUT + 60)]

FIXTURES = REPO_ROOT / "fixtures"

# The golden outputs booted: both HGX hosts with all devices, the hgx-h100 subsets of one NUMA
# node and without guest NUMA, dgx-h100 with all devices, hgx-b200 without guest NUMA (its
# Broadcom collapse and NUMA-less expander buses together), and hgx-b300 with all devices (each
# GPU two levels inside its ConnectX-8's switch: the guest must keep PXB, nothing flattened).
BOOT_CASES = (
    "hgx-b200",
    "hgx-h100",
    "hgx-h100/cases/one-node",
    "hgx-h100/cases/no-numa",
    "dgx-h100",
    "hgx-b200/cases/no-numa",
)
# Booted by its own test below, which also checks what that host is there for.
B300 = "hgx-b300"
# The three goldens whose booted guests must price NCCL's paths as the host does.
NCCL_CASES = ("hgx-b200", "hgx-h100", "dgx-h100")
# Broken on purpose; the smallest case keeps these boots short.
BREAK_BASE = "hgx-h100/cases/one-node"


# (label, devices, timings) of every boot of this module, summed up at its end.
_BOOTS: list[tuple[str, int, dict[str, float]]] = []
# the "tested with" line of the daemon(s) they booted on
_STACKS: list[str] = []
# the NCCL bandwidth line of each NCCL_CASES boot
_NCCL: list[str] = []


@functools.cache
def golden(case: str) -> tuple[Topology, RewriteResult]:
    host = open_host(FIXTURES / case.split("/")[0])
    return host, rewrite_domain((FIXTURES / case / "domain.xml").read_bytes(), host)


def expected_xml(case: str) -> bytes:
    """The committed golden output; it must be exactly what the rewrite gives today, or the
    report we check against would not describe it."""
    xml = (FIXTURES / case / "expected.xml").read_bytes()
    assert golden(case)[1].xml == xml, f"fixtures/{case}/expected.xml is stale: run `make golden`"
    return xml


def _boot(libvirtd, label: str, xml: bytes) -> GuestResult:
    # a guest silent past 40% of the timeout's QEMU CPU (15-25 s on a quiet machine) is hung
    r = boot(xml, libvirtd=libvirtd, timeout=BOOT_TIMEOUT, silent_after=0.4 * BOOT_TIMEOUT)
    t = r.timings
    _BOOTS.append((label, len(r.mapping), dict(t)))
    if (line := f"{libvirtd.versions().line()}; guest firmware {r.firmware}") not in _STACKS:
        _STACKS.append(line)
    print(
        f"\n[e2e] {label}: {len(r.mapping)} stand-ins, define {t['define']:.2f}s, "
        f"start→end marker {t['run']:.2f}s, teardown {t['teardown']:.2f}s, total {t['total']:.2f}s"
    )
    return r


@pytest.fixture(scope="module", autouse=True)
def boot_time_summary(request):
    start = time.monotonic()
    yield
    if not _BOOTS:
        return
    lines = [f"[e2e] golden boots ({len(_BOOTS)}), seconds: define / start→end marker / total"
             " / QEMU CPU"]
    for label, n, t in _BOOTS:
        lines.append(f"  {label:<50} {n:>3} devs  {t['define']:5.2f} {t['run']:6.2f} {t['total']:6.2f}"
                     f" {t.get('qemu_cpu', float('nan')):6.2f}")
    total = sum(t["total"] for _, _, t in _BOOTS)
    lines.append(f"  sum of boots {total:.1f}s; module wall time {time.monotonic() - start:.1f}s")
    lines += [f"  on {line}" for line in _STACKS]
    lines += [f"  {line}" for line in _NCCL]
    show_past_capture(request.config, lines)


# -- the promise itself (no boot) ------------------------------------------------------------

@pytest.mark.parametrize("case", BOOT_CASES + (B300,))
def test_promise_is_the_host_class(case):
    """What the boots check against: every device placed, and every promised guest class is
    the host's, except the documented differences: NVML PXB→PIX where a Broadcom two-level
    complex becomes one virtual switch (NCCL says PIX on both), and, without guest NUMA cells,
    cross-node pairs (SYS) reading PHB (NCCL) / NODE (NVML)."""
    expected_xml(case)
    _, res = golden(case)
    report = res.report
    assert report.placed and all(d.guest is not None for d in report.placed)
    no_cells = not report.numa_map
    bad = []
    for p in report.pairs:
        h, g = (p.host.nccl.value, p.host.nvml.value), (p.guest.nccl.value, p.guest.nvml.value)
        if h == g:
            continue
        if h == ("PIX", "PXB") and g == ("PIX", "PIX"):
            continue  # Broadcom collapse
        if no_cells and h == ("SYS", "SYS") and g == ("PHB", "NODE"):
            continue
        bad.append(f"{p.a}-{p.b}: host {h}, promised guest {g} ({p.why})")
    assert not bad, "\n".join(bad)
    if not no_cells:
        assert report.fidelity_lost == []


# -- boots -----------------------------------------------------------------------------------

@pytest.mark.parametrize("case", BOOT_CASES)
def test_golden_boots_as_promised(case, libvirtd, tmp_path):
    host, res = golden(case)
    booted = _boot(libvirtd, case, expected_xml(case))
    check = check_booted(case, host, res, booted, tmp_path / "sysfs")
    check.assert_ok()
    assert check.devices_checked == len(res.report.placed)
    assert check.pairs_checked == len(res.report.pairs)
    if case in NCCL_CASES:  # NCCL's bandwidth model in the booted guest (nccl_check.py)
        nccl = check_nccl(FIXTURES / case.split("/")[0], FIXTURES / case / "domain.xml", host, booted, tmp_path / "nccl")
        _NCCL.append(nccl.line(case))
        print("\n" + nccl.line(case))
        assert not nccl.problems, "\n".join(nccl.problems)
        assert nccl.ports_checked and nccl.pairs and nccl.equal_with_file == nccl.pairs


def test_b300_guest_keeps_pxb_for_every_gpu_and_its_nic(libvirtd, tmp_path):
    """On HGX B300 each GPU sits two switch levels inside its ConnectX-8's PCIe switch,
    PXB to its NIC on the host. The booted guest must be as promised (every pair, every NUMA
    node), and in it every GPU is PXB to that NIC in NCCL's and nvidia-smi's view, through two
    switch nodes: the mirror flattened nothing (QEMU's switch is no Broadcom part)."""
    from pcitopo.paths.classify import Nccl, Nvml, classify, nccl_path

    host, res = golden(B300)
    booted = _boot(libvirtd, B300, expected_xml(B300))
    check = check_booted(B300, host, res, booted, tmp_path / "sysfs")
    check.assert_ok()
    guest = check.guest
    placed = {d.host: d.role for d in res.report.placed}
    gpus = sorted(b for b, r in placed.items() if r == "gpu")
    nics = sorted(b for b, r in placed.items() if r == "nic")
    assert len(gpus) == len(nics) == 8
    for g in gpus:
        host_pxb = [n for n in nics if classify(host, g, n).nccl == Nccl.PXB]
        assert len(host_pxb) == 1, f"{g}: host PXB NICs {host_pxb}"
        (n,) = host_pxb
        gg, gn = check.host_to_guest[g], check.host_to_guest[n]
        got = classify(guest, gg, gn)
        assert (got.nccl, got.nvml) == (Nccl.PXB, Nvml.PXB), f"GPU {g}-NIC {n}: guest {got}"
        assert len(nccl_path(guest, guest.function(gg)).switches) == 2  # both switch levels kept
        others = [classify(guest, gg, check.host_to_guest[o]).nccl for o in nics if o != n]
        assert Nccl.PXB not in others and Nccl.PIX not in others


def _pxbs(root: etree._Element) -> list[etree._Element]:
    return sorted(
        root.xpath("devices/controller[@type='pci'][@model='pcie-expander-bus']"),
        key=lambda c: int(c.find("target").get("busNr")),
    )


def busnr_one_too_low(xml: bytes) -> tuple[bytes, str, int]:
    """The second expander bus (by busNr) one bus lower: it then overlaps the last bus of the
    first one's subtree (the planner packs them tightly)."""
    root = etree.fromstring(xml)
    pxb = _pxbs(root)[1]
    t = pxb.find("target")
    bus = int(t.get("busNr"))
    t.set("busNr", str(bus - 1))
    return etree.tostring(root), f"{pxb.find('alias').get('name')} busNr {bus} -> {bus - 1}", bus


def pxb_without_node(xml: bytes) -> tuple[bytes, str, int]:
    """The first expander bus loses its <node>: its devices become NUMA-less in the guest."""
    root = etree.fromstring(xml)
    pxb = _pxbs(root)[0]
    t = pxb.find("target")
    t.remove(t.find("node"))
    return etree.tostring(root), f"{pxb.find('alias').get('name')} without <node>", int(t.get("busNr"))


def without_acpi(xml: bytes) -> tuple[bytes, str, int]:
    """No <features><acpi/>: every numa_node in the guest is -1."""
    root = etree.fromstring(xml)
    feats = root.find("features")
    feats.remove(feats.find("acpi"))
    return etree.tostring(root), "no <features><acpi/>", -1


BREAKS = {
    "busnr-one-too-low": busnr_one_too_low,
    "pxb-without-node": pxb_without_node,
    "no-acpi": without_acpi,
}


@pytest.mark.parametrize("breakage", list(BREAKS))
def test_broken_golden_is_caught(breakage, libvirtd, tmp_path):
    host, res = golden(BREAK_BASE)
    broken, what, bus = BREAKS[breakage](expected_xml(BREAK_BASE))
    print(f"\n[e2e] breaking {BREAK_BASE} on purpose: {what}")
    booted = _boot(libvirtd, f"{BREAK_BASE} + {breakage}", broken)
    check = check_booted(BREAK_BASE, host, res, booted, tmp_path / "sysfs")

    # the same check the golden boots run must fail ...
    with pytest.raises(AssertionError) as failed:
        check.assert_ok()
    print(f"\n[e2e] {breakage}: the checker reports, as CI would show it:\n{failed.value}")

    # ... and for the right reason
    report = res.report
    numa_wrong = {h for p in check.problems if p.kind == "numa" for h in p.hosts}
    if breakage == "busnr-one-too-low":
        # a hierarchy lost its bus: stand-ins vanish or sit below the wrong root
        assert check.kinds() & {"missing", "overlap", "bdf"}, check.render()
    elif breakage == "pxb-without-node":
        # exactly the devices of that expander bus lose their NUMA node, and their pairs
        # with the rest of the cell turn SYS
        pxb_devs = {d.host for d in report.placed
                    if res.guest.topology.function(d.guest).root_complex == f"pci0000:{bus:02x}"}
        assert pxb_devs and numa_wrong == pxb_devs, check.render()
        assert {"nccl", "nvml"} <= check.kinds(), check.render()
    else:
        # every device loses its NUMA node
        assert numa_wrong == {d.host for d in report.placed}, check.render()
